"""Host syncs (issue 20) in every report: the JSON report, the baseline, JUnit, GitHub, the
terminal table, pytest-html's columns, the shard merge and the zoo table.

Built from constructed records: no compile. ``host_syncs`` (a core figure) and the ASIC's
``syncs`` came after the first release, so each report also reads and shows a file from before
them, where they are "not measured" (``None``), never 0.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_nobreak.gate.baseline import (
    Baseline,
    BaselineError,
    Change,
    compare,
    dump_baseline,
    load_baseline,
    updated,
    write_baseline,
)
from pytest_nobreak.gate.shards import baseline_of, merge_shards
from pytest_nobreak.report import github
from pytest_nobreak.report.controller import SessionReporter, figures_table
from pytest_nobreak.report.html_columns import COLUMNS, HtmlColumns
from pytest_nobreak.report.json_report import (
    TestRecord,
    build_report,
    dump_report,
    merge_files,
    merge_report,
    write_report,
)
from pytest_nobreak.report.junit import junit_properties
from pytest_nobreak.report.zoo import render_zoo, rows_of
from pytest_nobreak.watch.events import BreakEvent, CallSite, Figures
from pytest_nobreak.watch.render import KIND_LABELS, event_line

A = "tests/test_m.py::test_a"
B = "tests/test_m.py::test_b"

#: How the one-line listings (table, JUnit) name a host sync.
SYNC = KIND_LABELS["host_sync"]
ITEM = BreakEvent(
    kind="host_sync",
    gb_type="Tensor.item",
    file="models.py",
    line=12,
    source="s = h.abs().max().item()",
    reason="the host reads a device value to decide what comes next (a data-dependent scalar)",
    calls=3,
    detail="data-dependent scalar",
    call_sites=(CallSite("tests/test_m.py", 9, "model(x)"),),
)
MASK = BreakEvent(
    kind="host_sync",
    gb_type="boolean mask indexing",
    file="models.py",
    line=20,
    reason="the output's shape depends on the data (a boolean mask)",
    calls=1,
    detail="data-dependent shape",
)
#: A test on the ASIC whose compiled graph synced three times (the DUT stalled each time).
SYNCED = TestRecord(
    nodeid=A,
    outcome="failed",
    marked=True,
    figures=Figures(
        graphs=1,
        host_syncs=3,
        dut_ops=2,
        host_fallbacks=0,
        macs=64,
        host_macs=0,
        cycles=900,
        syncs=3,
    ),
    breaks=(ITEM,),
)
#: The same test as a report written before host syncs were counted.
OLD = TestRecord(
    nodeid=A,
    outcome="passed",
    marked=True,
    figures=Figures(graphs=1, dut_ops=2, host_fallbacks=0, macs=64, host_macs=0, cycles=600),
)


def shipped(record: TestRecord) -> dict[str, Any]:
    return json.loads(json.dumps(record.to_json()))


# ----------------------------------------------------------------------------- JSON report


def test_the_json_entry_carries_host_syncs_the_asic_syncs_and_the_sync_event() -> None:
    entry = SYNCED.to_json()
    assert {k: entry[k] for k in ("graphs", "graph_breaks", "recompiles", "host_syncs")} == {
        "graphs": 1,
        "graph_breaks": 0,
        "recompiles": 0,
        "host_syncs": 3,
    }
    assert entry["asic"] == {
        "dut_ops": 2,
        "host_fallbacks": 0,
        "macs": 64,
        "host_macs": 0,
        "cycles": 900,
        "syncs": 3,
    }
    [event] = entry["breaks"]
    assert {k: v for k, v in event.items() if k not in ("fix", "call_sites", "source")} == {
        "kind": "host_sync",
        "gb_id": None,
        "gb_type": "Tensor.item",
        "file": "models.py",
        "line": 12,
        "reason": ITEM.reason,
        "calls": 3,
        "detail": "data-dependent scalar",
        "owner": "own",
    }
    assert "macs" not in event  # a host sync does no multiply-accumulate work


def test_a_sync_record_survives_the_trip_from_a_worker() -> None:
    back = TestRecord.from_json(A, shipped(SYNCED))
    assert back == SYNCED
    assert back.figures.host_syncs == 3
    assert back.figures.syncs == 3
    assert (back.breaks[0].kind, back.breaks[0].calls, back.breaks[0].detail) == (
        "host_sync",
        3,
        "data-dependent scalar",
    )
    assert TestRecord.from_json(A, shipped(OLD)) == OLD


def test_a_record_from_before_host_syncs_reads_them_as_not_measured() -> None:
    data = shipped(SYNCED)
    del data["host_syncs"]
    del data["asic"]["syncs"]
    figures = TestRecord.from_json(A, data).figures
    assert (figures.host_syncs, figures.syncs) == (None, None)
    assert figures.cycles == 900
    # Written back without them, not as 0.
    again = TestRecord.from_json(A, data).to_json()
    assert "host_syncs" not in again
    assert "syncs" not in again["asic"]
    # An explicit null is "not measured" too.
    data["host_syncs"] = None
    assert TestRecord.from_json(A, data).figures.host_syncs is None


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(host_syncs=-1), "'host_syncs' must be an integer >= 0, not -1"),
        (lambda d: d.update(host_syncs="3"), "'host_syncs' must be an integer >= 0, not '3'"),
        (lambda d: d.update(host_syncs=1.5), "'host_syncs' must be an integer >= 0, not 1.5"),
        (lambda d: d.update(host_syncs=True), "'host_syncs' must be an integer >= 0, not True"),
        (lambda d: d["asic"].update(syncs=-2), "'syncs' must be an integer >= 0, not -2"),
        (lambda d: d["breaks"][0].update(calls=-1), "'calls' must be an integer >= 0, not -1"),
        (lambda d: d["breaks"][0].update(detail=7), "'detail' must be str, not 7"),
    ],
)
def test_a_bad_sync_figure_is_a_one_line_error(mutate: Any, expected: str) -> None:
    data = shipped(SYNCED)
    mutate(data)
    with pytest.raises(ValueError) as info:
        TestRecord.from_json(A, data)
    assert str(info.value) == f"record of {A!r}: {expected}"


def test_merging_an_old_report_with_a_new_one_keeps_both(tmp_path: Path) -> None:
    old = build_report("2.13.0", "asic", "default", [dataclasses.replace(OLD, nodeid=B)])
    new = build_report("2.13.0", "asic", "default", [SYNCED])
    merged = merge_report(old, new)
    assert "host_syncs" not in merged["tests"][B]
    assert merged["tests"][A]["host_syncs"] == 3
    write_report(tmp_path / "old.json", "2.13.0", "asic", "default", [OLD])
    write_report(tmp_path / "new.json", "2.13.0", "asic", "default", [SYNCED])
    out = tmp_path / "all.json"
    assert merge_files(out, [tmp_path / "old.json", tmp_path / "new.json"]) == 1
    assert json.loads(out.read_text())["tests"][A] == SYNCED.to_json()
    assert out.read_text() == dump_report(json.loads(out.read_text()))


# ----------------------------------------------------------------------------- baseline


def compared(before: Figures, after: Figures) -> Any:
    baseline = Baseline(torch="2.13.0", asic_sim="1", entries={A: before})
    return compare(baseline, {A: after}, strict=False, torch="2.13.0", asic_sim="1")


def test_an_old_baseline_without_host_syncs_loads_and_compares_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    old_entry = {"graphs": 1, "graph_breaks": 0, "eager_frames": 0, "recompiles": 0}
    old_asic = {**old_entry, "dut_ops": 2, "host_fallbacks": 0, "macs": 64, "host_macs": 0}
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "torch": "2.13.0",
                "asic_sim": "1",
                "tests": {A: {**old_asic, "cycles": 600}, B: old_entry},
            }
        )
    )
    loaded = load_baseline(path)
    assert loaded is not None
    assert (loaded.entries[A].host_syncs, loaded.entries[A].syncs) == (None, None)
    assert loaded.entries[B] == Figures(graphs=1)
    now = {A: SYNCED.figures, B: Figures(graphs=1, host_syncs=0)}
    result = compare(loaded, now, strict=True, torch="2.13.0", asic_sim="1")
    # The new figures are not compared with "nothing"; the others are (cycles 600 -> 900).
    assert result.regressions == (Change(A, "cycles", 600, 900),)
    assert result.improvements == ()
    assert result.render_lines()[0] == (f"REGRESSION {A}  cycles 600 -> 900", "red")
    # The update records them.
    written = json.loads(dump_baseline(updated(loaded, now, "2.13.0", "1")))["tests"]
    assert (written[A]["host_syncs"], written[A]["syncs"], written[B]["host_syncs"]) == (3, 3, 0)


def test_host_syncs_rising_is_a_regression() -> None:
    result = compared(Figures(graphs=1, host_syncs=0), Figures(graphs=1, host_syncs=3))
    assert result.regressions == (Change(A, "host_syncs", 0, 3),)
    assert result.failed
    assert result.render_lines() == [
        (f"REGRESSION {A}  host_syncs 0 -> 3", "red"),
        (
            "if this is intended, run pytest --nobreak-update-baseline to accept "
            "(rewrites only the tests that ran)",
            None,
        ),
    ]


def test_host_syncs_falling_is_reported_as_an_improvement() -> None:
    result = compared(Figures(graphs=1, host_syncs=3), Figures(graphs=1, host_syncs=1))
    assert result.improvements == (Change(A, "host_syncs", 3, 1),)
    assert not result.regressions
    assert not result.failed
    assert result.render_lines()[0] == (f"improved   {A}  host_syncs 3 -> 1", "green")
    assert "ratchet the baseline down" in result.render_lines()[-1][0]


def test_more_asic_syncs_regress_with_the_cycles_they_cost() -> None:
    before = dataclasses.replace(SYNCED.figures, host_syncs=1, syncs=1, cycles=700)
    result = compared(before, SYNCED.figures)
    assert result.regressions == (
        Change(A, "host_syncs", 1, 3),
        Change(A, "cycles", 700, 900),
        Change(A, "syncs", 1, 3),
    )


def test_a_figure_measured_on_one_side_only_is_not_compared() -> None:
    # A run from before host syncs (or a tool that did not count them) against a new entry.
    unmeasured = dataclasses.replace(SYNCED.figures, host_syncs=None, syncs=None)
    assert not compared(SYNCED.figures, unmeasured).changed
    assert not compared(unmeasured, SYNCED.figures).changed


def test_the_baseline_round_trips_the_sync_figures(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    baseline = Baseline(torch="2.13.0", asic_sim="1", entries={A: SYNCED.figures, B: OLD.figures})
    write_baseline(path, baseline)
    assert load_baseline(path) == baseline
    tests = json.loads(path.read_text())["tests"]
    assert (tests[A]["host_syncs"], tests[A]["syncs"]) == (3, 3)
    assert "host_syncs" not in tests[B]
    assert "syncs" not in tests[B]


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        ({"host_syncs": "3"}, f'test "{A}" figure "host_syncs" is "3", not an integer >= 0'),
        ({"host_syncs": None}, f'test "{A}" figure "host_syncs" is null, not an integer >= 0'),
        ({"host_syncs": -1}, f'test "{A}" figure "host_syncs" is -1, not an integer >= 0'),
        ({"syncs": 2}, f'test "{A}" has some ASIC figures but not dut_ops, host_fallbacks'),
    ],
)
def test_a_hand_edited_sync_figure_is_a_one_line_baseline_error(
    tmp_path: Path, figures: dict[str, Any], expected: str
) -> None:
    path = tmp_path / "b.json"
    entry = {"graphs": 1, "graph_breaks": 0, "eager_frames": 0, "recompiles": 0, **figures}
    path.write_text(json.dumps({"version": 1, "torch": "2", "asic_sim": None, "tests": {A: entry}}))
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- JUnit


def test_junit_names_both_sync_figures_and_each_sync() -> None:
    properties = junit_properties(SYNCED)
    assert properties[:5] == [
        ("nobreak_graphs", 1),
        ("nobreak_graph_breaks", 0),
        ("nobreak_eager_frames", 0),
        ("nobreak_recompiles", 0),
        ("nobreak_host_syncs", 3),
    ]
    assert dict(properties)["nobreak_syncs"] == 3
    assert properties[-1] == ("nobreak_break", f"{SYNC} at models.py:12: Tensor.item (x3 calls)")
    assert "nobreak_host_syncs" not in dict(junit_properties(OLD))
    assert "nobreak_syncs" not in dict(junit_properties(OLD))


def test_a_sync_line_says_how_often_it_ran() -> None:
    assert event_line(MASK) == f"{SYNC} at models.py:20: boolean mask indexing (1 call)"
    both = TestRecord(B, "passed", False, Figures(graphs=1, host_syncs=4), (MASK, ITEM))
    listed = [value for name, value in junit_properties(both) if name == "nobreak_break"]
    assert listed == [event_line(MASK), event_line(ITEM)]


# ----------------------------------------------------------------------------- GitHub

WS = "/home/runner/work/proj/proj"


def test_a_host_sync_is_annotated_at_its_line_with_its_calls() -> None:
    lines = github.workflow_commands(
        [dataclasses.replace(SYNCED, outcome="passed", marked=False)], WS, rootdir=WS
    )
    assert lines == [
        "::warning file=models.py,line=12,title=host sync%3A Tensor.item"
        f"::{ITEM.reason} (x3 calls)%0Ain {A}"
    ]
    # The same sync in two tests is one annotation, its calls summed; a failed test: an error.
    other = dataclasses.replace(SYNCED, nodeid=B, outcome="passed", breaks=(MASK, ITEM))
    lines = github.workflow_commands([SYNCED, other], WS, rootdir=WS)
    assert lines == [
        "::error file=models.py,line=12,title=host sync%3A Tensor.item"
        f"::{ITEM.reason} (x6 calls)%0Ain 2 tests: {A}, {B}",
        "::warning file=models.py,line=20,title=host sync%3A boolean mask indexing"
        f"::{MASK.reason} (1 call)%0Ain {B}",
    ]


def test_the_step_summary_has_a_syncs_column_and_counts_the_syncing_tests() -> None:
    clean = TestRecord(B, "passed", True, Figures(graphs=1, host_syncs=0))
    baseline = Baseline(torch="2.13.0", asic_sim="1", entries={A: OLD.figures, B: clean.figures})
    drift = compare(
        baseline,
        {A: SYNCED.figures, B: clean.figures},
        strict=False,
        torch="2.13.0",
        asic_sim="1",
    )
    text = github.step_summary_markdown([SYNCED, clean], drift)
    assert "2 watched tests, 0 with graph breaks or eager fallbacks. 1 with host syncs." in text
    rows = text.splitlines()[-4:]
    assert rows == [
        "| test | graphs | breaks | eager | recompiles | syncs | dut_ops | macs | host_macs "
        "| cycles | status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        # Not in the old entry: shown, not compared. Its cycles moved 600 -> 900.
        f"| `{A}` | 1 | 0 | 0 | 0 | 3 | 2 | 64 | 0 | **600 → 900** | failed, regressed |",
        f"| `{B}` | 1 | 0 | 0 | 0 | 0 | – | – | – | – | passed |",
    ]
    now = compare(
        Baseline(torch="2.13.0", asic_sim="1", entries={B: clean.figures}),
        {B: Figures(graphs=1, host_syncs=2)},
        strict=False,
        torch="2.13.0",
        asic_sim="1",
    )
    more = TestRecord(B, "passed", True, Figures(graphs=1, host_syncs=2))
    text = github.step_summary_markdown([more], now)
    assert text.splitlines()[-1] == (
        f"| `{B}` | 1 | 0 | 0 | 0 | **0 → 2** | – | – | – | – | regressed |"
    )


# ----------------------------------------------------------------------------- terminal


def test_the_table_has_a_syncs_column_after_recomp_and_lists_each_sync() -> None:
    records = [
        SYNCED,
        TestRecord(B, "passed", True, Figures(graphs=2, graph_breaks=1)),  # from before syncs
    ]
    lines = figures_table(records)
    assert [text for text, _ in lines] == [
        "test                     graphs  breaks   eager  recomp   syncs  dut_ops    host    dut%"
        "  cycles  outcome",
        "tests/test_m.py::test_a       1       0       0       0       3        2       0    100%"
        "     900  failed",
        f"    {SYNC} at models.py:12: Tensor.item (x3 calls)",
        "tests/test_m.py::test_b       2       1       0       0       -        -       -       -"
        "       -  passed",
    ]
    assert [style for _, style in lines] == [None, "red", None, None]


def test_the_table_leaves_the_syncs_column_out_when_no_test_ran_one() -> None:
    """Not measured (an older report) or none at all: the table is as wide as before, so it
    still fits a terminal at the node ids' minimum width."""
    records = [
        TestRecord(A, "passed", True, Figures(graphs=1, host_syncs=0)),
        TestRecord(B, "passed", True, Figures(graphs=1)),
    ]
    lines = [text for text, _ in figures_table(records, width=64)]
    assert lines == [
        "test                     graphs  breaks   eager  recomp  outcome",
        "tests/test_m.py::test_a       1       0       0       0  passed",
        "tests/test_m.py::test_b       1       0       0       0  passed",
    ]


