"""pytest-xdist: ``-n 2`` gives the outcomes, messages, reports and baseline of a serial run,
only the controller writes, and an interrupted run loses nothing.

The serial side runs in-process; the xdist side is a real ``pytest -n 2`` subprocess (each
costs a few seconds of torch imports in three processes, so there are only four of them).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from asic_backend import SIM_VERSION
from pytest_nobreak.gate.baseline import load_baseline
from tests.plugin.conftest import Models

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

# The detection acceptance (a few cases of test_detection.py) plus a test whose figures a
# code change moves, switched by $NB_MODE.
SUITE = '''
import os

import pytest
import torch

import models as M

MODE = os.environ.get("NB_MODE", "base")


@pytest.mark.no_graph_break
def test_branch():
    torch.compile(M.data_dependent, backend="eager")(torch.ones(3))


@pytest.mark.no_graph_break
def test_seed():
    m = torch.compile(M.Seed(), backend=M.naive_backend)
    for _ in range(3):
        m(torch.randn(2, 8))


@pytest.mark.no_graph_break(allow=[r"GB0170"])
def test_allowed():
    torch.compile(M.data_dependent, backend="eager")(torch.ones(3))


def test_interrupt():
    if MODE == "interrupt":
        raise KeyboardInterrupt


@pytest.mark.no_graph_break
def test_mlp(nobreak_compile):
    nobreak_compile(M.MLP(), backend="aot_eager")(torch.randn(2, 8))


def test_unmarked():
    """Only watched under --nobreak-all: observed and reported, never failed. Its figures count
    what it compiled itself, so it compiles what no other test does: whichever worker runs it,
    after whichever tests, nothing is cached for it."""
    torch.compile(M.two_breaks, backend="eager")(torch.ones(3))


def test_regress(nobreak_compile):
    fn = M.data_dependent if MODE == "regress" else M.clean
    nobreak_compile(fn, backend="eager")(torch.ones(3))


if MODE == "regress":

    def test_new(nobreak_compile):
        nobreak_compile(M.clean, backend="eager")(torch.ones(3))
'''

# Logs every file write of the plugin with the role of the process that made it.
CONFTEST = """
import os

import pytest_nobreak.gate.baseline
import pytest_nobreak.report.json_report

_ORIGINALS = {}


def pytest_configure(config):
    role = config.workerinput["workerid"] if hasattr(config, "workerinput") else "controller"
    log = config.rootpath / "writes.log"
    for module in (pytest_nobreak.gate.baseline, pytest_nobreak.report.json_report):
        original = _ORIGINALS.setdefault(module, module.write_atomic)

        def logged(path, text, original=original):
            with open(log, "a") as f:
                f.write(f"{role} {os.path.basename(path)}\\n")
            original(path, text)

        module.write_atomic = logged


def pytest_unconfigure(config):
    # In-process runs share the plugin's modules with the outer session: put them back.
    for module, original in _ORIGINALS.items():
        module.write_atomic = original
    _ORIGINALS.clear()
"""

OUTCOMES = {
    "test_branch": "failed",
    "test_seed": "failed",
    "test_allowed": "passed",
    "test_interrupt": "passed",
    "test_mlp": "passed",
    "test_unmarked": "passed",
    "test_regress": "passed",
}
FAIL_TITLE = "@pytest.mark.no_graph_break: torch.compile did not run as whole graphs"
COMMON = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
# Plugins of the outer environment these runs do not need; hypothesis alone takes a second to
# import in each of the three processes of an xdist run.
UNUSED_PLUGINS = ("-p", "no:benchmark", "-p", "no:hypothesispytest", "-p", "no:anyio")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner runs choose CI, GitHub and xdist settings themselves, whatever the outer run is."""
    for name in (
        "CI",
        "GITHUB_ACTIONS",
        "GITHUB_STEP_SUMMARY",
        "GITHUB_WORKSPACE",
        "NB_MODE",
        "PYTEST_XDIST_WORKER",
        "PYTEST_XDIST_WORKER_COUNT",
        "PYTEST_XDIST_TESTRUNUID",
        "PYTEST_ADDOPTS",
    ):
        monkeypatch.delenv(name, raising=False)


