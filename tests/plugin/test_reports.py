"""What a run leaves behind: the terminal section, the JSON report, JUnit properties, GitHub
output, and the errors when a file cannot be written or the options contradict each other.

Inner sessions run in-process (pytester); the environment is shared with them, so the GitHub
variables are set with ``monkeypatch``.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_nobreak.report.versions import sim_version
from pytest_nobreak.watch.fixes import fix_for
from tests.plugin.conftest import Models, without_html_details

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

SUITE = """
import pytest
import torch

import models as M


@pytest.mark.no_graph_break
def test_branch():
    torch.compile(M.data_dependent, backend="eager")(torch.ones(3))


@pytest.mark.no_graph_break
def test_mlp(nobreak_compile):
    nobreak_compile(M.MLP(), backend="eager")(torch.randn(2, 8))


def test_unmarked():
    torch.compile(M.data_dependent, backend="eager")(torch.ones(3))


def test_plain():
    assert True
"""

CORE_KEYS = {
    "outcome",
    "marked",
    "graphs",
    "graph_breaks",
    "eager_frames",
    "recompiles",
    "host_syncs",
    "foreign_breaks",
    "breaks",
}


@pytest.fixture(autouse=True)
def _no_ci_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The outer run may itself be on GitHub: inner runs must not write to its job summary."""
    for name in ("CI", "GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GITHUB_WORKSPACE"):
        monkeypatch.delenv(name, raising=False)


def run(models: Models, *args: str, suite: str = SUITE) -> pytest.RunResult:
    models.pytester.makepyfile(test_suite=suite)
    return models.pytester.runpytest(
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args
    )


def output(result: pytest.RunResult) -> str:
    return result.stdout.str() + "\n" + result.stderr.str()


def nobreak_lines(result: pytest.RunResult) -> list[str]:
    """The plugin's own lines after the tests ran (not the ``nobreak: backend=`` header)."""
    lines = output(result).splitlines()
    return [line for line in lines if line.startswith("nobreak: ") and "backend=" not in line]


def assert_no_traceback(result: pytest.RunResult) -> None:
    text = output(result)
    for word in ("Traceback", "INTERNALERROR", 'File "'):
        assert word not in text, text


def branch_event(models: Models, called_from: tuple[str, int] | None = None) -> dict[str, object]:
    """The JSON of ``models.data_dependent``'s break, ``called_from`` the test's line."""
    event: dict[str, object] = {
        "kind": "graph_break",
        "gb_id": "GB0170",
        "gb_type": "Data-dependent branching",
        "file": "models.py",  # relative to the rootdir
        "line": models.line("branch"),
        "reason": "Detected data-dependent branching (e.g. `if my_tensor.sum() > 0:`). "
        "Dynamo does not support tracing dynamic control flow.",
        "owner": "own",
    }
    if called_from is not None:
        event["call_sites"] = [{"file": called_from[0], "line": called_from[1]}]
    event["fix"] = fix_for("GB0170", "if x.sum() > 0:")  # the user's line, rewritten
    return event


def line_of(models: Models, name: str, text: str = "M.data_dependent") -> int:
    """The line of ``name`` (in the pytester dir) that calls ``text``."""
    lines = (models.pytester.path / name).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


# ---------------------------------------------------------------------- terminal summary

CLEAN = """
import pytest
import torch

import models as M


@pytest.mark.no_graph_break
def test_mlp(nobreak_compile):
    nobreak_compile(M.MLP(), backend="eager")(torch.randn(2, 8))


def test_plain():
    assert True
"""


def test_the_summary_says_nothing_about_a_clean_run(models: Models) -> None:
    result = run(models, suite=CLEAN)
    assert result.ret == 0
    assert "nobreak compile report" not in result.stdout.str()


def test_the_summary_lists_every_watched_test_with_v(models: Models) -> None:
    result = run(models, "-v", suite=CLEAN)
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "*- nobreak compile report -*",
            "test *  graphs  breaks   eager  recomp  outcome",
            "test_suite.py::test_mlp       1       0       0       0  passed",
        ]
    )
    section = result.stdout.str().split("nobreak compile report")[1]
    assert "test_suite.py::test_plain" not in section  # not watched