def test_the_table_with_syncs_still_fits_the_terminal() -> None:
    long_id = "tests/models/vision/test_convnext.py::TestConvNext::test_compiles_whole[batch4]"
    sync = dataclasses.replace(ITEM, file="src/a/very/long/path/to/the/models/module.py")
    records = [TestRecord(long_id, "passed", False, Figures(graphs=1, host_syncs=3), (sync,))]
    lines = [text for text, _ in figures_table(records, width=80)]
    assert all(len(line) <= 80 for line in lines), lines
    assert lines == [
        "test                             graphs  breaks   eager  recomp   syncs  outcome",
        "...:test_compiles_whole[batch4]       1       0       0       0       3  passed",
        # A sync line is cut at the right, like a break's.
        f"    {SYNC} at src/a/very/long/path/to/the/models/module.py:12"[:77] + "...",
    ]


def test_a_baseline_entry_from_before_host_syncs_still_counts_as_known() -> None:
    """A test whose baseline entry holds exactly its old figures is not news in the summary:
    the newly measured host syncs do not make it one."""
    reporter = object.__new__(SessionReporter)
    reporter.baseline = Baseline(torch="2.13.0", asic_sim="1", entries={A: OLD.figures})
    reporter.comparison = compare(reporter.baseline, {}, strict=False, torch="2.13.0", asic_sim="1")
    same = dataclasses.replace(OLD, figures=dataclasses.replace(OLD.figures, host_syncs=0, syncs=0))
    assert reporter._known(same)
    moved = dataclasses.replace(same, figures=dataclasses.replace(same.figures, graphs=2))
    assert not reporter._known(moved)


