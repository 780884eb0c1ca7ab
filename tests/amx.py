"""Tests that need the ``amx`` kernel: a CPU with AMX. Their skip's reason starts with
:data:`AMX_SKIP`, which CI accepts (``tests/conftest.py``'s ``ALLOWED_CI_SKIPS``): a runner
without AMX has nothing to run the kernel on."""

from __future__ import annotations

import pytest

from asic_backend.sim import amx_gemm
from asic_backend.sim.host import cpu_flags
from tests.skip_reasons import AMX_SKIP

#: The reason's prefix is the accepted one only on a CPU without AMX: on one with it, a build that
#: lost the kernel, or a self-check that failed, is a skip CI refuses.
_PREFIX = "the amx kernel is missing on a CPU with AMX" if "amx_int8" in cpu_flags() else AMX_SKIP

#: Skips a test where this process has no ``amx`` kernel, saying why.
needs_amx = pytest.mark.skipif(
    not amx_gemm.available(), reason=f"{_PREFIX}: {amx_gemm.unavailable_reason()}"
)