def test_the_summary_shows_breaks_no_failure_message_showed(models: Models) -> None:
    """The unmarked test's break (under --nobreak-all) is reported; the failed marked test's
    break is in its failure message already, so it gets no row."""
    result = run(models, "--nobreak-all")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*- nobreak compile report -*",
            "test *  outcome",
            "test_suite.py::test_unmarked       2       1       0       0  passed",
            f"    graph break GB0170 at {models.where('branch')}: Data-dependent branching",
        ]
    )
    section = result.stdout.str().split("nobreak compile report")[1]
    assert "test_suite.py::test_branch" not in section.split("short test summary")[0]
    assert "test_suite.py::test_mlp" not in section
    assert "::" not in result.stderr.str()  # not on GitHub: no workflow commands


# A terminal 64 columns wide (pytester's output is a pipe, which the table does not fit).
TTY_CONFTEST = """
import pytest


class _Yes:  # TerminalReporter.isatty is a bool that may be called
    def __bool__(self):
        return True

    def __call__(self):
        return True


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    reporter.isatty = _Yes()
    reporter._tw.fullwidth = 64
"""

LONG_NAME = "test_a_model_whose_test_name_runs_well_past_the_width_of_a_terminal"


def test_the_table_fits_the_terminal_and_keeps_its_figures(models: Models) -> None:
    suite = SUITE.replace("def test_unmarked", f"def {LONG_NAME}")
    models.pytester.makeconftest(TTY_CONFTEST)
    result = run(models, "--nobreak-all", suite=suite)
    result.assert_outcomes(passed=3, failed=1)
    lines = report_lines(result)
    assert lines[0] == "test                     graphs  breaks   eager  recomp  outcome"
    assert lines[1] == "..._width_of_a_terminal       2       1       0       0  passed"
    assert lines[2].startswith(f"    graph break GB0170 at {models.where('branch')}: Data-dep")
    assert all(len(line) <= 64 for line in lines), lines
    # In a pipe or a file (a CI log), the whole id: it is what a reader searches for.
    models.pytester.path.joinpath("conftest.py").unlink()
    piped = report_lines(run(models, "--nobreak-all", suite=suite))
    assert piped[1].startswith(f"test_suite.py::{LONG_NAME}       2")


def report_lines(result: pytest.RunResult) -> list[str]:
    """The compile report's table: its header and the lines under it, up to pytest's next."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "nobreak compile report" in line) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("="))
    return lines[start:end]


# ---------------------------------------------------------------------- JSON and JUnit


def test_json_report_and_junit_properties(models: Models) -> None:
    report = models.pytester.path / "out" / "nobreak.json"
    # An earlier run's report: replaced, so the artifact holds this run's tests only.
    report.parent.mkdir()
    earlier = {"outcome": "passed", "marked": True, "graphs": 1, "graph_breaks": 0}
    earlier |= {"eager_frames": 0, "recompiles": 0, "host_syncs": 0, "breaks": []}
    header = {"version": 1, "torch": "2.13.0", "backend": "inductor", "device": ""}
    report.write_text(json.dumps({**header, "tests": {"test_gone.py::test_old": earlier}}))
    result = run(models, "--nobreak-all", "--nobreak-json", "out/nobreak.json", "--junitxml=j.xml")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["nobreak: JSON report written to out/nobreak.json"])

    text = report.read_text()
    document = json.loads(text)
    assert text == json.dumps(document, sort_keys=True, indent=2) + "\n"
    assert set(document) == {"version", "torch", "asic_sim", "backend", "device", "tests"}
    assert document["version"] == 1
    assert document["asic_sim"] == sim_version()  # the installed simulator's, used or not
    assert document["backend"] == "inductor"
    assert document["device"] == ""
    import torch

    assert document["torch"] == str(torch.__version__).split("+", 1)[0]
    tests = document["tests"]
    assert sorted(tests) == [
        "test_suite.py::test_branch",
        "test_suite.py::test_mlp",
        "test_suite.py::test_plain",
        "test_suite.py::test_unmarked",
    ]
    for entry in tests.values():
        assert set(entry) == CORE_KEYS  # no "asic" key: no test reached the simulator
    figures = {"eager_frames": 0, "recompiles": 0, "host_syncs": 0, "foreign_breaks": 0}
    branch = tests["test_suite.py::test_branch"]["breaks"][0]
    # What the HTML report shows of the user's line: its text, and the lines around it.
    assert branch["source"] == "if x.sum() > 0:  # LINE:branch"
    start, lines = branch["context"]["start"], branch["context"]["lines"]
    assert lines[models.line("branch") - start].strip() == branch["source"]
    assert branch["link"].startswith("https://")
    assert branch["hints"]
    tests = {nodeid: without_html_details(entry) for nodeid, entry in tests.items()}
    assert tests["test_suite.py::test_branch"] == {
        "outcome": "failed",
        "marked": True,
        "graphs": 2,
        "graph_breaks": 1,
        **figures,
        "breaks": [branch_event(models, ("test_suite.py", line_of(models, "test_suite.py")))],
    }
    # The same break, reached from the unmarked test's own line.
    unmarked_line = line_of(models, "test_suite.py", "def test_unmarked") + 1
    assert tests["test_suite.py::test_unmarked"] == {
        **tests["test_suite.py::test_branch"],
        "outcome": "passed",
        "marked": False,
        "breaks": [branch_event(models, ("test_suite.py", unmarked_line))],
    }
    assert tests["test_suite.py::test_mlp"] == {
        "outcome": "passed",
        "marked": True,
        "graphs": 1,
        "graph_breaks": 0,
        **figures,
        "breaks": [],
    }
    assert tests["test_suite.py::test_plain"]["graphs"] == 0

    # The same figures, as properties of each test case in the JUnit XML.
    root = ET.parse(models.pytester.path / "j.xml").getroot()
    properties = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in root.iter("testcase")
    }
    branch = f"graph break GB0170 at {models.where('branch')}: Data-dependent branching"
    assert properties["test_branch"] == {
        "nobreak_graphs": "2",
        "nobreak_graph_breaks": "1",
        "nobreak_eager_frames": "0",
        "nobreak_recompiles": "0",
        "nobreak_host_syncs": "0",
        "nobreak_foreign_breaks": "0",
        "nobreak_break": branch,
    }
    # The unmarked test is not failed for its break: JUnit names it all the same.
    assert properties["test_unmarked"]["nobreak_break"] == branch
    assert properties["test_mlp"]["nobreak_graphs"] == "1"
    assert "nobreak_break" not in properties["test_mlp"]
    assert properties["test_plain"]["nobreak_graphs"] == "0"


ASIC_SUITE = """
import pytest
import torch
from torch import nn


