"""Tests that need the ``amx`` kernel: a CPU with AMX. Their skip's reason starts with
:data:`AMX_SKIP`, which CI accepts (``tests/conftest.py``'s ``ALLOWED_CI_SKIPS``): a runner
without AMX has nothing to run the kernel on."""

from __future__ import annotations

import pytest

from asic_backend.sim import amx_gemm
from tests.skip_reasons import AMX_SKIP

#: Skips a test where this process has no ``amx`` kernel, saying why.
needs_amx = pytest.mark.skipif(
    not amx_gemm.available(), reason=f"{AMX_SKIP}: {amx_gemm.unavailable_reason()}"
)