# ----------------------------------------------------------------------------- pytest-html


def test_pytest_html_has_a_host_syncs_column_empty_where_not_measured() -> None:
    from pytest_nobreak.keys import REPORT_ATTR

    columns = HtmlColumns(SimpleNamespace())  # type: ignore[arg-type]
    header: list[str] = []
    columns.pytest_html_results_table_header(header)
    titles = [title for _, title in COLUMNS]
    assert titles.index("Host syncs") == titles.index("Recompiles") + 1
    assert '<th class="sortable" data-column-type="nobreak_host_syncs">Host syncs</th>' in header

    def row(record: TestRecord | None) -> list[str]:
        data = None if record is None else record.to_json()
        report = SimpleNamespace(nodeid=A, **{REPORT_ATTR: data})
        cells: list[str] = []
        columns.pytest_html_results_table_row(report, cells)  # type: ignore[arg-type]
        assert len(cells) == len(header)
        return cells

    assert '<td class="col-nobreak_host_syncs">3</td>' in row(SYNCED)
    assert '<td class="col-nobreak_host_syncs"></td>' in row(OLD)
    assert '<td class="col-nobreak_host_syncs"></td>' in row(None)


# ----------------------------------------------------------------------------- shards


def test_shards_of_old_and_new_reports_merge_into_a_baseline(tmp_path: Path) -> None:
    write_report(tmp_path / "s1.json", "2.13.0", "asic", "default", [SYNCED], asic_sim="1")
    old = dataclasses.replace(OLD, nodeid=B)
    write_report(tmp_path / "s2.json", "2.13.0", "asic", "default", [old], asic_sim="1")
    merged = merge_shards([tmp_path / "s1.json", tmp_path / "s2.json"])
    assert set(merged["tests"]) == {A, B}
    tests = json.loads(baseline_of(merged, tmp_path / "none.json"))["tests"]
    assert (tests[A]["host_syncs"], tests[A]["syncs"]) == (3, 3)
    assert "host_syncs" not in tests[B]
    assert "syncs" not in tests[B]