@pytest.mark.no_graph_break
def test_linear(nobreak_compile):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        nobreak_compile(model)(torch.randn(2, 8))
"""


def test_asic_figures_in_the_json_and_the_baseline(models: Models) -> None:
    """Under --asic-backend the device figures join the report and the baseline; a slower
    device is a cycles regression, and the accept command keeps the options that made it."""
    args = ("--asic-backend", "--nobreak-json", "r.json", "--nobreak-baseline", "b.json")
    gemmini = ("--asic-device", "gemmini")
    result = run(models, *args, *gemmini, "--nobreak-update-baseline", suite=ASIC_SUITE)
    assert result.ret == 0, result.stdout.str()
    document = json.loads((models.pytester.path / "r.json").read_text())
    assert document["backend"] == "asic"
    assert document["device"] == "gemmini"
    entry = document["tests"]["test_suite.py::test_linear"]
    assert set(entry) == {*CORE_KEYS, "asic", "gemms"}
    assert set(entry["asic"]) == {
        "dut_ops",
        "host_fallbacks",
        "macs",
        "host_macs",
        "cycles",
        "syncs",
    }
    assert entry["asic"]["dut_ops"] == 2
    # Each DUT GEMM shape once, with its calls, for the HTML report's families and roofline.
    shapes = [(g["family"], g["m"], g["k"], g["n"], g["calls"]) for g in entry["gemms"]]
    assert shapes == [("matmul", 2, 8, 16, 1), ("matmul", 2, 16, 4, 1)]
    assert {g["device"] for g in entry["gemms"]} == {"gemmini"}
    assert sum(g["macs"] * g["calls"] for g in entry["gemms"]) == entry["asic"]["macs"]
    assert sum(g["cycles"] * g["calls"] for g in entry["gemms"]) == entry["asic"]["cycles"]
    assert document["roofs"]["gemmini"]["peak_ops_per_s"] == 2 * 16 * 16 * 1e9
    assert entry["asic"]["host_fallbacks"] == 0
    assert entry["asic"]["macs"] == 2 * 8 * 16 + 2 * 16 * 4
    assert entry["asic"]["host_macs"] == 0
    recorded = json.loads((models.pytester.path / "b.json").read_text())
    assert recorded["tests"]["test_suite.py::test_linear"] == {
        "graphs": 1,
        "graph_breaks": 0,
        "eager_frames": 0,
        "recompiles": 0,
        "host_syncs": 0,
        "foreign_breaks": 0,
        **entry["asic"],
    }

    # For these tiny GEMMs the default 128x128 array spends more cycles filling and draining
    # than the 16x16 one: on it, the same test is a cycles regression.
    result = run(models, *args, suite=ASIC_SUITE)
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            f"REGRESSION test_suite.py::test_linear  cycles {entry['asic']['cycles']} -> *",
            "if this is intended, run pytest --nobreak-baseline b.json --asic-backend "
            "--nobreak-update-baseline to accept *",
        ]
    )


# ---------------------------------------------------------------------- the last line


def recorded_baseline(models: Models, **changes: int) -> None:
    """Record b.json for CLEAN, then set test_mlp's figures to ``changes``."""
    assert (
        run(models, "--nobreak-baseline=b.json", "--nobreak-update-baseline", suite=CLEAN).ret == 0
    )
    path = models.pytester.path / "b.json"
    document = json.loads(path.read_text())
    document["tests"]["test_suite.py::test_mlp"].update(changes)
    path.write_text(json.dumps(document))


