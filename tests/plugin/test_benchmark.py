"""``asic_benchmark``, ``--asic-roofline`` and the cycles gate, as a user's pytest run meets them.

Each case runs a real inner pytest session (pytester, in-process unless xdist is needed) over a
tiny linear compiled with ``--asic-backend``. The simulated figures are checked for equality with
the cycle model (``asic_backend.sim.cycles.gemm_cost``), never for timing.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from asic_backend import SIM_VERSION
from asic_backend.sim.config import AsicConfig
from asic_backend.sim.cycles import ACC_BYTES, GemmCost, gemm_cost
from pytest_nobreak.benchmark import INSTALL_HINT
from pytest_nobreak.report.versions import torch_version

pytest.importorskip("pytest_benchmark")

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
M, K, N = 4, 128, 64  # gemmini (16x16) needs more cycles for it than default (128x128)
SVG = "{http://www.w3.org/2000/svg}"

# `calls.json` tells the outer test how often the target ran and what extra_info held, in every
# mode, including --benchmark-disable where pytest-benchmark saves nothing.
BENCH = f"""
import json, pathlib
import torch

def test_linear(asic_benchmark, nobreak_compile, asic):
    model = nobreak_compile(torch.nn.Linear({K}, {N}))
    calls = []

    def target(x):
        calls.append(1)
        return model(x)

    y = asic_benchmark(target, torch.randn({M}, {K}), rounds=3)
    assert y.shape == ({M}, {N})
    pathlib.Path("calls.json").write_text(
        json.dumps({{
            "calls": len(calls),
            "extra_info": asic_benchmark.extra_info,
            "device_dut_ops": asic.snapshot().dut_ops,
        }})
    )


def test_plain():
    pass
"""


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner runs choose their own settings: under an outer ``-n 2`` pytest-benchmark would
    see $PYTEST_XDIST_WORKER and disable itself (tests/conftest.py already clears $CI)."""
    for name in (
        "PYTEST_XDIST_WORKER",
        "PYTEST_XDIST_WORKER_COUNT",
        "PYTEST_XDIST_TESTRUNUID",
        "PYTEST_ADDOPTS",
        "ASIC_BACKEND_CONFIG",
    ):
        monkeypatch.delenv(name, raising=False)


def cost(preset: str, m: int = M, k: int = K, n: int = N) -> GemmCost:
    return gemm_cost(AsicConfig.preset(preset), m, k, n, ACC_BYTES)


@pytest.fixture
def bench(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_bench=BENCH)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*QUIET, "--asic-backend", "--asic-device", "gemmini", *args)


def calls_file(pytester: pytest.Pytester) -> dict[str, object]:
    data: dict[str, object] = json.loads((pytester.path / "calls.json").read_text())
    return data


def test_disabled_runs_the_target_once_and_records_one_call(bench: pytest.Pytester) -> None:
    result = run(bench, "--benchmark-disable", "--nobreak-json", "r.json")
    result.assert_outcomes(passed=2)
    data = calls_file(bench)
    assert data["calls"] == 1
    assert data["device_dut_ops"] == 1
    gemm = cost("gemmini")
    assert data["extra_info"] == {
        "asic_device": "gemmini",
        "asic_preset": "gemmini",
        "asic_dut_ops": 1,
        "asic_host_fallbacks": 0,
        "asic_macs": M * K * N,
        "asic_host_macs": 0,
        "asic_cycles": gemm.cycles,
        "asic_bytes_moved": gemm.bytes_moved,
        "asic_syncs": 0,
        "asic_utilization": gemm.utilization,
        "asic_arithmetic_intensity": gemm.arithmetic_intensity,
        "asic_target_calls": 1,
        "asic_bound": gemm.bound,
        "asic_roofline_time_s": gemm.roofline_time_s,
        "asic_attained_ops_per_s": gemm.attained_ops_per_s,
        "asic_mapping_efficiency": gemm.mapping_efficiency,
        "asic_compute_utilization": gemm.compute_utilization,
    }
    # The test is watched (asic_benchmark is a watch fixture): its report has the DUT's counters.
    entry = json.loads((bench.path / "r.json").read_text())["tests"]["test_bench.py::test_linear"]
    assert entry["asic"] == {
        "dut_ops": 1,
        "host_fallbacks": 0,
        "macs": M * K * N,
        "host_macs": 0,
        "cycles": gemm.cycles,
        "syncs": 0,
    }


