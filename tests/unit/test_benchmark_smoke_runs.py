"""A plain (benchmark-disabled) run of the benchmarks, as CI makes one, on a host without an int8
dot-product unit: there ``torch._int_mm`` has no fast kernel (0.6 to 2.6 GMAC/s measured on
AVX2-only hosts, against tens with VNNI), so every GEMM that runs on it must be a smoke-sized
one (:func:`benchmarks.conftest.smoke_rows`). The DUT's own GEMMs take the ``int16`` kernel
there (``float32`` without it); TorchAO's peer and the raw-kernel rows call ``_int_mm`` whatever
the host."""

from __future__ import annotations

import json

import pytest

from benchmarks.conftest import TIMED_ONLY
from tests.conftest import ROOT

# The inner run's host: no int8 unit, as the benchmarks ask it (asic_backend.sim.host_gemm), and
# every aten::_int_mm of the run recorded as [M, K, N]; the product itself computed exactly in
# float64, so the run's checks still hold.
_NO_INT8_UNIT = """
import json
import warnings
from pathlib import Path

import torch

from asic_backend.sim import host_gemm

host_gemm.has_int8_unit = lambda: False
GEMMS = []


def _int_mm(a, b):
    GEMMS.append([*a.shape, b.shape[1]])
    return (a.double() @ b.double()).int()


def _int_mm_out(a, b, *, out):
    return out.resize_(a.shape[0], b.shape[1]).copy_(_int_mm(a, b))


_LIB = torch.library.Library("aten", "IMPL")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # overriding a registered kernel, as meant
    _LIB.impl("_int_mm", _int_mm, "CPU")
    _LIB.impl("_int_mm.out", _int_mm_out, "CPU")


def pytest_sessionfinish(session):
    Path("gemms.json").write_text(json.dumps(GEMMS))
"""


def test_a_plain_run_without_an_int8_unit_gives_int_mm_smoke_rows_only(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(no_int8_unit=_NO_INT8_UNIT)
    result = pytester.runpytest_subprocess(
        str(ROOT / "benchmarks" / "test_backend.py"),
        "-k",
        "raw_int_mm or torchao_inductor",
        "--benchmark-disable",
        "-p",
        "no_int8_unit",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=2)
    gemms = json.loads((pytester.path / "gemms.json").read_text())
    # The raw pair, and TorchAO's two layers in each of the peer's two calls: all on 8 rows of
    # 256. test_ratios takes the peer's rows from the same helper (and costs 7 s more to run).
    assert len(gemms) >= 2 + 2 * 2
    assert {m for m, _, _ in gemms} == {8}


def test_a_plain_run_leaves_out_the_timed_only_rows(pytester: pytest.Pytester) -> None:
    """Each Inductor-hosted layer is a compile (1.6 s of CPU): a plain run, as CI makes one,
    compiles the few that differ in more than their shapes; a timed run all of them."""
    from benchmarks.test_int8_path import LAYER_PARAMS, PLAIN_INDUCTOR, test_dut_inductor

    (params,) = [m.args[1] for m in test_dut_inductor.pytestmark if m.name == "parametrize"]
    timed_only = {p.id for p in params if any(m.name == TIMED_ONLY for m in p.marks)}
    everything = {p.id for p in LAYER_PARAMS}
    assert {p.id for p in params} == everything
    assert timed_only == everything - set(PLAIN_INDUCTOR)
    assert set(PLAIN_INDUCTOR) < everything

    result = pytester.runpytest_subprocess(
        str(ROOT / "benchmarks" / "test_int8_path.py"), "--co", "-q", "-p", "no:cacheprovider",
        "-k", "dut_inductor", "--benchmark-disable",
    )  # fmt: skip
    collected = {
        line.split("[", 1)[1].rstrip("]")
        for line in result.outlines
        if line.startswith("benchmarks/test_int8_path.py::test_dut_inductor[")
    }
    assert collected == set(PLAIN_INDUCTOR)
    assert collected.isdisjoint(timed_only)