def test_a_baseline_regression_ends_with_a_red_line_that_says_so(models: Models) -> None:
    """The tests passed but the run exits 1: pytest's last line must not be a green "passed"."""
    recorded_baseline(models, graphs=0)
    result = run(models, "--nobreak-baseline=b.json", "--color=yes", suite=CLEAN)
    assert result.ret == 1
    last = result.stdout.lines[-1]
    red, bold, reset = "\x1b[31m", "\x1b[1m", "\x1b[0m"
    assert last.startswith(f"{red}=")
    assert f"passed{reset}, {red}{bold}1 baseline regression{reset}{red} in " in last
    # Without the gate failing, pytest's own line is left alone.
    result = run(models, "--nobreak-baseline=b.json", "--nobreak-update-baseline", suite=CLEAN)
    assert result.ret == 0
    assert fnmatch.fnmatchcase(result.stdout.lines[-1], "*= 2 passed in *s =*")


def test_the_last_line_counts_regressions_and_strict_misses(models: Models) -> None:
    recorded_baseline(models, graphs=0, dut_ops=3, host_fallbacks=0, macs=0, cycles=0)
    result = run(models, "--nobreak-baseline=b.json", suite=CLEAN)
    assert result.ret == 1
    # dut_ops 3 -> not measured counts as a fall to 0: two figures, two regression lines.
    result.stdout.fnmatch_lines(["REGRESSION * graphs 0 -> 1", "REGRESSION * dut_ops 3 -> -"])
    assert fnmatch.fnmatchcase(
        result.stdout.lines[-1], "*= 2 passed, 2 baseline regressions in *s =*"
    )

    path = models.pytester.path / "b.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tests": {}}))
    result = run(models, "--nobreak-baseline=b.json", "--nobreak-strict", "-q", suite=CLEAN)
    assert result.ret == 1
    assert fnmatch.fnmatchcase(
        result.stdout.lines[-1], "2 passed, 1 missing from the baseline in *s"
    )
    # Not strict: a warning, exit 0, and pytest's own line.
    result = run(models, "--nobreak-baseline=b.json", "-q", suite=CLEAN)
    assert result.ret == 0
    assert fnmatch.fnmatchcase(result.stdout.lines[-1], "2 passed in *s")


# ---------------------------------------------------------------------- GitHub Actions