def test_timed_run_measures_one_extra_call(bench: pytest.Pytester) -> None:
    """1 warm-up + 3 rounds are timed, then one more call is measured: extra_info and the
    test's report (what the baseline sees) hold one call's figures, as a disabled run's do; the
    device itself counted all five calls."""
    result = run(bench, "--benchmark-json", "b.json", "--nobreak-json", "r.json")
    result.assert_outcomes(passed=2)
    data = calls_file(bench)
    assert data["calls"] == 5
    assert data["device_dut_ops"] == 5
    document = json.loads((bench.path / "b.json").read_text())
    (saved,) = document["benchmarks"]
    assert saved["stats"]["rounds"] == 3
    gemm = cost("gemmini")
    info = saved["extra_info"]
    assert info["asic_cycles"] == gemm.cycles
    assert info["asic_dut_ops"] == 1
    assert info["asic_target_calls"] == 5
    assert document["machine_info"]["asic_sim"] == {
        "version": SIM_VERSION,
        "torch": torch_version(),
    }
    report = json.loads((bench.path / "r.json").read_text())
    assert report["tests"]["test_bench.py::test_linear"]["asic"] == {
        "dut_ops": 1,
        "host_fallbacks": 0,
        "macs": M * K * N,
        "host_macs": 0,
        "cycles": gemm.cycles,
        "syncs": 0,
    }


def test_benchmark_skip_and_only_see_asic_benchmark_as_a_benchmark(
    bench: pytest.Pytester,
) -> None:
    result = run(bench, "--benchmark-skip", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * Skipping benchmark (--benchmark-skip active)."])
    assert not (bench.path / "calls.json").exists()

    result = run(bench, "--benchmark-only", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * Skipping non-benchmark (--benchmark-only active)."])
    assert calls_file(bench)["calls"] == 5


def test_without_pytest_benchmark_only_its_users_error(bench: pytest.Pytester) -> None:
    result = run(bench, "-p", "no:benchmark", "--asic-roofline", "r.svg")
    result.assert_outcomes(passed=1, errors=1)
    text = result.stdout.str()
    assert f"install it with {INSTALL_HINT}" in text
    assert "fixture 'benchmark' not found" not in text
    assert "INTERNALERROR" not in text


def test_a_target_off_the_dut_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_host="""
        import torch

        def test_eager(asic_benchmark):
            asic_benchmark(torch.nn.Linear(16, 8), torch.randn(4, 16), rounds=1)
        """
    )
    result = run(pytester, "--benchmark-disable")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*asic_benchmark: Linear ran no GEMM on the simulated ASIC*"])


def test_host_macs_are_those_of_one_call(pytester: pytest.Pytester) -> None:
    """A target with a host fallback: extra_info and the test's report hold the host MACs of
    the one measured call, not of the five calls that ran."""
    pytester.makepyfile(
        test_mixed=f"""
        import torch
        from torch import nn

        class Mixed(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear({K}, {N})
                self.head = nn.Linear({N}, 8).double()  # float64: on the host

            def forward(self, x):
                return self.head(self.fc(x).double())

        def test_mixed(asic_benchmark, nobreak_compile):
            asic_benchmark(nobreak_compile(Mixed()), torch.randn({M}, {K}), rounds=3)
            info = asic_benchmark.extra_info
            assert info["asic_target_calls"] == 5
            assert (info["asic_dut_ops"], info["asic_macs"]) == (1, {M * K * N})
            assert (info["asic_host_fallbacks"], info["asic_host_macs"]) == (1, {M * N * 8})
        """
    )
    result = run(pytester, "--nobreak-json", "r.json")
    result.assert_outcomes(passed=1)
    entry = json.loads((pytester.path / "r.json").read_text())["tests"]["test_mixed.py::test_mixed"]
    assert entry["asic"]["host_fallbacks"] == 1
    assert entry["asic"]["host_macs"] == M * N * 8


ROOFLINE_TESTS = """
import torch
from asic_backend import make_backend
from asic_backend.sim.device import get_device, run_mm_i32


def test_square(asic_benchmark):
    model = torch.compile(torch.nn.Linear(32, 32), backend=make_backend(config="default"))
    asic_benchmark.label = "square"
    asic_benchmark(model, torch.randn(8, 32), rounds=1)


def test_two_layers(asic_benchmark):
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Linear(64, 16))
    asic_benchmark(torch.compile(model, backend=make_backend(config="gemmini")), torch.randn(2, 16))


def test_raw_gemm(benchmark):
    # A plain benchmark that runs a DUT GEMM counts too (twice here: one point).
    a = torch.ones(4, 8, dtype=torch.int8)
    benchmark(run_mm_i32, a, a, device=get_device("gemmini"))


def test_not_a_benchmark():
    run_mm_i32(torch.ones(64, 64, dtype=torch.int8), torch.ones(64, 64, dtype=torch.int8),
               device=get_device("default"))
"""


def roofline(path: Path) -> tuple[dict[str, ET.Element], list[ET.Element]]:
    root = ET.parse(path).getroot()
    roofs = {g.get("data-device", ""): g for g in root.iter(f"{SVG}g") if g.get("class") == "roof"}
    points = [c for c in root.iter(f"{SVG}circle") if c.get("class") == "point"]
    return roofs, points


@pytest.mark.parametrize("mode", ["--benchmark-disable", "--benchmark-min-rounds=1"])
def test_roofline_has_the_roofs_and_one_point_per_layer(
    pytester: pytest.Pytester, mode: str
) -> None:
    pytester.makepyfile(test_roof=ROOFLINE_TESTS)
    result = pytester.runpytest(*QUIET, mode, "--asic-roofline", "out/roof.svg")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        ["nobreak: roofline of 4 point(s) on 2 device(s) written to out/roof.svg"]
    )
    roofs, points = roofline(pytester.path / "out" / "roof.svg")
    assert set(roofs) == {"default", "gemmini"}
    for name, roof in roofs.items():
        config = AsicConfig.preset(name)
        assert float(roof.get("data-peak", 0)) == pytest.approx(config.peak_ops_per_s)
        assert float(roof.get("data-ridge", 0)) == pytest.approx(config.ridge_ops_per_byte)
        assert roof.find(f"{SVG}polyline[@class='roofline']") is not None
    layers = sorted((p.get("data-device"), p.get("data-layer")) for p in points)
    assert layers == [
        ("default", "square 8×32×32"),
        ("gemmini", "test_raw_gemm 4×8×4"),
        ("gemmini", "test_two_layers 2×16×64"),
        ("gemmini", "test_two_layers 2×64×16"),
    ]
    square = next(p for p in points if p.get("data-device") == "default")
    gemm = cost("default", 8, 32, 32)
    assert square.get("data-bound") == gemm.bound
    # The tooltip gives the utilization next to SCALE-Sim's two figures, as percentages.
    title = "".join(square.itertext())
    assert title.endswith(
        f"; utilization {gemm.utilization * 100:.3g}%, mapping efficiency "
        f"{gemm.mapping_efficiency * 100:.3g}%, compute utilization "
        f"{gemm.compute_utilization * 100:.3g}%"
    ), title


