"""The baseline gate as a new user meets it: record, pass, regress, improve, update, strict.

Each case runs real inner pytest sessions (pytester, in-process) over ``models.py`` from
``conftest.py`` and a test file whose behaviour is switched by ``$NB_MODE``, as a code change
between two CI runs would switch it. The environment is shared with in-process runs, so
``monkeypatch.setenv`` reaches the inner session.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable

import pytest

from asic_backend import SIM_VERSION
from pytest_nobreak.gate.baseline import Baseline, dump_baseline
from pytest_nobreak.watch.events import Figures
from tests.plugin.conftest import Models

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

FLOW = '''
import os

import pytest
import torch

import models as M

MODE = os.environ.get("NB_MODE", "base")


@pytest.mark.no_graph_break
def test_clean(nobreak_compile):
    nobreak_compile(M.MLP(), backend="eager")(torch.randn(2, 8))


def test_unmarked(nobreak_compile):
    """Watched because it uses the fixture; its breaks never fail it, only the baseline can."""
    fn = M.data_dependent if MODE == "regress" else M.clean
    nobreak_compile(fn, backend="eager")(torch.ones(3))


@pytest.mark.no_graph_break(allow=[r"GB0170"])
def test_allowed():
    if MODE != "improve":
        torch.compile(M.data_dependent, backend="eager")(torch.ones(3))
    else:
        torch.compile(M.clean, backend="eager")(torch.ones(3))
    if MODE == "regress":  # a second tolerated break: the marker is happy, the baseline is not
        torch.compile(M.Inner(), backend="eager")(torch.randn(2, 4))


@pytest.mark.no_graph_break  # recompiles are reported, not gated, by the marker's default
def test_recompiles(nobreak_compile):
    f = nobreak_compile(M.clean, backend="eager", dynamic=False)
    f(torch.ones(3))
    if MODE == "regress":
        f(torch.ones(3, dtype=torch.float64))


def test_partial(nobreak_compile):
    nobreak_compile(M.clean, backend="eager")(torch.ones(3))
    if MODE == "partial":
        raise RuntimeError("the test broke off before its second model")
    nobreak_compile(M.MLP(), backend="eager")(torch.randn(2, 8))


if MODE == "new":

    def test_new(nobreak_compile):
        nobreak_compile(M.clean, backend="eager")(torch.ones(3))
'''

TESTS = ("test_allowed", "test_clean", "test_partial", "test_recompiles", "test_unmarked")
# The figures of the base mode, as a recorded file must hold them.
BASE = {
    "test_allowed": {
        "graphs": 2,
        "graph_breaks": 1,
        "eager_frames": 0,
        "recompiles": 0,
        "host_syncs": 0,
        "foreign_breaks": 0,
    },
    "test_clean": {
        "graphs": 1,
        "graph_breaks": 0,
        "eager_frames": 0,
        "recompiles": 0,
        "host_syncs": 0,
        "foreign_breaks": 0,
    },
    "test_partial": {
        "graphs": 2,
        "graph_breaks": 0,
        "eager_frames": 0,
        "recompiles": 0,
        "host_syncs": 0,
        "foreign_breaks": 0,
    },
    "test_recompiles": {
        "graphs": 1,
        "graph_breaks": 0,
        "eager_frames": 0,
        "recompiles": 0,
        "host_syncs": 0,
        "foreign_breaks": 0,
    },
    "test_unmarked": {
        "graphs": 1,
        "graph_breaks": 0,
        "eager_frames": 0,
        "recompiles": 0,
        "host_syncs": 0,
        "foreign_breaks": 0,
    },
}
UPDATE = "--nobreak-update-baseline"


@pytest.fixture(autouse=True)
def _no_ci_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The outer run may itself be on CI: strict mode and GitHub output must be chosen here."""
    for name in ("CI", "GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "NB_MODE"):
        monkeypatch.delenv(name, raising=False)


class Flow:
    def __init__(self, models: Models, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pytester = models.pytester
        self.monkeypatch = monkeypatch
        self.pytester.makepyfile(test_flow=FLOW)
        self.baseline = self.pytester.path / "b.json"

    def run(self, *args: str, mode: str = "base", ci: str | None = None) -> pytest.RunResult:
        self.monkeypatch.setenv("NB_MODE", mode)
        if ci is None:
            self.monkeypatch.delenv("CI", raising=False)
        else:
            self.monkeypatch.setenv("CI", ci)
        return self.pytester.runpytest(
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::pytest.PytestAssertRewriteWarning",
            "--nobreak-baseline",
            "b.json",
            *args,
        )

    def entries(self) -> dict[str, dict[str, int]]:
        tests: dict[str, dict[str, int]] = json.loads(self.baseline.read_text())["tests"]
        return tests


@pytest.fixture
def flow(models: Models, monkeypatch: pytest.MonkeyPatch) -> Flow:
    return Flow(models, monkeypatch)


def output(result: pytest.RunResult) -> str:
    return result.stdout.str() + "\n" + result.stderr.str()


def assert_no_traceback(result: pytest.RunResult) -> None:
    text = output(result)
    for word in ("Traceback", "INTERNALERROR", 'File "'):
        assert word not in text, text


def torch_release() -> str:
    import torch

    return str(torch.__version__).split("+", 1)[0]


def matches(text: str, pattern: str) -> bool:
    """fnmatch with ``*`` only: the messages hold ``[`` and ``]`` literally."""
    return fnmatch.fnmatchcase(text, pattern.replace("[", "[[]"))


def test_record_pass_regress_improve(flow: Flow) -> None:
    """The story of the issue, on one baseline file that no step but the first writes."""
    # Record: sorted JSON, integers only, a header naming torch and the simulator.
    result = flow.run(UPDATE)
    assert result.ret == 0
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            "*- nobreak compile report -*",
            "recorded   test_flow.py::test_allowed  new entry",
            "baseline updated: rewrote the 5 tests that ran, kept the others",
        ]
    )
    text = flow.baseline.read_text()
    document = json.loads(text)
    assert text == json.dumps(document, sort_keys=True, indent=2) + "\n"
    assert set(document) == {"version", "torch", "asic_sim", "tests"}
    assert document["version"] == 1
    assert document["torch"] == torch_release()
    assert document["asic_sim"] == SIM_VERSION
    assert document["tests"] == {f"test_flow.py::{name}": BASE[name] for name in TESTS}
    assert text == recorded_text()  # the shortcut the other cases take is the real thing

    # Pass: exit 0 and not a word from the plugin (the tolerated break is in the baseline).
    result = flow.run()
    assert result.ret == 0
    result.assert_outcomes(passed=5)
    assert "nobreak compile report" not in result.stdout.str()
    assert "warnings summary" not in result.stdout.str()
    assert flow.baseline.read_text() == text

    # Regress: the tests still pass, the run fails, naming test, figure, baseline -> now.
    result = flow.run("--color=yes", mode="regress")
    assert result.ret == 1
    result.assert_outcomes(passed=5)  # the unmarked test's break: reported, not a warning
    red = "\x1b[31m"
    for line in (
        "REGRESSION test_flow.py::test_allowed  graphs 2 -> 4",
        "REGRESSION test_flow.py::test_allowed  graph_breaks 1 -> 2",
        "REGRESSION test_flow.py::test_recompiles  recompiles 0 -> 1",
        "REGRESSION test_flow.py::test_unmarked  graphs 1 -> 2",
        "REGRESSION test_flow.py::test_unmarked  graph_breaks 0 -> 1",
    ):
        assert red + line in result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "if this is intended, run pytest --nobreak-baseline b.json --nobreak-update-baseline"
            " to accept (rewrites only the tests that ran)"
        ]
    )
    assert "test_clean" not in result.stdout.str().split("nobreak compile report")[1]
    assert_no_traceback(result)
    assert flow.baseline.read_text() == text

    # Improve: passes, in green, with the command that ratchets the baseline down.
    result = flow.run("--color=yes", mode="improve")
    assert result.ret == 0
    green = "\x1b[32m"
    assert green + "improved   test_flow.py::test_allowed  graphs 2 -> 1" in result.stdout.str()
    assert green + "improved   test_flow.py::test_allowed  graph_breaks 1 -> 0" in (
        result.stdout.str()
    )
    result.stdout.fnmatch_lines(
        [
            "run pytest --nobreak-baseline b.json --nobreak-update-baseline to ratchet the "
            "baseline down (rewrites only the tests that ran)"
        ]
    )
    assert "REGRESSION" not in result.stdout.str()
    assert flow.baseline.read_text() == text


