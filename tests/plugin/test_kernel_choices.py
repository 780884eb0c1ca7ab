"""The run's summary and its JSON report say which host GEMM kernel the ASIC backend kept, shape
by shape, where it timed ``int16`` against ``int_mm`` (:mod:`pytest_nobreak.report.kernel_choices`):
in a serial run and from each xdist worker; merged reports unite them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asic_backend.sim import host_gemm, int16_gemm
from pytest_nobreak.report.json_report import CHOICES_KEY, ReportError, merge_report, read_report
from pytest_nobreak.report.kernel_choices import summary_line, united

#: A decode step's linear called until its shape's trial decides, the trial's timing replaced
#: by a verdict (the kernels' times are the CPU's; the tests of the trials themselves are
#: tests/asic/test_kernel_choice.py).
DECODE = """
import torch
import asic_backend.ops.linear
from asic_backend.sim import amx_gemm, host_gemm, kernel_choice
from asic_backend.sim.device import get_device


def test_decode(monkeypatch):
    monkeypatch.delenv("ASIC_HOST_GEMM", raising=False)
    monkeypatch.setattr(host_gemm, "has_int8_unit", lambda: True)
    monkeypatch.setattr(amx_gemm, "available", lambda: False)
    monkeypatch.setattr(kernel_choice, "_decide", lambda trial: "{verdict}")
    w = torch.randn(48, 64)
    for _ in range(40):
        torch.ops.asic.dyn_linear(torch.randn(1, 64), w, None, False, True, get_device().key)
    assert kernel_choice.choices()
"""


TRIALS = pytest.mark.skipif(
    not int16_gemm.available() or not host_gemm.int_mm_is_exact(),
    reason="a trial needs both the int16 kernel and an exact torch._int_mm",
)


@TRIALS
@pytest.mark.parametrize("verdict", ["int16", "int_mm"])
def test_the_summary_names_the_kernel_each_timed_shape_kept(
    pytester: pytest.Pytester, verdict: str
) -> None:
    pytester.makepyfile(test_decode=DECODE.replace("{verdict}", verdict))
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--asic-backend", "--nobreak-json", "r.json"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [f"nobreak: host GEMM by timing (rows×K×N, threads, path): 1×64×48 *T linear {verdict}"]
    )
    document = json.loads((pytester.path / "r.json").read_text())
    [(shape, kernel)] = document[CHOICES_KEY].items()
    assert shape == f"1×64×48 {torch.get_num_threads()}T linear"  # the inner run's: this process
    assert kernel == verdict


@TRIALS
def test_each_xdist_worker_sends_its_choices_to_the_summary(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_a=DECODE.replace("{verdict}", "int16"),
        test_b=DECODE.replace("{verdict}", "int_mm").replace("(48, 64)", "(40, 64)"),
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--asic-backend", "-n", "2", "--dist", "loadfile"
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "nobreak: host GEMM by timing (rows×K×N, threads, path): "
            "1×64×40 *T linear int_mm; 1×64×48 *T linear int16"
        ]
    )


def test_a_run_without_trials_has_no_line_and_no_section(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--asic-backend", "--nobreak-json", "r.json"
    )
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("nobreak: host GEMM by timing*")
    assert CHOICES_KEY not in json.loads((pytester.path / "r.json").read_text())


def test_workers_that_differed_are_both_shown() -> None:
    choices = united(
        [
            (2, 64, 48, 2, "linear", "int16"),
            (2, 64, 48, 2, "linear", "int_mm"),
            (1, 8, 8, 1, "gemm", "int16"),
            (1, 8, 8, 1, "gemm", "int16"),  # two workers that agreed
        ]
    )
    assert choices == {
        "1×8×8 1T gemm": "int16",
        "2×64×48 2T linear": "int16 or int_mm (by worker)",
    }
    assert summary_line(choices) == (
        "nobreak: host GEMM by timing (rows×K×N, threads, path): "
        "1×8×8 1T gemm int16; 2×64×48 2T linear int16 or int_mm (by worker)"
    )
    assert summary_line({}) is None


def test_merged_reports_unite_their_choices_the_later_winning_a_shape_both_timed() -> None:
    def report(choices: dict[str, str]) -> dict[str, object]:
        return {"version": 1, "tests": {}, CHOICES_KEY: choices}

    merged = merge_report(
        report({"1×8×8 1T gemm": "int16", "2×8×8 1T gemm": "int_mm"}),
        report({"2×8×8 1T gemm": "int16"}),
    )
    assert merged[CHOICES_KEY] == {"1×8×8 1T gemm": "int16", "2×8×8 1T gemm": "int16"}


def test_a_report_whose_choices_are_not_kernels_by_shape_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"version": 1, "tests": {}, CHOICES_KEY: {"1×8×8 1T gemm": 3}}))
    with pytest.raises(ReportError, match="must be an object of host GEMM kernels by shape"):
        read_report(path)


def test_a_process_that_never_loaded_the_trials_has_no_choices_and_imports_no_torch() -> None:
    """``local_choices`` reads the trials' module only where it is loaded: the plugin's
    controller, which runs no test under xdist, stays free of torch for it."""
    code = (
        "import sys\n"
        "from pytest_nobreak.report.kernel_choices import local_choices, summary_line, united\n"
        "print(local_choices(), summary_line(united(local_choices())), 'torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["[]", "None", "False"]