class Project:
    def __init__(self, models: Models, monkeypatch: pytest.MonkeyPatch) -> None:
        self.models = models
        self.pytester = models.pytester
        self.path = models.pytester.path
        self.monkeypatch = monkeypatch
        self.pytester.makepyfile(test_x=SUITE, conftest=CONFTEST)

    def run(self, *args: str, xdist: bool, mode: str = "base") -> pytest.RunResult:
        self.monkeypatch.setenv("NB_MODE", mode)
        if xdist:
            return self.pytester.runpytest_subprocess("-n", "2", *COMMON, *UNUSED_PLUGINS, *args)
        # no_reraise_ctrlc: an inner KeyboardInterrupt is the case under test, not the user
        # interrupting the outer run.
        return self.pytester.runpytest(*COMMON, *args, no_reraise_ctrlc=True)

    def github(self, name: str) -> Path:
        """Turn on GitHub output for the next run, into a fresh step summary file."""
        summary = self.path / f"{name}-summary.md"
        self.monkeypatch.setenv("GITHUB_ACTIONS", "true")
        self.monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
        return summary

    def writes(self) -> list[str]:
        log = self.path / "writes.log"
        lines = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return lines

    def read_json(self, name: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((self.path / name).read_text())
        return document


@pytest.fixture
def project(models: Models, monkeypatch: pytest.MonkeyPatch) -> Project:
    return Project(models, monkeypatch)


def failure_messages(result: pytest.RunResult) -> dict[str, list[str]]:
    """Each failed test's nobreak message, from its title line to the allow hint."""
    messages: dict[str, list[str]] = {}
    current: str | None = None
    inside = False
    for line in result.stdout.lines:
        header = re.fullmatch(r"_{3,} (\S+) _{3,}", line)
        if header:
            current, inside = header.group(1), False
        elif current is not None and line.startswith(FAIL_TITLE):
            inside = True
        if inside and current is not None:
            messages.setdefault(current, []).append(line)
            if line.startswith("To allow a known break"):
                inside = False
    return messages


def report_section(result: pytest.RunResult) -> list[str]:
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "nobreak compile report" in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("====="))
    return lines[start:end]


def junit_properties(path: Path) -> dict[str, dict[str, str]]:
    root = ET.parse(path).getroot()
    return {
        str(case.get("name")): {
            str(p.get("name")): str(p.get("value")) for p in case.iter("property")
        }
        for case in root.iter("testcase")
    }


def workflow_lines(result: pytest.RunResult) -> list[str]:
    return sorted(line for line in result.stderr.lines if line.startswith("::"))


def assert_no_traceback(result: pytest.RunResult) -> None:
    text = result.stdout.str() + result.stderr.str()
    for word in ("Traceback", "INTERNALERROR"):
        assert word not in text, text