# ----------------------------------------------------------------------------- zoo


def zoo_report(tests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"version": 1, "torch": "2.13.0", "backend": "asic", "device": "default", "tests": tests}


def zoo_entry(record: TestRecord, outcome: str = "passed", **drop: bool) -> dict[str, Any]:
    entry = dataclasses.replace(record, outcome=outcome).to_json()
    if drop.get("host_syncs"):
        del entry["host_syncs"]
    return entry


def test_the_zoo_has_a_syncs_column_and_a_sync_is_not_a_break() -> None:
    asic = Figures(graphs=1, host_syncs=0, dut_ops=1, host_fallbacks=0, macs=64, host_macs=0,
                   cycles=100, syncs=0)  # fmt: skip
    whole = TestRecord("x", "passed", True, asic)
    synced = TestRecord("x", "failed", True, dataclasses.replace(asic, host_syncs=2), (ITEM,))
    report = zoo_report(
        {
            "nobreak-model[m.py:clean]::on_dut": zoo_entry(whole),
            "nobreak-model[m.py:synced]::on_dut": zoo_entry(synced, "failed"),
            "nobreak-model[m.py:old]::on_dut": zoo_entry(whole, host_syncs=True),
            "nobreak-model[m.py:unbuilt]::on_dut": {
                "outcome": "skipped",
                "marked": True,
                "graphs": 0,
                "graph_breaks": 0,
                "eager_frames": 0,
                "recompiles": 0,
                "breaks": [],
            },
        }
    )
    rows = {row.spec: row for row in rows_of(report)}
    assert rows["m.py:synced"].whole
    assert rows["m.py:synced"].break_ids == []
    assert rows["m.py:synced"].sync_ops == ["Tensor.item"]
    lines = render_zoo(report).splitlines()
    assert "| model | graph | recompiles | syncs | DUT share of MACs | host ops left | cycles " \
        "| utilization | exports |" in lines  # fmt: skip
    table = [line for line in lines if line.startswith("| `")]
    assert [line.split(" | ")[:4] for line in table[:3]] == [
        ["| `m.py:clean`", "whole", "0", "0"],
        ["| `m.py:old`", "whole", "0", "-"],  # a report from before host syncs
        ["| `m.py:synced`", "whole", "0", "2"],
    ]
    assert table[-1] == "| `m.py:unbuilt` | not built: skipped | | | | | | | |"
    assert "- 1 × host syncs: Tensor.item" in lines
    assert "- compile whole (no graph break, no eager fallback): **3**" in lines
