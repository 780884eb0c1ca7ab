"""Host syncs on the ``--nobreak-html`` page, in headless Chromium: the ``syncs`` column sorts
(a figure not measured, from an older report, below every measured one), the "has host syncs"
filter shows exactly the tests with syncs and is kept in the link, and a test's syncs open
under it, styled as their own kind. The page is rendered from a constructed report, so these
run without compiling anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_nobreak.report.html_report import render_html
from pytest_nobreak.report.json_report import TestRecord, build_report
from pytest_nobreak.watch.events import BreakEvent, Figures, GemmRecord
from tests.browser.chromium import console_errors, open_page

ROOF = {"peak_ops_per_s": 32.8e12, "bandwidth_bytes_per_s": 100e9, "description": "default"}
GEMM = GemmRecord("default", "matmul", 2, 8, 8, 1, 128, 100, 0.5, 0.5, 0.4, 2.0, 1e10, "memory")
SYNC_CYCLES = 1000


def sync(op: str, line: int, calls: int, form: str) -> BreakEvent:
    return BreakEvent(
        kind="host_sync",
        gb_type=op,
        file="models.py",
        line=line,
        source="s = h.abs().max().item()",
        reason=f"the host reads a device value to decide what comes next (a {form})",
        calls=calls,
        detail=form,
        fix="keep the scalar a 0-d tensor: h * h.abs().max()",
        context=("def forward(self, h):", "    s = h.abs().max().item()", "    return h * s"),
        context_start=line - 1,
    )


def on_dut(host_syncs: int | None, syncs: int | None = None, **kw: int) -> Figures:
    stalls = syncs if syncs is not None else host_syncs or 0
    figures = {"graphs": 1, "dut_ops": 1, "host_fallbacks": 0, "macs": 128, "host_macs": 0}
    figures.update(cycles=GEMM.cycles + stalls * SYNC_CYCLES, syncs=stalls, **kw)
    return Figures(host_syncs=host_syncs, **figures)


BRANCH = BreakEvent(
    kind="graph_break",
    gb_type="Data-dependent branching",
    gb_id="GB0170",
    file="models.py",
    line=40,
    reason="Detected data-dependent branching",
)
CONV_HOST = BreakEvent(
    kind="host_fallback",
    gb_type="Host fallback: conv2d",
    file="models.py",
    line=50,
    reason="autograd is live",
    calls=2,
    macs=300,
)
RECORDS = (
    TestRecord(
        "t.py::test_item",
        "passed",
        True,
        on_dut(3),
        (sync("Tensor.item", 12, 3, "data-dependent scalar"),),
        gemms=(GEMM,),
    ),
    TestRecord(
        "t.py::test_mask_and_break",
        "failed",
        True,
        on_dut(1, graphs=2, graph_breaks=1),
        (BRANCH, sync("boolean mask indexing", 30, 1, "data-dependent shape")),
        gemms=(GEMM,),
    ),
    TestRecord(
        "t.py::test_unique",
        "passed",
        True,
        on_dut(7),
        (sync("torch.unique", 20, 7, "data-dependent shape"),),
        gemms=(GEMM,),
    ),
    TestRecord("t.py::test_clean", "passed", True, on_dut(0), gemms=(GEMM,)),
    TestRecord(
        "t.py::test_fallback",
        "passed",
        True,
        on_dut(0, host_fallbacks=2, host_macs=300),
        (CONV_HOST,),
        gemms=(GEMM,),
    ),
    # From a report written before host syncs were counted: not measured.
    TestRecord("t.py::test_old", "passed", True, on_dut(None, syncs=0), gemms=(GEMM,)),
)
WITH_SYNCS = ["t.py::test_item", "t.py::test_mask_and_break", "t.py::test_unique"]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    document = build_report(
        "2.13.0", "asic", "default", RECORDS, asic_sim="3", roofs={"default": ROOF}
    )
    path = tmp_path_factory.mktemp("html-syncs") / "report.html"
    path.write_text(render_html(document), encoding="utf-8")
    return path


def visible_ids(driver: Any) -> list[str]:
    ids: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll('#tests > tbody:not([hidden])'))"
        ".map(g => g.dataset.nodeid)"
    )
    return ids


def syncs_cells(driver: Any) -> list[str]:
    """The visible rows' ``syncs`` cells, top to bottom."""
    cells: list[str] = driver.execute_script(
        "var heads = Array.from(document.querySelectorAll('#tests thead th'));"
        "var i = heads.findIndex(th => th.dataset.key === 'host_syncs');"
        "return Array.from(document.querySelectorAll('#tests > tbody:not([hidden])'))"
        "  .map(g => g.rows[0].cells[i].innerText);"
    )
    return cells


