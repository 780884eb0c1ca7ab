"""``pytest --asic-backend``: the fixtures, the ``asic`` device, host fallbacks, the report."""

from __future__ import annotations

import json

import pytest

from tests.plugin.conftest import Models

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")

HOST_FALLBACK_MODEL = """
import torch
from torch import nn


class MixedPrecision(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4).double()

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return self.head(h.double())  # LINE:host
"""


def test_nobreak_compile_runs_linears_on_the_dut(models: Models) -> None:
    models.pytester.makepyfile(
        test_dut="""
        import pytest, torch
        import models as M

        @pytest.mark.no_graph_break
        def test_mlp(nobreak_compile, nobreak_report, asic):
            with torch.no_grad():
                nobreak_compile(M.MLP())(torch.randn(4, 8))
            assert asic.snapshot().dut_ops == 2
            assert asic.snapshot().host_fallbacks == 0
            assert nobreak_report.asic.dut_ops == 2
            assert asic.config.name == "gemmini"
        """
    )
    result = models.pytester.runpytest(
        *QUIET, "--asic-backend", "--asic-device", "gemmini", "--nobreak-json", "r.json"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["nobreak: backend=asic, device=gemmini (16x16 ws @ * GHz), watching marked tests"]
    )
    report = json.loads((models.pytester.path / "r.json").read_text())
    assert report["backend"] == "asic"
    entry = report["tests"]["test_dut.py::test_mlp"]
    assert entry["asic"]["dut_ops"] == 2
    assert entry["asic"]["host_fallbacks"] == 0
    assert entry["asic"]["macs"] == 4 * 8 * 16 + 4 * 16 * 4
    assert entry["asic"]["cycles"] > 0


def test_asic_counters_are_reset_per_test(models: Models) -> None:
    models.pytester.makepyfile(
        test_reset="""
        import pytest, torch
        import models as M

        @pytest.mark.parametrize("run", [1, 2])
        def test_each_starts_at_zero(nobreak_compile, asic, run):
            assert asic.snapshot().dut_ops == 0
            with torch.no_grad():
                nobreak_compile(M.MLP())(torch.randn(4, 8))
            assert asic.snapshot().dut_ops == 2
        """
    )
    models.pytester.runpytest(*QUIET, "--asic-backend").assert_outcomes(passed=2)


def test_host_fallback_fails_a_marked_test_unless_allowed(models: Models) -> None:
    models.pytester.makepyfile(mixed=HOST_FALLBACK_MODEL)
    models.pytester.makepyfile(
        test_fallback="""
        import pytest, torch
        import mixed

        def run(nobreak_compile):
            with torch.no_grad():
                nobreak_compile(mixed.MixedPrecision())(torch.randn(4, 8))

        @pytest.mark.no_graph_break
        def test_strict(nobreak_compile):
            run(nobreak_compile)

        @pytest.mark.no_graph_break(allow_host_fallback=True)
        def test_allowed(nobreak_compile, asic):
            run(nobreak_compile)
            assert (asic.snapshot().dut_ops, asic.snapshot().host_fallbacks) == (1, 1)
        """
    )
    result = models.pytester.runpytest(*QUIET, "--asic-backend")
    result.assert_outcomes(passed=1, failed=1)
    line = next(
        n
        for n, text in enumerate((models.pytester.path / "mixed.py").read_text().splitlines(), 1)
        if text.endswith("# LINE:host")
    )
    result.stdout.fnmatch_lines(
        [
            "*1 problem (graphs=1, graph_breaks=0, eager_frames=0, recompiles=0, dut_ops=1, "
            "host_fallbacks=1, *",
            "1. host fallback (linear ran on the host, not the DUT): Host fallback: linear",
            f"*at mixed.py:{line}  >  return self.head(h.double())*",
            "*why: torch.float64 operands: the DUT path quantizes float32/bfloat16/float16 only*",
            "To accept host fallbacks: @pytest.mark.no_graph_break(allow_host_fallback=True).",
        ]
    )


def test_seed_network_passes_under_the_asic_backend(models: Models) -> None:
    """The user's story end to end: the naive backend fails with gb0219 named; the same network
    under the ASIC backend compiles whole, runs on the DUT, and stays close to fp32."""
    models.pytester.makepyfile(
        test_seed="""
        import pytest, torch
        import models as M

        @pytest.mark.no_graph_break
        def test_naive():
            m = torch.compile(M.Seed(), backend=M.naive_backend)
            m(torch.randn(2, 8))

        @pytest.mark.no_graph_break
        def test_asic(nobreak_compile, asic):
            torch.manual_seed(0)
            net, x = M.Seed(), torch.randn(16, 8)
            with torch.no_grad():
                ref = net(x)
                out = nobreak_compile(net)(x)
            assert asic.snapshot().dut_ops == 1
            assert not torch.equal(out, ref)  # int8 on the DUT, not the fp32 host path
            torch.testing.assert_close(out, ref, rtol=0.05, atol=0.05)
        """
    )
    result = models.pytester.runpytest(*QUIET, "--asic-backend")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_naive*", "*GB0219: Backend compiler exception*"])


def test_bad_device_is_a_usage_error(models: Models) -> None:
    models.pytester.makepyfile(test_x="def test_x(): pass")
    result = models.pytester.runpytest(*QUIET, "--asic-backend", "--asic-device", "tpu_v9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --asic-device: ASIC config 'tpu_v9' is neither a preset (default, *) nor a*"]
    )
