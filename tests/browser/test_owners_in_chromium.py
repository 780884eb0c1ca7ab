"""Owners on the ``--nobreak-html`` page, in headless Chromium: the "breaks in" filter shows
exactly the tests with a problem in that owner's code and is kept in the link, the ``foreign``
column sorts, and a ``scope="own"`` test lists a library's breaks under "Not yours". Rendered
from a constructed report, so nothing is compiled."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pytest_nobreak.report.html_report import render_html
from pytest_nobreak.report.json_report import build_report
from tests.browser.chromium import console_errors, open_page, visible_ids
from tests.unit.test_owner_reports import MINE, THEIRS, TORCHS, record

HF = dataclasses.replace(THEIRS, library=None)
TORCH = TORCHS


RECORDS = (
    record("t.py::test_mine", MINE),
    record("t.py::test_hf", HF, HF),
    record("t.py::test_both", MINE, HF, TORCH),
    record("t.py::test_torch_all", TORCH, scope="all"),
    record("t.py::test_clean"),
)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("html-owners") / "report.html"
    path.write_text(render_html(build_report("2.13.0", "eager", "", RECORDS)), encoding="utf-8")
    return path


def test_the_owner_filter_shows_the_tests_with_breaks_in_that_code(opened: Any, page: Path) -> None:
    from selenium.webdriver.support.ui import Select

    select = Select(opened.find_element("id", "owner"))
    assert [o.text for o in select.options] == [
        "anyone's code",
        "your code",
        "torch",
        "transformers",
    ]
    select.select_by_value("transformers")
    assert visible_ids(opened) == ["t.py::test_both", "t.py::test_hf"]
    assert opened.current_url.endswith("#owner=transformers")
    select.select_by_value("own")
    assert visible_ids(opened) == ["t.py::test_both", "t.py::test_mine"]
    select.select_by_value("torch")
    assert visible_ids(opened) == ["t.py::test_both", "t.py::test_torch_all"]
    assert opened.find_element("id", "shown").text == f"2 of {len(RECORDS)} tests"
    select.select_by_value("")
    assert len(visible_ids(opened)) == len(RECORDS)
    # A link names the view; an owner the page does not have is no filter.
    open_page(opened, page.as_uri() + "#owner=torch&sort=foreign_breaks-")
    assert Select(opened.find_element("id", "owner")).first_selected_option.text == "torch"
    assert visible_ids(opened) == ["t.py::test_both", "t.py::test_torch_all"]
    open_page(opened, page.as_uri() + "#owner=numpy")
    assert len(visible_ids(opened)) == len(RECORDS)
    assert console_errors(opened) == []


def test_the_foreign_column_sorts_and_a_scoped_test_lists_what_is_not_yours(
    opened: Any,
) -> None:
    from selenium.webdriver.common.by import By

    header = opened.find_element(By.CSS_SELECTOR, "th[data-key=foreign_breaks]")
    assert header.text == "foreign"
    header.click()
    assert visible_ids(opened)[:2] == ["t.py::test_both", "t.py::test_hf"]
    group = opened.find_element(By.CSS_SELECTOR, "tbody[data-nodeid='t.py::test_both']")
    group.find_element(By.CSS_SELECTOR, "button.open").click()
    detail = group.find_element(By.CSS_SELECTOR, "tr.detail")
    assert detail.is_displayed()
    headings = [h.text for h in detail.find_elements(By.TAG_NAME, "h3")]
    assert headings == ["Breaks", "Not yours (reported, not failed)"]
    owners = [p.text for p in detail.find_elements(By.CSS_SELECTOR, "p.owner")]
    assert owners == ["owner: transformers", "owner: torch"]
    assert console_errors(opened) == []
