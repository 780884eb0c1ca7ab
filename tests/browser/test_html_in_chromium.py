"""The ``--nobreak-html`` page of a real run (a break, a recompile, host fallbacks, host syncs,
a regression against the baseline, and run data built to break out of the page) opened in
headless Chromium: what it shows, that sorting, filtering and the details work, that the page
raises no JavaScript error, and that nothing from the run runs as code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asic_backend.sim import host_gemm, host_passes
from tests.browser.chromium import console_errors, open_page

PAYLOAD = "</script><script>document.title='pwned'</script><b class=pwned>x</b>"
MODELS = f"""
import os

import torch
from torch import nn

BREAK = os.environ.get("BREAK") == "1"


def branchy(x):
    x = x * 2
    if BREAK and x.sum() > 0:  # {PAYLOAD}
        return x + 1
    return x - 1


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def positives(x):
    return x[x > 0].sum()  # a host sync once captured
"""
SUITE = f"""
import pytest
import torch

import models as M


@pytest.mark.no_graph_break
def test_branch():
    torch.compile(M.branchy, backend="eager")(torch.ones(3))


@pytest.mark.no_graph_break
@pytest.mark.parametrize("name", [{PAYLOAD!r}])
def test_cnn_on_dut(name, nobreak_compile):
    with torch.no_grad():
        nobreak_compile(M.CNN())(torch.randn(2, 3, 8, 8))


@pytest.mark.no_graph_break(allow_host_fallback=True)
def test_cnn_with_grad(nobreak_compile):
    nobreak_compile(M.CNN())(torch.randn(2, 3, 8, 8))


@pytest.mark.no_graph_break(max_host_syncs=None)
def test_syncs():
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        f = torch.compile(M.positives, backend="eager")
        f(torch.randn(8))
        f(torch.randn(8))


@pytest.mark.no_graph_break(max_recompiles=0)
def test_recompiles():
    f = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    f(torch.ones(2))
    f(torch.ones(3))
"""


def run(path: Path, *args: str, broken: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BREAK": "1" if broken else "0"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "no:xdist", "-q", "--asic-backend", "--nobreak-baseline", "b.json", *args],
        cwd=path, capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page of a run whose break is new since the baseline was recorded."""
    path = tmp_path_factory.mktemp("html")
    (path / "models.py").write_text(MODELS)
    (path / "test_suite.py").write_text(SUITE)
    first = run(path, "--nobreak-update-baseline", broken=False)
    assert (path / "b.json").exists(), first.stdout[-3000:]
    second = run(path, "--nobreak-html", "out/report.html", broken=True)
    assert "nobreak: HTML report written to out/report.html" in second.stdout, second.stdout
    return path / "out" / "report.html"


def visible_ids(driver: Any) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#tests > tbody:not([hidden])'))"
        ".map(g => g.dataset.nodeid)"
    )


def cell(driver: Any, nodeid: str, key: str) -> str:
    """The text of the cell of ``nodeid``'s row under the header whose key is ``key``."""
    text: str = driver.execute_script(
        "var heads = Array.from(document.querySelectorAll('#tests thead th'));"
        "var i = heads.findIndex(th => th.dataset.key === arguments[1]);"
        "var g = Array.from(document.querySelectorAll('#tests > tbody'))"
        "  .find(g => g.dataset.nodeid === arguments[0]);"
        "return g.rows[0].cells[i].innerText;",
        nodeid,
        key,
    )
    return text


def test_the_page_shows_the_run_and_runs_nothing_of_it(opened: Any) -> None:
    from selenium.webdriver.common.by import By

    text = opened.find_element(By.TAG_NAME, "body").text
    assert opened.title == "pytest-nobreak compile report"  # the payload did not retitle it
    assert opened.find_elements(By.CSS_SELECTOR, "b.pwned") == []
    assert f"test_suite.py::test_cnn_on_dut[{PAYLOAD}]" in text  # shown as text
    assert "backend\nasic" in text
    kernel = host_gemm.describe()  # this run's: the page's run was in this environment
    assert f"host GEMM\n{kernel}" in text
    assert f"host passes\n{host_passes.describe()}" in text
    assert "baseline\nb.json" in text
    assert "5 watched tests · 2 failed · 3 passed · 1 regressed" in text
    assert "graph_breaks 0 → 1" in text
    # Each figure sits under its own header.
    assert cell(opened, "test_suite.py::test_branch", "outcome") == "failed"
    assert (
        cell(opened, "test_suite.py::test_branch", "change") == "graphs 1 → 2\ngraph_breaks 0 → 1"
    )
    assert cell(opened, "test_suite.py::test_branch", "graph_breaks") == "1"
    assert cell(opened, "test_suite.py::test_cnn_with_grad", "dut_share") == "0%"
    assert cell(opened, "test_suite.py::test_cnn_with_grad", "change") == "="
    assert "Host fallbacks by op" in text
    assert "Roofline" in text
    svg = opened.find_element(By.CSS_SELECTOR, "#roofline svg")
    assert svg.size["width"] > 400
    assert console_errors(opened) == []