def test_update_rewrites_only_the_tests_that_ran(flow: Flow) -> None:
    flow.baseline.write_text(recorded_text())
    result = flow.run("-k", "test_unmarked or test_recompiles", UPDATE, mode="regress")
    assert result.ret == 0  # accepting is not failing
    result.stdout.fnmatch_lines(
        [
            "accepted   test_flow.py::test_recompiles  recompiles 0 -> 1",
            "accepted   test_flow.py::test_unmarked  graphs 1 -> 2",
            "accepted   test_flow.py::test_unmarked  graph_breaks 0 -> 1",
            "baseline updated: rewrote the 2 tests that ran, kept the others",
        ]
    )
    expected = {f"test_flow.py::{name}": dict(BASE[name]) for name in TESTS}
    # A recompile of the same code into the same ops is the same graph, run again.
    expected["test_flow.py::test_recompiles"].update(recompiles=1)
    expected["test_flow.py::test_unmarked"].update(graphs=2, graph_breaks=1)
    assert flow.entries() == expected

    # The accepted figures are the new baseline: the same regressed code now passes quietly.
    result = flow.run("-k", "test_unmarked or test_recompiles", mode="regress")
    assert result.ret == 0
    assert "REGRESSION" not in result.stdout.str()


def test_a_test_that_broke_off_keeps_its_entry(flow: Flow) -> None:
    """Its figures are partial (one model of two): neither an improvement nor a new entry."""
    flow.baseline.write_text(recorded_text())
    before = flow.entries()
    result = flow.run(UPDATE, mode="partial")
    assert result.ret == 1
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["baseline updated: rewrote the 4 tests that ran, kept the others"])
    assert flow.entries() == before

    result = flow.run(mode="partial")
    assert result.ret == 1  # the test's own failure, nothing from the gate
    assert "improved" not in result.stdout.str()


