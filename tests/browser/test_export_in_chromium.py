"""Export problems on the ``--nobreak-html`` page, in headless Chromium: the ``export`` and
``static`` columns are there when a test exported and sort, the "has export problems" filter
shows exactly those tests, and an entry shows its kind and mode. Rendered from a constructed
report, so nothing is exported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_nobreak.report.html_report import render_html
from pytest_nobreak.report.json_report import TestRecord, build_report
from pytest_nobreak.watch.events import BreakEvent, Figures
from tests.browser.chromium import console_errors, visible_ids

SPECIALIZED = BreakEvent(
    kind="specialized_dim",
    gb_type="args[0] dim 1 (Dim.AUTO)",
    file="encoder.py",
    line=13,
    source="if h.shape[1] > 16:",
    reason="declared dynamic (Dim.AUTO) in [0, inf], exported in [2, 16]",
    detail="non-strict and strict",
)
SYNC = BreakEvent(
    kind="export_sync",
    gb_type="aten.item",
    file="encoder.py",
    line=15,
    reason="the program makes the host wait for a device value (data-dependent scalar)",
    detail="strict",
)


def record(nodeid: str, *breaks: BreakEvent, exported: bool = True) -> TestRecord:
    problems = len(breaks) if exported else None
    dims = sum(1 for e in breaks if e.kind == "specialized_dim") if exported else None
    figures = Figures(graphs=1, export_problems=problems, specialized_dims=dims)
    return TestRecord(nodeid, "failed" if breaks else "passed", True, figures, breaks)


RECORDS = (
    record("t.py::test_both", SPECIALIZED, SYNC),
    record("t.py::test_sync", SYNC),
    record("t.py::test_clean_export"),
    record("t.py::test_compiled_only", exported=False),
)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("html-export") / "report.html"
    document = json.loads(json.dumps(build_report("2.13.0", "eager", "", RECORDS)))
    path.write_text(render_html(document), encoding="utf-8")
    return path


def column(driver: Any, key: str) -> list[str]:
    cells: list[str] = driver.execute_script(
        "var i = Array.from(document.querySelectorAll('#tests thead th'))"
        f".findIndex(th => th.dataset.key === {json.dumps(key)});"
        "return Array.from(document.querySelectorAll('#tests > tbody:not([hidden]) > tr.test'))"
        ".map(tr => tr.children[i].textContent.trim())"
    )
    return cells


def test_the_export_columns_show_and_sort(opened: Any) -> None:
    heads = [th.text for th in opened.find_elements("css selector", "#tests thead th")]
    assert "export" in heads
    assert "static" in heads
    assert column(opened, "export_problems") == ["2", "0", "-", "1"]
    opened.find_element("css selector", "th[data-key='export_problems']").click()
    numbers = [int(v) for v in column(opened, "export_problems") if v != "-"]
    assert numbers in ([0, 1, 2], [2, 1, 0])
    assert column(opened, "specialized_dims").count("1") == 1
    assert console_errors(opened) == []


def test_the_export_filter_shows_the_tests_with_export_problems(opened: Any) -> None:
    box = opened.find_element("css selector", "input[name='has'][value='export']")
    box.click()
    assert visible_ids(opened) == ["t.py::test_both", "t.py::test_sync"]
    box.click()
    assert len(visible_ids(opened)) == len(RECORDS)


def test_an_entry_shows_its_kind_and_mode(opened: Any) -> None:
    group = opened.find_element("css selector", "tbody[data-nodeid='t.py::test_both']")
    group.find_element("css selector", "button.open").click()
    detail = group.find_element("css selector", "tr.detail")
    assert detail.is_displayed()
    text = opened.execute_script("return arguments[0].textContent", detail)
    headings = [h.text for h in detail.find_elements("css selector", "h3")]
    assert headings == ["Export"]
    assert "dynamic dimension specialized" in text
    assert "args[0] dim 1 (Dim.AUTO)" in text
    assert "host sync in the exported program" in text
    modes = opened.execute_script(
        "return Array.from(arguments[0].querySelectorAll('p.mode')).map(p => p.textContent)",
        detail,
    )
    assert modes == ["mode: non-strict and strict", "mode: strict"]