def test_xdist_gives_the_serial_outcomes_messages_and_files(project: Project) -> None:
    args = ("--nobreak-all", "--nobreak-update-baseline")

    def files(name: str) -> tuple[str, ...]:
        return (
            f"--nobreak-baseline={name}-b.json",
            f"--nobreak-json={name}-r.json",
            f"--junitxml={name}-j.xml",
        )

    serial_summary = project.github("serial")
    serial = project.run(*args, *files("serial"), xdist=False)
    assert project.writes() == ["controller serial-b.json", "controller serial-r.json"]
    xdist_summary = project.github("xdist")
    xdist = project.run(*args, *files("xdist"), xdist=True)
    # Only the controller wrote, once each; no worker touched a file.
    assert sorted(project.writes()) == ["controller xdist-b.json", "controller xdist-r.json"]

    # The detection acceptance: the same outcomes, serial and -n 2.
    for result in (serial, xdist):
        assert result.ret == 1
        result.assert_outcomes(passed=5, failed=2)
        assert_no_traceback(result)
    report = project.read_json("serial-r.json")
    assert {k: v["outcome"] for k, v in report["tests"].items()} == {
        f"test_x.py::{name}": outcome for name, outcome in OUTCOMES.items()
    }

    # The same failure messages, line for line.
    messages = failure_messages(serial)
    assert sorted(messages) == ["test_branch", "test_seed"]
    assert any("GB0170" in line for line in messages["test_branch"])
    assert any("GB0219" in line for line in messages["test_seed"])
    assert failure_messages(xdist) == messages

    # The same files: JSON report, baseline (byte for byte), JUnit properties, GitHub output.
    # The controller never imports torch, yet its headers name the release that ran the tests.
    import torch

    release = str(torch.__version__).split("+", 1)[0]
    assert project.read_json("xdist-b.json")["torch"] == release
    assert project.read_json("xdist-b.json")["asic_sim"] == SIM_VERSION
    assert project.read_json("xdist-r.json")["torch"] == release
    assert project.read_json("xdist-r.json") == report
    assert (project.path / "xdist-b.json").read_bytes() == (
        project.path / "serial-b.json"
    ).read_bytes()
    assert junit_properties(project.path / "xdist-j.xml") == junit_properties(
        project.path / "serial-j.xml"
    )
    assert workflow_lines(xdist) == workflow_lines(serial)
    assert any(line.startswith("::error file=models.py,line=") for line in workflow_lines(serial))
    assert xdist_summary.read_text() == serial_summary.read_text()
    assert serial_summary.read_text().count("### pytest-nobreak") == 1

    # A regression and a new test under CI (strict): the same verdict, word for word.
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY"):
        project.monkeypatch.delenv(name)
    project.monkeypatch.setenv("CI", "true")
    gate = ("--nobreak-all", "--nobreak-baseline=xdist-b.json")
    serial = project.run(*gate, xdist=False, mode="regress")
    xdist = project.run(*gate, xdist=True, mode="regress")
    for result in (serial, xdist):
        assert result.ret == 1
        result.assert_outcomes(passed=6, failed=2)
        result.stdout.fnmatch_lines(
            [
                "REGRESSION test_x.py::test_regress  graphs 1 -> 2",
                "REGRESSION test_x.py::test_regress  graph_breaks 0 -> 1",
                "MISSING    test_x.py::test_new  not in the baseline (strict)",
            ]
        )
        # The tests' outcomes, then what failed the run besides them, in one red line.
        assert re.fullmatch(
            r"=+ 2 failed, 6 passed, 2 baseline regressions, 1 missing from the "
            r"baseline in [\d.]+s =+",
            result.stdout.lines[-1],
        ), result.stdout.lines[-1]
        assert_no_traceback(result)
    assert report_section(xdist) == report_section(serial)
    assert project.writes() == []  # a checking run writes nothing
    assert (project.path / "xdist-b.json").read_bytes() == (
        project.path / "serial-b.json"
    ).read_bytes()


def inflated_baseline(project: Project) -> dict[str, dict[str, int]]:
    """A recorded baseline whose every entry has 5 graphs too many, so updated entries show."""
    args = ("--nobreak-all", "--nobreak-baseline=b.json", "--nobreak-update-baseline")
    assert project.run(*args, xdist=False).ret == 1  # the two failing marked tests
    true: dict[str, dict[str, int]] = project.read_json("b.json")["tests"]
    inflated = project.read_json("b.json")
    for entry in inflated["tests"].values():
        entry["graphs"] += 5
    (project.path / "b.json").write_text(json.dumps(inflated))
    return true


def earlier_report(project: Project) -> dict[str, object]:
    gone = {"outcome": "passed", "marked": True, "graphs": 1, "graph_breaks": 0}
    gone |= {"eager_frames": 0, "recompiles": 0, "breaks": []}
    header = {"version": 1, "torch": "2.13.0", "backend": "inductor", "device": ""}
    (project.path / "r.json").write_text(json.dumps({**header, "tests": {"gone.py::t": gone}}))
    return gone


def test_a_keyboard_interrupt_loses_nothing(project: Project) -> None:
    """Serial, so the order is known: the tests before the interrupt are rewritten, the rest
    keep their entries, and both files stay valid. The report is this run's: the tests that ran
    before the interrupt, and no entry of the earlier report."""
    true = inflated_baseline(project)
    before = json.loads((project.path / "b.json").read_text())["tests"]
    earlier_report(project)
    project.writes()
    args = ("--nobreak-all", "--nobreak-baseline=b.json", "--nobreak-update-baseline")
    result = project.run(*args, "--nobreak-json=r.json", xdist=False, mode="interrupt")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert sorted(project.writes()) == ["controller b.json", "controller r.json"]

    after = load_baseline(project.path / "b.json")
    assert after is not None
    entries = {nodeid: figures.as_dict() for nodeid, figures in after.entries.items()}
    ran = {f"test_x.py::{name}" for name in ("test_branch", "test_seed", "test_allowed")}
    assert entries == {nodeid: (true if nodeid in ran else before)[nodeid] for nodeid in before}

    tests = project.read_json("r.json")["tests"]
    assert set(tests) == ran  # not gone.py::t, the earlier report's