@pytest.mark.parametrize(
    ("args", "ci", "ret", "line"),
    [
        ((), None, 0, "missing    test_flow.py::test_new  not in the baseline"),
        (("--nobreak-strict",), None, 1, "MISSING    test_flow.py::test_new  *(strict)"),
        ((), "true", 1, "MISSING    test_flow.py::test_new  *(strict)"),
        (("--no-nobreak-strict",), "true", 0, "missing    test_flow.py::test_new  not in *"),
    ],
    ids=["warn", "strict", "ci-is-strict", "ci-overridden"],
)
def test_a_new_test_and_strict_mode(
    flow: Flow, args: tuple[str, ...], ci: str | None, ret: int, line: str
) -> None:
    flow.baseline.write_text(recorded_text())
    result = flow.run(*args, mode="new", ci=ci)
    assert result.ret == ret, result.stdout.str()
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines([line])
    assert_no_traceback(result)
    assert flow.baseline.read_text() == recorded_text()


def test_no_baseline_file_yet_is_one_line(flow: Flow) -> None:
    """A first CI run before anyone recorded: one line with the command, not one per test."""
    result = flow.run(ci="true")
    assert result.ret == 1
    lines = [line for line in result.stdout.lines if line.startswith("nobreak: no baseline")]
    assert lines == [
        "nobreak: no baseline file b.json yet (strict: the run fails); record it with "
        "pytest --nobreak-baseline b.json --nobreak-update-baseline"
    ]
    assert "MISSING" not in result.stdout.str()
    assert not flow.baseline.exists()