def test_roofline_from_the_ini_file_under_xdist(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_roof=ROOFLINE_TESTS)
    pytester.makeini("[pytest]\nnobreak_asic_roofline = charts/roof.svg\n")
    # hypothesis and anyio only cost import time in each of the three processes.
    result = pytester.runpytest_subprocess(
        *QUIET, "-n", "2", "-p", "no:hypothesispytest", "-p", "no:anyio"
    )
    result.assert_outcomes(passed=4)
    _, points = roofline(pytester.path / "charts" / "roof.svg")
    assert len(points) == 4  # shipped from both workers on the call reports


def test_roofline_without_benchmarks_draws_the_session_device(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_none="def test_nothing():\n    pass\n")
    result = pytester.runpytest(*QUIET, "--asic-device", "tpu_v1", "--asic-roofline", "r.svg")
    result.assert_outcomes(passed=1)
    roofs, points = roofline(pytester.path / "r.svg")
    assert list(roofs) == ["tpu_v1"]
    assert points == []


def test_roofline_write_error_is_one_line_and_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_none="def test_nothing():\n    pass\n")
    (pytester.path / "taken").mkdir()
    result = pytester.runpytest(*QUIET, "--asic-roofline", "taken")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["nobreak: cannot write roofline taken: Is a directory"])
    assert "Traceback" not in result.stdout.str()


def test_baseline_gates_a_rise_in_simulated_cycles(bench: pytest.Pytester) -> None:
    """Cycles are deterministic: record on the 128x128 default array, rerun there with timing on
    (five calls, the same one-call figures: exit 0), then on the 16x16 gemmini: more cycles for
    the same MACs fails the run."""
    common = (*QUIET, "--asic-backend", "--nobreak-baseline", "b.json")
    disabled = "--benchmark-disable"
    result = bench.runpytest(
        *common, disabled, "--asic-device", "default", "--nobreak-update-baseline"
    )
    assert result.ret == 0
    recorded = json.loads((bench.path / "b.json").read_text())["tests"]
    assert recorded["test_bench.py::test_linear"]["cycles"] == cost("default").cycles

    result = bench.runpytest(*common, "--asic-device", "default")
    assert result.ret == 0
    assert calls_file(bench)["calls"] == 5
    assert "REGRESSION" not in result.stdout.str()

    result = bench.runpytest(*common, disabled, "--asic-device", "gemmini")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=2)
    before, after = cost("default").cycles, cost("gemmini").cycles
    assert after > before
    result.stdout.fnmatch_lines(
        [f"REGRESSION test_bench.py::test_linear  cycles {before} -> {after}"]
    )
    assert "macs" not in result.stdout.str().split("nobreak compile report")[1]