def test_an_xdist_run_stopped_by_x_loses_nothing(project: Project) -> None:
    """Which tests finish before the stop varies under xdist; what may not vary: every entry is
    either kept or rewritten with the true figures, the failing test's own entry is rewritten,
    and the report holds the tests that ran, not those of the earlier report."""
    true = inflated_baseline(project)
    before = json.loads((project.path / "b.json").read_text())["tests"]
    earlier_report(project)
    project.writes()
    args = ("--nobreak-all", "--nobreak-baseline=b.json", "--nobreak-update-baseline")
    result = project.run(*args, "--nobreak-json=r.json", "-x", xdist=True)
    assert result.ret != 0
    assert sorted(project.writes()) == ["controller b.json", "controller r.json"]
    assert_no_traceback(result)

    after = load_baseline(project.path / "b.json")
    assert after is not None
    entries = {nodeid: figures.as_dict() for nodeid, figures in after.entries.items()}
    assert set(entries) == set(before)
    for nodeid, figures in entries.items():
        assert figures in (before[nodeid], true[nodeid]), nodeid
    tests = project.read_json("r.json")["tests"]
    assert "gone.py::t" not in tests  # the earlier report's
    failed = [nodeid for nodeid, entry in tests.items() if entry["outcome"] == "failed"]
    assert failed  # the test that stopped the run is in the report...
    for nodeid in failed:  # ...and, having run to its end, in the baseline
        assert entries[nodeid] == true[nodeid]


def test_a_broken_baseline_stops_an_xdist_run_with_one_line(project: Project) -> None:
    (project.path / "b.json").write_text('{"version": 1, "torch": "2.13.0", "tests": {\n')
    result = project.run("--nobreak-baseline=b.json", "--nobreak-update-baseline", xdist=True)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in (result.stdout.lines + result.stderr.lines) if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("ERROR: baseline file b.json: is not valid JSON: ")
    assert (project.path / "b.json").read_text() == '{"version": 1, "torch": "2.13.0", "tests": {\n'
    assert project.writes() == []


def test_bad_markers_are_a_usage_error_under_xdist_too(pytester: pytest.Pytester) -> None:
    """A worker cannot stop the session (xdist would print an INTERNALERROR): the workers run
    nothing and the controller exits 4 with the serial run's lines, each bad marker once."""
    pytester.makepyfile(
        test_bad="""
        import pytest

        @pytest.mark.no_graph_break(max_recompile=1)
        def test_typo():
            pass

        def test_fine():
            pass

        @pytest.mark.no_graph_break(allow_host_fallback="yes")
        def test_wrong_type():
            pass
        """
    )
    errors = [
        "ERROR: test_bad.py::test_typo: @pytest.mark.no_graph_break: unknown option "
        "'max_recompile' (did you mean 'max_recompiles'?); known options: max_recompiles, "
        "allow, allow_host_fallback, max_host_syncs, scope",
        "ERROR: test_bad.py::test_wrong_type: @pytest.mark.no_graph_break: allow_host_fallback "
        "must be True or False, got 'yes'",
    ]
    args = ("-p", "no:cacheprovider", "--nobreak-json", "r.json")
    serial = pytester.runpytest(*args)
    assert serial.ret == pytest.ExitCode.USAGE_ERROR
    assert [line for line in serial.stderr.lines if line.strip()] == errors
    parallel = pytester.runpytest_subprocess(*args, *UNUSED_PLUGINS, "-n", "2")
    assert parallel.ret == pytest.ExitCode.USAGE_ERROR
    assert [line for line in parallel.stdout.lines if line.startswith("ERROR")] == errors
    parallel.stdout.fnmatch_lines(["2 workers [0 items]", "*no tests ran in *"])
    assert "test_bad.py::test_typo" not in parallel.stdout.str().replace(errors[0], "")
    assert "INTERNALERROR" not in parallel.stdout.str() + parallel.stderr.str()
    assert not (pytester.path / "r.json").exists()  # nothing ran: no report


def test_an_xdist_run_without_watched_tests_writes_an_empty_report_once(
    pytester: pytest.Pytester,
) -> None:
    """The report is written whatever ran, by the controller only; the workers, which run the
    tests, never touch it."""
    pytester.makepyfile(test_plain="def test_a(): pass\ndef test_b(): pass\n", conftest=CONFTEST)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", *UNUSED_PLUGINS, "-n", "2", "--nobreak-json", "r.json"
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(["nobreak: JSON report written to r.json"])
    assert (pytester.path / "writes.log").read_text() == "controller r.json\n"
    assert json.loads((pytester.path / "r.json").read_text())["tests"] == {}
