"""Owners in every report: the JSON round trip, the terminal table and summary, the GitHub
annotations and step summary, the HTML page's column, filter and "not yours" section."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from pytest_nobreak.report import github
from pytest_nobreak.report.controller import figures_table, owner_lines
from pytest_nobreak.report.html_report import render_html
from pytest_nobreak.report.json_report import TestRecord, build_report
from pytest_nobreak.watch.events import BreakEvent, Figures
from tests.unit.test_html_report import Page, detail_text

MINE = BreakEvent(
    kind="graph_break",
    gb_type="Data-dependent branching",
    gb_id="GB0170",
    file="models.py",
    line=5,
    reason="Detected data-dependent branching",
)
THEIRS = BreakEvent(
    kind="graph_break",
    gb_type="logging.Logger method not supported for non-export cases",
    gb_id="GB0291",
    file="models.py",
    line=9,
    reason="logging.Logger methods are not supported",
    library="transformers (transformers/models/rwkv/modeling_rwkv.py:547, in forward)",
    owner="transformers",
)
TORCHS = dataclasses.replace(THEIRS, gb_id="GB0059", line=11, library="torch", owner="torch")


def record(nodeid: str, *breaks: BreakEvent, scope: str = "own", outcome: str = "passed"):
    foreign = sum(1 for e in breaks if not e.own)
    figures = Figures(graphs=1 + len(breaks), graph_breaks=len(breaks), foreign_breaks=foreign)
    return TestRecord(nodeid, outcome, True, figures, breaks, scope=scope)  # type: ignore[arg-type]


def shipped(rec: TestRecord) -> TestRecord:
    """Through JSON and back, as a record travels from an xdist worker."""
    return TestRecord.from_json(rec.nodeid, json.loads(json.dumps(rec.to_json())))


def test_owners_scope_and_the_figure_survive_the_trip_from_a_worker() -> None:
    rec = record("t.py::test_a", MINE, THEIRS)
    data = rec.to_json()
    assert (data["scope"], data["foreign_breaks"]) == ("own", 1)
    assert [e["owner"] for e in data["breaks"]] == ["own", "transformers"]
    assert shipped(rec) == rec
    # Scope "all" is the default and is not written; an older report has no owners.
    plain = record("t.py::test_b", MINE, scope="all")
    assert "scope" not in plain.to_json()
    older = plain.to_json()
    del older["foreign_breaks"]
    for event in older["breaks"]:
        del event["owner"]
    back = TestRecord.from_json("t.py::test_b", older)
    assert back.figures.foreign_breaks is None  # not measured, never 0
    assert back.breaks[0].owner is None
    assert back.breaks[0].own  # unknown counts as the user's


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scope": "mine"}, "'scope' must be one of all, own, not 'mine'"),
        ({"owner": 3}, "'owner' must be"),
    ],
)
def test_a_bad_scope_or_owner_in_a_report_is_an_error(
    change: dict[str, object], message: str
) -> None:
    data = record("t.py::test_a", THEIRS).to_json()
    if "owner" in change:
        data["breaks"] = [{**data["breaks"][0], **change}]
    else:
        data.update(change)
    with pytest.raises(ValueError, match=re.escape(message)) as excinfo:
        TestRecord.from_json("t.py::test_a", data)
    assert "t.py::test_a" in str(excinfo.value)


def test_the_table_lists_what_a_scoped_test_did_not_fail_on_apart() -> None:
    rows = [
        record("t.py::test_scoped", MINE, THEIRS),
        record("t.py::test_all", THEIRS, scope="all", outcome="failed"),
    ]
    lines = [text for text, _ in figures_table(rows)]
    assert lines[0].split() == ["test", "graphs", "breaks", "eager", "recomp", "foreign", "outcome"]
    assert lines[1].split() == ["t.py::test_scoped", "3", "2", "0", "0", "1", "passed"]
    assert lines[2:5] == [
        "    graph break GB0170 at models.py:5: Data-dependent branching",
        "    not yours (reported, not failed):",
        "      graph break GB0291 at models.py:9 (inside transformers): "
        "logging.Logger method not supported for non-export cases",
    ]
    # Under scope "all" a library's break failed the test: it is listed with the others.
    assert lines[6] == (
        "    graph break GB0291 at models.py:9 (inside transformers): "
        "logging.Logger method not supported for non-export cases"
    )
    # No foreign column where every break was the user's.
    header = figures_table([record("t.py::test_mine", MINE)])[0][0]
    assert "foreign" not in header


def test_the_run_summary_counts_the_problems_by_owner_yours_first() -> None:
    rows = [
        record("t.py::a", MINE, THEIRS, TORCHS),
        record("t.py::b", THEIRS),
        record("t.py::c", MINE),
    ]
    assert owner_lines(rows) == [
        ("nobreak: 5 problems: 2 in your code, 2 in transformers, 1 in torch", None)
    ]
    assert owner_lines([record("t.py::c", MINE)]) == []  # all the user's: the table says it


def test_an_annotation_is_an_error_only_where_the_problem_failed_the_test() -> None:
    rows = [
        record("t.py::test_scoped", MINE, THEIRS, outcome="failed"),
        record("t.py::test_all", TORCHS, scope="all", outcome="failed"),
    ]
    lines = github.workflow_commands(rows, None)
    by_id = {
        gb: next(line for line in lines if gb in line) for gb in ("GB0170", "GB0291", "GB0059")
    }
    assert by_id["GB0170"].startswith("::error ")
    assert by_id["GB0291"].startswith("::warning ")  # scope "own": reported, not failed
    assert by_id["GB0059"].startswith("::error ")  # scope "all": it failed the test
    assert "%0Aowner: transformers%0A" in by_id["GB0291"]
    assert "owner:" not in by_id["GB0170"]
    summary = github.step_summary_markdown(rows, None)
    assert "| test | graphs | breaks | eager | recompiles | syncs | foreign |" in summary
    assert "| `t.py::test_scoped` | 3 | 2 | 0 | 0 | – | 1 |" in summary


def test_the_page_has_an_owner_column_a_filter_and_a_not_yours_section() -> None:
    rows = [
        record("t.py::test_scoped", MINE, THEIRS),
        record("t.py::test_all", TORCHS, scope="all"),
    ]
    text = render_html(build_report("2.13.0", "eager", "", rows))
    page = Page(text)
    keys = [a["data-key"] for a in page.all("th") if "data-key" in a]
    assert "foreign_breaks" in keys
    groups = page.groups()
    assert groups["t.py::test_scoped"]["data-foreign_breaks"] == "1"
    assert groups["t.py::test_scoped"]["data-owners"] == "own transformers"
    assert groups["t.py::test_all"]["data-owners"] == "torch"
    start = text.index("<select id='owner'>")
    owner_select = Page(text[start : text.index("</select>", start)])
    assert owner_select.text == ["anyone's code", "your code", "torch", "transformers"]
    values = [a["value"] for a in owner_select.all("option")]
    assert values == ["", "own", "torch", "transformers"]
    scoped = detail_text(text, "t.py::test_scoped")
    assert (
        scoped.index("Breaks")
        < scoped.index("GB0170")
        < scoped.index("Not yours (reported, not failed)")
    )
    assert (
        "Not yours (reported, not failed) graph break GB0291 at models.py:9 (inside transformers)"
        in scoped
    )
    assert "owner: transformers" in scoped
    every = detail_text(text, "t.py::test_all")
    assert "Not yours" not in every
    assert "owner: torch" in every