def test_a_test_opens_on_its_breaks_with_the_users_line_marked(opened: Any) -> None:
    from selenium.webdriver.common.by import By

    group = opened.find_element(By.CSS_SELECTOR, "tbody[data-nodeid='test_suite.py::test_branch']")
    detail = group.find_element(By.CSS_SELECTOR, "tr.detail")
    assert not detail.is_displayed()
    group.find_element(By.CSS_SELECTOR, "button.open").click()
    assert detail.is_displayed()
    marked = detail.find_element(By.TAG_NAME, "mark").text
    assert marked.startswith("12")
    assert f"if BREAK and x.sum() > 0:  # {PAYLOAD}" in marked
    text = detail.text
    assert "graph break GB0170 at models.py:12: Data-dependent branching" in text
    assert "called from\ntest_suite.py:10 torch.compile(M.branchy" in text
    assert "torch.where(BREAK and x.sum() > 0" in text or "torch.cond" in text  # the fix
    docs = detail.find_element(By.CSS_SELECTOR, ".docs a").get_attribute("href")
    assert docs.startswith("https://")
    # The host fallbacks of another test: grouped by op, and the DUT share of each family.
    grad = opened.find_element(
        By.CSS_SELECTOR, "tbody[data-nodeid='test_suite.py::test_cnn_with_grad']"
    )
    grad.find_element(By.CSS_SELECTOR, "button.open").click()
    bars = grad.find_elements(By.CSS_SELECTOR, ".bar")
    assert [b.get_attribute("aria-label") for b in bars] == [
        "matmul: 0% on the DUT, 5,760 host MACs",
        "conv: 0% on the DUT, 15,552 host MACs",
    ]
    assert console_errors(opened) == []


def test_sorting_and_filtering_and_the_link_that_keeps_them(opened: Any, page: Path) -> None:
    from selenium.webdriver.common.by import By

    assert visible_ids(opened)[0] == "test_suite.py::test_branch"  # by test id at first
    header = opened.find_element(By.CSS_SELECTOR, "th[data-key=cycles]")
    header.click()  # figures sort highest first
    assert visible_ids(opened)[0].startswith("test_suite.py::test_cnn_on_dut[")
    assert header.get_attribute("aria-sort") == "descending"
    header.click()
    assert header.get_attribute("aria-sort") == "ascending"
    assert opened.current_url.endswith("#sort=cycles")

    opened.find_element(By.CSS_SELECTOR, "input[name=has][value=host]").click()
    assert visible_ids(opened) == ["test_suite.py::test_cnn_with_grad"]
    assert opened.find_element(By.ID, "shown").text == "1 of 5 tests"
    opened.find_element(By.CSS_SELECTOR, "input[name=has][value=host]").click()
    opened.find_element(By.CSS_SELECTOR, "input[name=has][value=regressed]").click()
    assert visible_ids(opened) == ["test_suite.py::test_branch"]

    # A link names a view: outcome and sort come back from the fragment.
    open_page(opened, page.as_uri() + "#outcome=failed&sort=recompiles-")
    assert visible_ids(opened) == ["test_suite.py::test_recompiles", "test_suite.py::test_branch"]
    assert console_errors(opened) == []


def test_a_real_runs_host_syncs_are_a_column_a_filter_and_an_entry(opened: Any) -> None:
    from selenium.webdriver.common.by import By

    assert cell(opened, "test_suite.py::test_syncs", "host_syncs") == "2"
    assert cell(opened, "test_suite.py::test_branch", "host_syncs") == "0"
    opened.find_element(By.CSS_SELECTOR, "input[name=has][value=syncs]").click()
    assert visible_ids(opened) == ["test_suite.py::test_syncs"]
    group = opened.find_element(By.CSS_SELECTOR, "tbody[data-nodeid='test_suite.py::test_syncs']")
    group.find_element(By.CSS_SELECTOR, "button.open").click()
    detail = group.find_element(By.CSS_SELECTOR, "tr.detail")
    assert detail.is_displayed()
    assert "boolean mask indexing" in detail.text
    assert "x[x > 0].sum()" in detail.find_element(By.TAG_NAME, "mark").text
    assert console_errors(opened) == []


def test_screenshot(opened: Any, tmp_path: Path) -> None:
    """The README's picture (``NOBREAK_SCREENSHOT=docs/html_report.png`` writes it there)."""
    from selenium.webdriver.common.by import By

    opened.find_element(
        By.CSS_SELECTOR, "tbody[data-nodeid='test_suite.py::test_branch'] button"
    ).click()
    target = Path(os.environ.get("NOBREAK_SCREENSHOT") or tmp_path / "report.png")
    opened.set_window_size(1400, 1500)
    assert opened.save_screenshot(str(target))
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