def test_github_annotations_and_step_summary(
    models: Models, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(models.pytester.path.parent))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = run(models, "--nobreak-all")
    result.assert_outcomes(passed=3, failed=1)
    line = models.line("branch")
    here = models.pytester.path.name  # the rootdir, one level below the workspace
    # One annotation per distinct break, at the model's line, naming both tests; an error
    # because it failed the marked one.
    annotations = [text for text in result.stderr.lines if text.startswith("::")]
    assert annotations == [
        f"::error file={here}/models.py,line={line},"
        "title=graph break GB0170%3A Data-dependent branching::Detected data-dependent "
        "branching (e.g. `if my_tensor.sum() > 0:`). Dynamo does not support tracing dynamic "
        "control flow.%0Ain 2 tests: test_suite.py::test_branch, test_suite.py::test_unmarked"
    ]
    text = summary.read_text()
    assert text.startswith("earlier step\n### pytest-nobreak\n")  # appended, not replaced
    assert "| `test_suite.py::test_branch` | 2 | 1 | 0 | 0 | 0 | – | – | – | – | failed |" in text
    assert "| `test_suite.py::test_mlp` | 1 | 0 | 0 | 0 | 0 | – | – | – | – | passed |" in text
    assert text.count("### pytest-nobreak") == 1


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("adir", "ERROR: JSON report adir: is a directory; pass the path of a file"),
        (
            "afile.txt/r.json",
            "ERROR: JSON report afile.txt/r.json: afile.txt is not a directory; pass another "
            "--nobreak-json path",
        ),
        (
            "invalid.json",
            "ERROR: JSON report invalid.json: is not valid JSON: Expecting property name "
            "enclosed in double quotes at line 1, column 2; delete it or pass another "
            "--nobreak-json path",
        ),
        (
            "other.json",
            "ERROR: JSON report other.json: is not a version 1 pytest-nobreak report; delete it "
            "or pass another --nobreak-json path",
        ),
    ],
    ids=["directory", "under-a-file", "invalid-json", "not-a-report"],
)
def test_a_json_path_that_cannot_be_written_stops_the_run_at_start(
    models: Models, path: str, error: str
) -> None:
    """Before any test runs (exit 4, one line), not after an hour of them; a file that is not a
    report is left as it was."""
    (models.pytester.path / "adir").mkdir()
    models.pytester.makefile(".txt", afile="not a directory")
    files = {"invalid.json": "{not json", "other.json": "[1, 2]"}
    for name, text in files.items():
        (models.pytester.path / name).write_text(text)
    result = run(models, "--nobreak-json", path, suite=CLEAN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in output(result).splitlines() if line.strip()]
    assert lines == [error]
    for name, text in files.items():
        assert (models.pytester.path / name).read_text() == text