def recorded_text(torch: str | None = None) -> str:
    """What recording the base mode writes, built directly, so most cases need no recording run."""
    entries = {f"test_flow.py::{name}": Figures(**BASE[name]) for name in TESTS}
    return dump_baseline(
        Baseline(torch=torch or torch_release(), asic_sim=SIM_VERSION, entries=entries)
    )


def test_another_torch_release_warns_instead_of_failing(flow: Flow) -> None:
    flow.baseline.write_text(recorded_text(torch="2.12.0"))
    result = flow.run(mode="regress")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            f"baseline was recorded with torch 2.12.0 (this run: {torch_release()}): "
            "regressions are warnings until it is re-recorded with pytest --nobreak-baseline "
            "b.json --nobreak-update-baseline",
            "regression test_flow.py::test_allowed  graphs 2 -> 4",
        ]
    )
    assert "REGRESSION" not in result.stdout.str()

    # A local build tag is the same release: no warning, and regressions fail again.
    flow.baseline.write_text(recorded_text(torch=torch_release() + "+cu126"))
    result = flow.run(mode="regress")
    assert result.ret == 1
    assert "baseline was recorded with" not in result.stdout.str()


def _set_graphs(text: str, value: str) -> str:
    return text.replace('"graphs": 2', f'"graphs": {value}', 1)