def test_the_syncs_column_sorts_with_not_measured_lowest(opened: Any) -> None:
    from selenium.webdriver.common.by import By

    header = opened.find_element(By.CSS_SELECTOR, "th[data-key=host_syncs]")
    assert header.text == "syncs"
    assert "host wait for a device value" in (header.get_attribute("title") or "")
    header.click()  # figures sort highest first
    assert header.get_attribute("aria-sort") == "descending"
    assert visible_ids(opened) == [
        "t.py::test_unique",
        "t.py::test_item",
        "t.py::test_mask_and_break",
        "t.py::test_clean",  # the zeros by test id
        "t.py::test_fallback",
        "t.py::test_old",
    ]
    assert syncs_cells(opened) == ["7", "3", "1", "0", "0", "-"]
    assert opened.current_url.endswith("#sort=host_syncs-")
    header.click()
    assert header.get_attribute("aria-sort") == "ascending"
    assert syncs_cells(opened) == ["-", "0", "0", "1", "3", "7"]
    assert visible_ids(opened)[0] == "t.py::test_old"
    assert opened.current_url.endswith("#sort=host_syncs")
    assert console_errors(opened) == []


def test_the_has_host_syncs_filter_shows_exactly_the_tests_with_syncs(
    opened: Any, page: Path
) -> None:
    from selenium.webdriver.common.by import By

    box = opened.find_element(By.CSS_SELECTOR, "input[name=has][value=syncs]")
    label = box.find_element(By.XPATH, "..").text
    assert label.strip() == "has host syncs"
    box.click()
    assert visible_ids(opened) == WITH_SYNCS
    assert opened.find_element(By.ID, "shown").text == f"{len(WITH_SYNCS)} of {len(RECORDS)} tests"
    assert opened.current_url.endswith("#has=syncs")
    # With "has breaks" too: the one test with both.
    opened.find_element(By.CSS_SELECTOR, "input[name=has][value=breaks]").click()
    assert visible_ids(opened) == ["t.py::test_mask_and_break"]
    # "has breaks" alone does not count a sync as a break; "has host fallbacks" neither.
    box.click()
    assert visible_ids(opened) == ["t.py::test_mask_and_break"]
    opened.find_element(By.CSS_SELECTOR, "input[name=has][value=breaks]").click()
    opened.find_element(By.CSS_SELECTOR, "input[name=has][value=host]").click()
    assert visible_ids(opened) == ["t.py::test_fallback"]
    # A link names the view: the filter and the sort come back from the fragment.
    open_page(opened, page.as_uri() + "#has=syncs&sort=host_syncs-")
    assert opened.find_element(By.CSS_SELECTOR, "input[name=has][value=syncs]").is_selected()
    assert visible_ids(opened) == [
        "t.py::test_unique",
        "t.py::test_item",
        "t.py::test_mask_and_break",
    ]
    header = "Array.from(document.querySelectorAll('#counts')).map(p => p.innerText)[0]"
    assert "3 with host syncs" in opened.execute_script(f"return {header}")
    assert console_errors(opened) == []


def test_a_tests_host_syncs_open_under_it_styled_as_their_kind(opened: Any) -> None:
    from selenium.webdriver.common.by import By

    group = opened.find_element(By.CSS_SELECTOR, "tbody[data-nodeid='t.py::test_item']")
    detail = group.find_element(By.CSS_SELECTOR, "tr.detail")
    assert not detail.is_displayed()
    group.find_element(By.CSS_SELECTOR, "button.open").click()
    assert detail.is_displayed()
    (event,) = detail.find_elements(By.CSS_SELECTOR, ".event.host_sync")
    text = event.text
    assert text.startswith(
        "host sync (the host waited for a device value) at models.py:12: Tensor.item"
    )
    assert "x3 calls, each a device→host round trip; data-dependent scalar" in text
    assert "fix\nkeep the scalar a 0-d tensor: h * h.abs().max()" in text
    marked = event.find_element(By.TAG_NAME, "mark").text
    assert marked.startswith("12")
    assert "s = h.abs().max().item()" in marked
    assert "3 host syncs (3,000 cycles stalled)" in detail.text  # what the DUT lost
    # Its own colour: not a break's, not a host fallback's.
    fallback = opened.find_element(By.CSS_SELECTOR, "tbody[data-nodeid='t.py::test_fallback']")
    fallback.find_element(By.CSS_SELECTOR, "button.open").click()
    mixed = opened.find_element(By.CSS_SELECTOR, "tbody[data-nodeid='t.py::test_mask_and_break']")
    mixed.find_element(By.CSS_SELECTOR, "button.open").click()
    colour = "return getComputedStyle(arguments[0]).borderLeftColor"
    sync_colour = opened.execute_script(colour, event)
    host_colour = opened.execute_script(
        colour, fallback.find_element(By.CSS_SELECTOR, ".event.host_fallback")
    )
    break_colour = opened.execute_script(
        colour, mixed.find_element(By.CSS_SELECTOR, ".event.graph_break")
    )
    assert sync_colour == "rgb(130, 80, 223)"
    assert len({sync_colour, host_colour, break_colour}) == 3
    assert console_errors(opened) == []


def test_the_roofline_tooltip_names_the_syncs(opened: Any) -> None:
    from selenium.webdriver.common.by import By

    (point,) = opened.find_elements(By.CSS_SELECTOR, "#roofline circle.point")
    assert point.get_attribute("data-syncs") == "11"
    tip = opened.execute_script("return arguments[0].querySelector('title').textContent", point)
    assert tip.endswith("; 11 host syncs (11,000 cycles stalled) in the tests that ran it")
    assert console_errors(opened) == []
