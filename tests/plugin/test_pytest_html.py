"""pytest-html: the compile figures as sortable columns of its table, the breaks as an extra and
under the row; nothing changes without ``--html``."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest

from pytest_nobreak.report.html_columns import COLUMNS, EXTRA_NAME

pytest.importorskip("pytest_html")

SUITE = """
import pytest, torch

def branchy(x):
    if x.sum() > 0: x = x + 1
    return x

@pytest.mark.no_graph_break
def test_breaks():
    torch.compile(branchy, backend="eager")(torch.ones(2))

@pytest.mark.no_graph_break
def test_clean():
    torch.compile(lambda x: x * 2, backend="eager")(torch.ones(2))

@pytest.mark.no_graph_break
def test_syncs():
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        f = torch.compile(lambda x: x * x.sum().item(), backend="eager")
        f(torch.ones(2)); f(torch.ones(2))

def test_unwatched():
    pass
"""


def report_data(path: Any) -> tuple[list[str], dict[str, Any]]:
    """pytest-html's table header cells and its per-test data (the page's JSON blob)."""
    text = path.read_text()
    header = re.findall(r"<th[^>]*>[^<]*</th>", text)
    blob = re.search(r'data-jsonblob="(.*?)"', text)
    assert blob is not None
    tests = {tid: runs[-1] for tid, runs in json.loads(html.unescape(blob[1]))["tests"].items()}
    return header, tests


def cells(row: dict[str, Any]) -> dict[str, str]:
    out = {}
    for cell in row["resultsTableRow"]:
        match = re.fullmatch(r'<td class="col-nobreak_(\w+)">(.*)</td>', cell)
        if match:
            out[match[1]] = match[2]
    return out


@pytest.mark.parametrize("xdist", [False, True])
def test_columns_extras_and_the_breaks_under_the_row(
    pytester: pytest.Pytester, xdist: bool
) -> None:
    if xdist:
        pytest.importorskip("xdist")
    pytester.makepyfile(test_suite=SUITE)
    args = ["-p", "no:cacheprovider", "-p", "no:randomly", "--html=out/r.html"]
    result = pytester.runpytest_subprocess(*args, *(["-n", "2"] if xdist else []))
    result.assert_outcomes(passed=3, failed=1)
    header, tests = report_data(pytester.path / "out" / "r.html")
    assert header[-len(COLUMNS) :] == [
        f'<th class="sortable" data-column-type="nobreak_{key}">{title}</th>'
        for key, title in COLUMNS
    ]
    broken = tests["test_suite.py::test_breaks"]
    assert cells(broken) == {
        "graphs": "2",
        "graph_breaks": "1",
        "eager_frames": "0",
        "recompiles": "0",
        "host_syncs": "0",
        "foreign_breaks": "0",
        "export_problems": "",  # exported nothing: not measured, not 0
        "specialized_dims": "",
        "dut_ops": "",
        "host_fallbacks": "",
        "cycles": "",
    }
    # Sortable: pytest-html keeps each column's value by name for its sort.
    assert broken["nobreak_graph_breaks"] == "1"
    [extra] = [e for e in broken["extras"] if e.get("name") == EXTRA_NAME]
    assert extra["format_type"] == "text"
    assert "1. graph break GB0170: Data-dependent branching" in broken["log"]
    assert "fix: x = torch.where(x.sum() &gt; 0, x + 1, x)" in broken["log"]  # escaped
    clean = tests["test_suite.py::test_clean"]
    assert cells(clean)["graphs"] == "1"
    assert not [e for e in clean["extras"] if e.get("name") == EXTRA_NAME]
    assert "nobreak-breaks" not in clean["log"]
    # A host sync in the graph: counted per call, and listed with the breaks.
    synced = tests["test_suite.py::test_syncs"]
    assert (cells(synced)["graph_breaks"], cells(synced)["host_syncs"]) == ("0", "2")
    assert synced["nobreak_host_syncs"] == "2"
    assert re.search(r"1\. host sync.*: Tensor\.item +\(x2 calls\)", synced["log"])
    # An unwatched test keeps the columns aligned, with nothing in them.
    assert set(cells(tests["test_suite.py::test_unwatched"]).values()) == {""}


def test_without_html_no_extra_is_added(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeconftest(
        """
        def pytest_runtest_logreport(report):
            if report.when == "call" and report.nodeid.endswith("test_breaks"):
                print("EXTRAS", getattr(report, "extras", None))
        """
    )
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.stdout.fnmatch_lines(["*EXTRAS []*"])  # pytest-html's own empty list, no breaks extra
    result.assert_outcomes(passed=3, failed=1)