CORRUPTIONS: dict[str, tuple[Callable[[str], str], str]] = {
    "invalid-json": (lambda t: t[: len(t) // 2], "is not valid JSON: *"),
    "float": (lambda t: _set_graphs(t, "1.5"), '*figure "graphs" is 1.5, not an integer >= 0*'),
    "negative": (lambda t: _set_graphs(t, "-1"), '*figure "graphs" is -1, not an integer >= 0*'),
    "unknown-figure": (
        lambda t: t.replace('"graphs"', '"grafs"', 1),
        '*has an unknown figure "grafs" (known: graphs, *',
    ),
    "wrong-version": (
        lambda t: t.replace('"version": 1', '"version": 2'),
        "is version 2, this pytest-nobreak reads version 1; upgrade pytest-nobreak*",
    ),
    "merge-conflict": (
        lambda t: t.replace('  "tests": {', '<<<<<<< HEAD\n  "tests": {', 1).replace(
            '  "torch"', '=======\n>>>>>>> theirs\n  "torch"', 1
        ),
        "contains a git merge conflict marker at line 3*",
    ),
}


@pytest.mark.parametrize("update", [False, True], ids=["check", "update"])
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_broken_baseline_is_one_line_and_stays_untouched(
    flow: Flow, corruption: str, update: bool
) -> None:
    breaks, problem = CORRUPTIONS[corruption]
    broken = breaks(recorded_text())
    assert broken != recorded_text()
    flow.baseline.write_bytes(broken.encode())
    result = flow.run(*([UPDATE] if update else []))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in output(result).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert matches(
        lines[0],
        f"ERROR: baseline file b.json: {problem}; fix or restore the file, or delete it and "
        "re-record with pytest --nobreak-baseline b.json --nobreak-update-baseline",
    ), lines[0]
    assert flow.baseline.read_bytes() == broken.encode()


def test_a_directory_as_the_baseline_path(flow: Flow) -> None:
    flow.pytester.mkdir("b.json")  # a directory where the file should be
    result = flow.run(UPDATE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in output(result).splitlines() if line.strip()]
    assert lines == [
        "ERROR: baseline file b.json: cannot be read (Is a directory); fix or restore the file, "
        "or delete it and re-record with pytest --nobreak-baseline b.json "
        "--nobreak-update-baseline"
    ]
    assert flow.baseline.is_dir()


# ---------------------------------------------------------------------- host MACs

HOST_FLOW = """
import os

import pytest
import torch
from torch import nn

MODE = os.environ.get("NB_MODE", "base")


@pytest.mark.no_graph_break(allow_host_fallback=True)
def test_head(nobreak_compile):
    # base: the head runs on the DUT; "host": float64, on the host; "wider": on the host, with
    # a batch twice as large (the same ops, only more host MACs).
    dtype = torch.float32 if MODE == "base" else torch.float64
    batch = 4 if MODE == "wider" else 2
    model = nn.Linear(8, 4).to(dtype)
    with torch.no_grad():
        nobreak_compile(model)(torch.randn(batch, 8, dtype=dtype))
"""
HEAD = "test_host_flow.py::test_head"


def host_flow(flow: Flow, *args: str, mode: str = "base") -> pytest.RunResult:
    flow.pytester.makepyfile(test_host_flow=HOST_FLOW)
    return flow.run("test_host_flow.py", "--asic-backend", *args, mode=mode)


def test_a_rise_of_host_macs_is_a_regression(flow: Flow) -> None:
    """Work that moves off the DUT fails CI; so does a host op that grows while every other
    figure, host fallbacks included, stays the same."""
    assert host_flow(flow, UPDATE).ret == 0
    assert flow.entries()[HEAD]["host_macs"] == 0
    assert flow.entries()[HEAD]["macs"] == 2 * 8 * 4

    result = host_flow(flow, mode="host")
    assert result.ret == 1
    changes = [line for line in result.stdout.lines if line.startswith(("REGRESSION", "improved"))]
    assert [re.sub(r"cycles \d+ ", "cycles N ", line) for line in changes] == [
        f"REGRESSION {HEAD}  dut_ops 1 -> 0",
        f"REGRESSION {HEAD}  host_fallbacks 0 -> 1",
        f"REGRESSION {HEAD}  macs {2 * 8 * 4} -> 0",
        f"REGRESSION {HEAD}  host_macs 0 -> {2 * 8 * 4}",
        f"improved   {HEAD}  cycles N -> 0",
    ]

    # Back onto the DUT: every figure improves, its cycles too (the DUT does more work).
    assert host_flow(flow, UPDATE, mode="host").ret == 0
    result = host_flow(flow)
    assert result.ret == 0, result.stdout.str()
    assert not [line for line in result.stdout.lines if line.startswith("REGRESSION")]
    assert any(line.startswith(f"improved   {HEAD}  cycles 0 -> ") for line in result.stdout.lines)

    assert host_flow(flow, UPDATE, mode="host").ret == 0
    result = host_flow(flow, mode="wider")
    assert result.ret == 1
    regressions = [line for line in result.stdout.lines if line.startswith("REGRESSION")]
    assert regressions == [f"REGRESSION {HEAD}  host_macs {2 * 8 * 4} -> {4 * 8 * 4}"]


def test_a_baseline_from_before_host_macs_still_gates(flow: Flow) -> None:
    """An entry recorded before host_macs existed has the four other ASIC figures: it loads, its
    host_macs is not measured (not 0, which would make every host fallback a regression), its
    other figures still gate, and the next update records host_macs."""
    assert host_flow(flow, UPDATE, mode="host").ret == 0
    recorded = json.loads(flow.baseline.read_text())
    assert recorded["tests"][HEAD]["host_macs"] == 2 * 8 * 4
    del recorded["tests"][HEAD]["host_macs"]
    old = json.dumps(recorded, sort_keys=True, indent=2) + "\n"
    flow.baseline.write_text(old)

    result = host_flow(flow, mode="host")
    assert result.ret == 0, result.stdout.str()
    assert "nobreak compile report" not in result.stdout.str()
    assert flow.baseline.read_text() == old

    result = host_flow(flow, mode="base")  # the figures it has still compare: all improved
    assert result.ret == 0
    changes = [line for line in result.stdout.lines if line.startswith(("REGRESSION", "improved"))]
    assert [re.sub(r"-> \d+$", "-> N", line) for line in changes] == [
        f"improved   {HEAD}  dut_ops 0 -> N",
        f"improved   {HEAD}  host_fallbacks 1 -> N",
        f"improved   {HEAD}  macs 0 -> N",
        f"improved   {HEAD}  cycles 0 -> N",
    ]

    assert host_flow(flow, UPDATE, mode="host").ret == 0
    assert flow.entries()[HEAD]["host_macs"] == 2 * 8 * 4
