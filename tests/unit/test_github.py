"""GitHub Actions annotations and step summary.

`github.annotations` is called through the module: a bare `annotations` name would clash with
`from __future__ import annotations`.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pytest_nobreak.gate.baseline import Baseline, Comparison, compare
from pytest_nobreak.report import github
from pytest_nobreak.report.github import emit, step_summary_markdown
from pytest_nobreak.report.json_report import TestRecord
from pytest_nobreak.watch.events import BreakEvent, Figures

WS = "/home/runner/work/proj/proj"
SEED = BreakEvent(
    kind="backend_error",
    gb_type="Backend compiler exception",
    gb_id="GB0219",
    file=f"{WS}/src/models.py",
    line=12,
    reason="dut_matmul_sync read a scalar: 100% eager",
)


def record(
    nodeid: str,
    *,
    outcome: str = "passed",
    marked: bool = True,
    breaks: tuple[BreakEvent, ...] = (),
    figures: Figures | None = None,
) -> TestRecord:
    return TestRecord(nodeid, outcome, marked, figures or Figures(graphs=1), breaks)


def comparison(
    baseline: dict[str, Figures],
    results: dict[str, Figures],
    *,
    strict: bool = False,
    baseline_torch: str = "2.13.0",
) -> Comparison:
    return compare(
        Baseline(torch=baseline_torch, asic_sim=None, entries=baseline),
        results,
        strict=strict,
        torch="2.13.0",
        asic_sim=None,
    )


def test_a_break_is_annotated_at_the_model_line_relative_to_the_workspace() -> None:
    lines = github.workflow_commands(
        [record("tests/test_m.py::test_seed", outcome="failed", breaks=(SEED,))], WS
    )
    assert lines == [
        "::error file=src/models.py,line=12,"
        "title=backend error GB0219%3A Backend compiler exception"
        "::dut_matmul_sync read a scalar: 100%25 eager%0Ain tests/test_m.py::test_seed"
    ]


def test_an_unmarked_tests_break_is_a_warning_unless_it_fails_the_run() -> None:
    """Only observed: a warning. With ``--nobreak-unmarked fail`` it fails the run: an error.
    A compile error the unmarked test handled is no annotation at all."""
    rejected = BreakEvent(kind="compile_error", gb_type="Data-dependent branching", gb_id="GB0170")
    records = [record("t.py::test_u", marked=False, breaks=(SEED, rejected))]
    observed = github.workflow_commands(records, WS)
    assert [line.split(" ", 1)[0] for line in observed] == ["::warning"]
    assert "GB0219" in observed[0]
    failing = github.workflow_commands(records, WS, fail_unmarked=True)
    assert [line.split(" ", 1)[0] for line in failing] == ["::error"]
    summary = step_summary_markdown(records, None)
    assert "1 watched tests, 1 with graph breaks or eager fallbacks." in summary
    only_rejected = [record("t.py::test_r", marked=False, breaks=(rejected,))]
    assert github.workflow_commands(only_rejected, WS, fail_unmarked=True) == []
    assert "0 with graph breaks" in step_summary_markdown(only_rejected, None)


def test_a_host_fallback_is_titled_by_its_op() -> None:
    host = BreakEvent(
        kind="host_fallback",
        gb_type="Host fallback: conv2d",
        file=f"{WS}/src/models.py",
        line=14,
        reason="torch.float64 operands",
        calls=3,
        macs=884736,
    )
    lines = github.workflow_commands([record("t.py::test_x", breaks=(host,))], WS)
    assert lines == [
        "::warning file=src/models.py,line=14,title=host fallback%3A conv2d"
        "::torch.float64 operands%0Ain t.py::test_x"
    ]


@pytest.mark.parametrize(
    ("marked", "outcome", "level"),
    [(True, "failed", "error"), (True, "passed", "warning"), (False, "passed", "warning")],
)
def test_only_a_break_that_failed_a_marked_test_is_an_error(
    marked: bool, outcome: str, level: str
) -> None:
    [line] = github.workflow_commands(
        [record("t", marked=marked, outcome=outcome, breaks=(SEED,))], WS
    )
    assert line.startswith(f"::{level} ")


def test_escaping_of_messages_and_properties() -> None:
    event = BreakEvent(
        kind="graph_break", gb_type="a, b: c", file=f"{WS}/odd,name:x.py", line=3, reason="50%\r\nx"
    )
    [line] = github.workflow_commands([record("t", breaks=(event,))], WS)
    assert line == (
        "::warning file=odd%2Cname%3Ax.py,line=3,title=graph break%3A a%2C b%3A c"
        "::50%25%0D%0Ax%0Ain t"
    )


def test_paths_outside_the_workspace_or_without_a_workspace_stay_as_they_are() -> None:
    outside = BreakEvent(kind="graph_break", gb_type="x", file="/usr/lib/torch/nn.py", line=1)
    assert (
        "file=/usr/lib/torch/nn.py,"
        in github.workflow_commands([record("t", breaks=(outside,))], WS)[0]
    )
    assert (
        f"file={WS}/src/models.py,"
        in github.workflow_commands([record("t", breaks=(SEED,))], None)[0]
    )


def test_a_break_without_a_location_has_no_file_property() -> None:
    event = BreakEvent(kind="eager_fallback", gb_type="skipped frame")
    [line] = github.workflow_commands([record("t", breaks=(event,))], WS)
    assert line == "::warning title=eager fallback%3A skipped frame::skipped frame%0Ain t"


def test_the_same_break_in_many_tests_is_one_annotation_and_an_error_wins() -> None:
    records = [record(f"t{i}", marked=False, breaks=(SEED,)) for i in range(7)]
    records.append(record("t9", outcome="failed", breaks=(SEED,)))
    [line] = github.workflow_commands(records, WS)
    assert line.startswith("::error file=src/models.py,line=12,")
    assert line.endswith("%0Ain 8 tests: t0, t1, t2, t3, t4 and 3 more")


def test_distinct_breaks_are_sorted_by_file_and_line() -> None:
    def at(line: int) -> BreakEvent:
        return BreakEvent(kind="graph_break", gb_type="x", file=f"{WS}/m.py", line=line)

    lines = github.workflow_commands([record("t", breaks=(at(10), at(9), at(100)))], WS)
    assert [line.split(",")[1] for line in lines] == ["line=9", "line=10", "line=100"]


def test_baseline_drift_that_fails_is_an_error_with_every_moved_figure() -> None:
    drift = comparison(
        {"tests/test_m.py::test_a": Figures(graphs=1)},
        {"tests/test_m.py::test_a": Figures(graphs=2, graph_breaks=1)},
    )
    assert github.workflow_commands([], WS, drift, rootdir=WS) == [
        "::error file=tests/test_m.py,title=nobreak regression"
        "::tests/test_m.py::test_a: graphs 1 -> 2, graph_breaks 0 -> 1"
    ]


def test_baseline_drift_that_does_not_fail_is_a_warning() -> None:
    drift = comparison(
        {"t.py::a": Figures(graphs=1)}, {"t.py::a": Figures(graphs=2)}, baseline_torch="2.12.0"
    )
    lines = github.workflow_commands([], WS, drift)
    assert [line.split(" ", 1)[0] for line in lines] == ["::warning", "::warning"]
    assert "torch 2.12.0 (this run%3A 2.13.0)" not in lines[0]  # data part: colons stay
    assert "torch 2.12.0 (this run: 2.13.0)" in lines[0]


@pytest.mark.parametrize(("strict", "level"), [(True, "::error"), (False, "::warning")])
def test_a_missing_test_is_an_error_only_under_strict(strict: bool, level: str) -> None:
    drift = comparison({}, {"t.py::new": Figures(graphs=1)}, strict=strict)
    [line] = github.workflow_commands([], WS, drift)
    assert line.startswith(f"{level} file=t.py,title=not in the nobreak baseline::t.py::new ")


def test_step_summary_table() -> None:
    a, b, c = "tests/t.py::a", "tests/t.py::b[x|y]", "tests/t.py::c"
    asic = Figures(graphs=1, dut_ops=1, host_fallbacks=1, macs=32, host_macs=32, cycles=900)
    records = [
        record(b, figures=Figures(graphs=2, graph_breaks=1), breaks=(SEED,), outcome="failed"),
        record(a, figures=asic),
        record(c),
    ]
    drift = comparison(
        {
            a: Figures(graphs=1, dut_ops=2, host_fallbacks=0, macs=64, host_macs=0, cycles=1200),
            b: Figures(graphs=1),
        },
        {r.nodeid: r.figures for r in records},
    )
    text = step_summary_markdown(records, drift)
    assert text.startswith("### pytest-nobreak\n")
    assert "3 watched tests, 1 with graph breaks or eager fallbacks." in text
    assert "Baseline: 6 regressed figures, 1 improved, 1 tests missing." in text
    rows = text.splitlines()[-5:]
    assert rows == [
        "| test | graphs | breaks | eager | recompiles | syncs | dut_ops | macs | host_macs "
        "| cycles | status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        # Half the work moved to the host: fewer DUT ops and MACs and more host MACs are
        # regressions (bold), fewer cycles are not. Host syncs were not measured: "–".
        "| `tests/t.py::a` | 1 | 0 | 0 | 0 | – | **2 → 1** | **64 → 32** | **0 → 32** "
        "| 1200 → 900 | regressed |",
        "| `tests/t.py::b[x\\|y]` | **1 → 2** | **0 → 1** | 0 | 0 | – | – | – | – | – "
        "| failed, regressed |",
        "| `tests/t.py::c` | 1 | 0 | 0 | 0 | – | – | – | – | – | not in baseline |",
    ]


def test_step_summary_without_a_baseline() -> None:
    text = step_summary_markdown([record("t")], None)
    assert "Baseline" not in text
    assert text.endswith("| `t` | 1 | 0 | 0 | 0 | – | – | – | – | – | passed |\n")


def test_a_long_summary_lists_only_the_tests_with_something_to_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(github, "MAX_ROWS", 3)
    records = [record(f"t{i:02}") for i in range(10)] + [record("z", outcome="failed")]
    text = step_summary_markdown(records, None)
    assert "| `z` |" in text
    assert "| `t00` |" not in text
    assert text.endswith("10 more tests not listed; the JSON report has every test.\n")


def test_emit_outside_github_actions_writes_nothing() -> None:
    stream = io.StringIO()
    assert emit([record("t", breaks=(SEED,))], None, {}, stream=stream) == []
    assert stream.getvalue() == ""


def test_emit_on_github_actions(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    env = {"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": WS, "GITHUB_STEP_SUMMARY": str(summary)}
    stream = io.StringIO()
    records = [record("t", outcome="failed", breaks=(SEED,))]
    assert emit(records, None, env, stream=stream) == []
    assert stream.getvalue().startswith("::error file=src/models.py,line=12,")
    assert summary.read_text() == "earlier step\n" + step_summary_markdown(records, None) + "\n"


def test_emit_reports_an_unwritable_summary_instead_of_raising(tmp_path: Path) -> None:
    stream = io.StringIO()
    problems = emit([record("t")], None, {"GITHUB_STEP_SUMMARY": str(tmp_path)}, stream=stream)
    [problem] = problems
    assert problem.startswith(f"could not append to GITHUB_STEP_SUMMARY {tmp_path}: ")
    assert stream.getvalue() == ""
