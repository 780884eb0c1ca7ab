"""pytest-html integration: the compile figures as sortable columns of its results table, and
each watched test's breaks under its row and as a text extra.

The hooks are optional (``optionalhook=True``): the plugin registers them always and imports
nothing of pytest-html, which calls them only when it is installed and ``--html`` is given. The
figures ride on each call report (:data:`pytest_nobreak.keys.REPORT_ATTR`), so a row under
xdist shows what the worker measured.
"""

from __future__ import annotations

import html
from collections.abc import Generator
from typing import Any

import pytest

from pytest_nobreak.keys import REPORT_ATTR
from pytest_nobreak.report.json_report import TestRecord
from pytest_nobreak.watch.render import render_event

__all__ = ["COLUMNS", "HtmlColumns"]

#: The figures shown, as (``Figures`` field, column title); ASIC ones, ``host_syncs`` and
#: ``foreign_breaks`` are empty when not measured.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("graphs", "Graphs"),
    ("graph_breaks", "Breaks"),
    ("eager_frames", "Eager frames"),
    ("recompiles", "Recompiles"),
    ("host_syncs", "Host syncs"),
    ("foreign_breaks", "Foreign breaks"),
    ("export_problems", "Export problems"),
    ("specialized_dims", "Specialized dims"),
    ("dut_ops", "DUT ops"),
    ("host_fallbacks", "Host fallbacks"),
    ("cycles", "Cycles"),
)
#: The name of the text extra holding a test's breaks.
EXTRA_NAME = "nobreak breaks"


def _record(report: pytest.TestReport) -> TestRecord | None:

    data = getattr(report, REPORT_ATTR, None)
    return None if data is None else TestRecord.from_json(report.nodeid, data)


def breaks_text(record: TestRecord) -> str:
    """The test's breaks as the failure message lists them (one numbered entry each)."""
    lines: list[str] = []
    for index, event in enumerate(record.breaks, 1):
        lines.extend(render_event(event, index=index))
    return "\n".join(lines)


class HtmlColumns:
    """pytest-html's hooks (registered by ``plugin.py``)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        cells.extend(
            f'<th class="sortable" data-column-type="nobreak_{key}">{title}</th>'
            for key, title in COLUMNS
        )

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        # Every row gets the cells (empty for a setup error or an unwatched test): the columns
        # must line up with the header.
        record = _record(report)
        for key, _ in COLUMNS:
            value = None if record is None else getattr(record.figures, key)
            shown = "" if value is None else str(value)
            cells.append(f'<td class="col-nobreak_{key}">{shown}</td>')

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_html(self, report: pytest.TestReport, data: list[str]) -> None:
        record = _record(report)
        if record is not None and record.breaks:
            data.append(
                f'<div class="nobreak-breaks"><pre>{html.escape(breaks_text(record))}</pre></div>'
            )

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        # Outermost (tryfirst), so the session's wrapper has put the record on the report.
        report = yield
        if report.when != "call" or not self.config.getoption("htmlpath", None):
            return report
        record = _record(report)
        if record is not None and record.breaks:
            extras = _html_extras()
            if extras is not None:
                existing: list[Any] = list(getattr(report, "extras", []))
                report.extras = [*existing, extras.text(breaks_text(record), name=EXTRA_NAME)]  # type: ignore[attr-defined]
        return report


def _html_extras() -> Any:
    try:
        # Lazy: pytest-html is optional: imported when its table is drawn.
        from pytest_html import extras
    except ImportError:
        return None
    return extras