def test_a_json_report_that_cannot_be_written_at_the_end_is_one_line(
    models: Models, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk at the end of the run: one line, a red last line, exit 1."""

    def full_disk(target: object, text: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("pytest_nobreak.report.json_report.write_atomic", full_disk)
    result = run(models, "--nobreak-json", "r.json", suite=CLEAN)
    assert result.ret == 1  # the tests passed; the report could not be written
    result.assert_outcomes(passed=2)
    assert nobreak_lines(result) == [
        "nobreak: cannot write JSON report r.json: No space left on device"
    ]
    assert fnmatch.fnmatchcase(result.stdout.lines[-1], "*= 2 passed, 1 report error in *s =*")
    assert_no_traceback(result)


def test_an_unwritable_baseline_is_one_line(models: Models) -> None:
    models.pytester.makefile(".txt", afile="not a directory")
    result = run(
        models,
        "--nobreak-baseline",
        "afile.txt/b.json",
        "--nobreak-update-baseline",
        suite=CLEAN,
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in output(result).splitlines() if line.strip()]
    assert lines == [
        "ERROR: baseline file afile.txt/b.json: cannot be read (Not a directory); fix or "
        "restore the file, or delete it and re-record with pytest --nobreak-baseline "
        "afile.txt/b.json --nobreak-update-baseline"
    ]


def test_a_baseline_that_cannot_be_written_is_one_line(
    models: Models, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk at the end of the run: one line, and the old file as it was."""
    path = models.pytester.path / "b.json"
    result = run(models, "--nobreak-baseline", "b.json", "--nobreak-update-baseline", suite=CLEAN)
    assert result.ret == 0
    recorded = path.read_bytes()

    def full_disk(target: object, text: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("pytest_nobreak.gate.baseline.write_atomic", full_disk)
    result = run(models, "--nobreak-baseline", "b.json", "--nobreak-update-baseline", suite=CLEAN)
    assert result.ret == 1
    errors = nobreak_lines(result)
    assert errors == ["nobreak: cannot write baseline b.json: No space left on device"]
    assert fnmatch.fnmatchcase(result.stdout.lines[-1], "*= 2 passed, 1 report error in *s =*")
    assert path.read_bytes() == recorded
    assert_no_traceback(result)


def test_a_crash_in_one_report_is_one_line_and_the_others_still_run(
    models: Models, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> list[str]:
        raise RuntimeError("boom")

    monkeypatch.setattr("pytest_nobreak.report.github.emit", broken)
    result = run(models, "--nobreak-json", "r.json", suite=CLEAN)
    assert result.ret == 1
    result.assert_outcomes(passed=2)
    errors = nobreak_lines(result)
    assert errors == [
        "nobreak: JSON report written to r.json",
        "nobreak: could not write the GitHub Actions output: RuntimeError: boom",
    ]
    assert fnmatch.fnmatchcase(result.stdout.lines[-1], "*= 2 passed, 1 report error in *s =*")
    assert json.loads((models.pytester.path / "r.json").read_text())["tests"]
    assert_no_traceback(result)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--nobreak-update-baseline",),
            "ERROR: --nobreak-update-baseline needs a baseline file: pass --nobreak-baseline "
            "PATH or set nobreak_baseline in the ini file.",
        ),
        (
            ("--asic-backend", "--nobreak-backend", "inductor"),
            "ERROR: --asic-backend and --nobreak-backend inductor contradict each other: pass "
            "only one of them.",
        ),
        (
            ("--asic-device", "gemmini", "--nobreak-backend", "inductor"),
            "ERROR: --asic-device gemmini (which implies --asic-backend) and --nobreak-backend "
            "inductor contradict each other: pass only one of them.",
        ),
        (
            ("--nobreak-backend", "no_such_backend"),
            "ERROR: --nobreak-backend no_such_backend: unknown torch.compile backend; known: *",
        ),
    ],
    ids=["update-without-baseline", "asic-and-inductor", "device-and-inductor", "unknown-backend"],
)
def test_bad_option_combinations_are_a_usage_error(
    models: Models, args: tuple[str, ...], message: str
) -> None:
    result = run(models, *args, suite=CLEAN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in output(result).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert fnmatch.fnmatchcase(lines[0], message), lines[0]


# ---------------------------------------------------------------------- docs/ci.md

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ci.md"


def test_the_ci_guide_workflow_and_options_are_real() -> None:
    """docs/ci.md stays true: its workflow parses, and every option and ini key it names exists."""
    yaml = pytest.importorskip("yaml")
    from pytest_nobreak.config import OPTIONS

    text = DOCS.read_text()
    block, sharded = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    workflow = yaml.safe_load(block)
    steps = workflow["jobs"]["nobreak"]["steps"]
    assert all("uses" in step or "run" in step for step in steps)
    commands = " ".join(step.get("run", "") for step in steps)
    assert "pytest -n 2 --nobreak-baseline tests/nobreak-baseline.json" in " ".join(
        commands.split()
    )
    # The sharded workflow: a matrix of pytest-split groups, then a job merging their reports.
    jobs = yaml.safe_load(sharded)["jobs"]
    assert jobs["shard"]["strategy"]["matrix"]["group"] == [1, 2, 3, 4]
    shard_runs = " ".join(" ".join(step.get("run", "").split()) for step in jobs["shard"]["steps"])
    assert "pytest --splits 4 --group ${{ matrix.group }}" in shard_runs
    assert "--nobreak-json shard-${{ matrix.group }}.json" in shard_runs
    assert jobs["merge"]["needs"] == "shard"
    merge_runs = " ".join(step.get("run", "") for step in jobs["merge"]["steps"])
    merge = "python -m pytest_nobreak merge nobreak.json shard-*.json --html nobreak.html $update"
    assert merge in merge_runs
    uploaded = [
        s["with"]["path"] for s in jobs["merge"]["steps"] if "upload-artifact" in s.get("uses", "")
    ]
    assert uploaded[0].split() == ["nobreak.json", "nobreak.html", "tests/nobreak-baseline.json"]

    flags = {option.flag for option in OPTIONS} | {"--no-nobreak-strict"}
    inis = {option.ini for option in OPTIONS if option.ini}
    named = set(re.findall(r"(?<![\w-])(--(?:nobreak|asic|no-nobreak)[\w-]*)", text))
    assert named, "the guide names no option?"
    assert named <= flags, named - flags
    # The options table: | `--flag ARG` | `ini_key` | what it does |, with the right ini keys.
    row = r"^\| `(--[\w-]+)[^`]*`(?: / `--[\w-]+`)? \| (?:`(\w+)`)? *\|"
    table = dict(re.findall(row, text, flags=re.MULTILINE))
    assert table == {o.flag: o.ini or "" for o in OPTIONS if o.flag in table}
    gate = {"--nobreak-baseline", "--nobreak-update-baseline", "--nobreak-strict", "--nobreak-json"}
    assert gate | {"--nobreak-all", "--asic-backend", "--nobreak-backend"} <= set(table)
    assert set(re.findall(r"^(\w+) = ", text, re.M)) <= inis  # the pyproject snippet
