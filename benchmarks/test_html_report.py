"""The ``--nobreak-html`` page of a 2,000-test suite: render time, file size, and how long
headless Chromium takes to load it, sort it and filter it.

Run: ``pytest benchmarks/test_html_report.py --benchmark-only -s``. The figures go in
``extra_info`` and one summary line; nothing here asserts a time (the page's behaviour is
asserted in ``tests/browser``). The suite is made up, but shaped like a real one: most tests
clean on the DUT, a tenth with a graph break (source context, call sites, hints, a fix), some
with host fallbacks, host syncs, recompiles and regressions against the baseline.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_nobreak.gate.baseline import Baseline, compare
from pytest_nobreak.report.html_report import render_html
from pytest_nobreak.report.json_report import TestRecord, build_report
from pytest_nobreak.watch.events import BreakEvent, CallSite, Figures, GemmRecord
from tests.browser.chromium import console_errors, driver_or_skip, open_page

N_TESTS = 2000
ROOF = {"peak_ops_per_s": 32.8e12, "bandwidth_bytes_per_s": 100e9, "description": "default"}
CONTEXT = tuple(f"    h = layer_{i}(h)  # a line of the user's model" for i in range(7))


def _record(i: int) -> TestRecord:
    gemms = tuple(
        GemmRecord("default", family, 8 * (i % 16 + 1), 64, 64, 2, 8 * 64 * 64, 640, 0.1, 0.5,
                   0.2, 20.0, 1e12, "memory")
        for family in ("matmul", "bmm", "conv")
    )  # fmt: skip
    macs = sum(g.macs * g.calls for g in gemms)
    breaks: list[BreakEvent] = []
    figures: dict[str, int] = {"graphs": 1, "dut_ops": 6, "macs": macs, "cycles": 3840}
    figures.update(host_syncs=0, syncs=0)
    if i % 10 == 0:
        figures.update(graphs=2, graph_breaks=1)
        breaks.append(
            BreakEvent(
                kind="graph_break",
                gb_type="Data-dependent branching",
                gb_id="GB0170",
                file=f"models/block_{i % 50}.py",
                line=12,
                source=CONTEXT[3].strip(),
                reason="Detected data-dependent branching (e.g. `if my_tensor.sum() > 0:`).",
                hints=("Use `torch.cond` to express dynamic control flow.",) * 3,
                link="https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0170.html",
                call_sites=(CallSite(f"tests/test_{i}.py", 30, "model(x)"),),
                context=CONTEXT,
                context_start=9,
            )
        )
    if i % 25 == 0:
        figures.update(host_fallbacks=2, host_macs=4096)
        breaks.append(
            BreakEvent(
                kind="host_fallback",
                gb_type="Host fallback: conv2d",
                file=f"models/block_{i % 50}.py",
                line=20,
                reason="autograd is live: call the model under torch.no_grad()",
                calls=2,
                macs=4096,
            )
        )
    if i % 30 == 0:
        figures.update(host_syncs=2, syncs=2, cycles=figures["cycles"] + 2 * 1000)
        breaks.append(
            BreakEvent(
                kind="host_sync",
                gb_type="Tensor.item",
                file=f"models/block_{i % 50}.py",
                line=14,
                source=CONTEXT[5].strip(),
                reason="the host reads a device value to decide what comes next "
                "(a data-dependent scalar)",
                calls=2,
                detail="data-dependent scalar",
                call_sites=(CallSite(f"tests/test_{i}.py", 30, "model(x)"),),
                context=CONTEXT,
                context_start=9,
            )
        )
    figures.setdefault("host_fallbacks", 0)
    figures.setdefault("host_macs", 0)
    if i % 40 == 0:
        figures["recompiles"] = 1
    outcome = "failed" if breaks and breaks[0].kind == "graph_break" else "passed"
    return TestRecord(
        nodeid=f"tests/models/test_zoo_{i // 100}.py::test_model[case-{i}]",
        outcome=outcome,
        marked=True,
        figures=Figures(**figures),
        breaks=tuple(breaks),
        recompile_reasons=("tensor 'x' size mismatch at index 0. expected 2, actual 3",)
        if figures.get("recompiles")
        else (),
        gemms=gemms,
    )


def suite() -> tuple[dict[str, Any], Baseline]:
    records = [_record(i) for i in range(N_TESTS)]
    document = build_report(
        "2.13.0", "asic", "default", records, asic_sim="3", roofs={"default": ROOF}
    )
    # Recorded before the breaks came in: every break is a regression.
    entries = {r.nodeid: dataclasses.replace(r.figures, graphs=1, graph_breaks=0) for r in records}
    return document, Baseline("2.13.0", "3", entries)


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    yield from driver_or_skip()


@pytest.mark.benchmark(group="html-report")
def test_html_report_of_2000_tests(
    benchmark: Any, driver: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from selenium.webdriver.common.by import By

    document, baseline = suite()
    results = {
        nodeid: TestRecord.from_json(nodeid, e).figures for nodeid, e in document["tests"].items()
    }
    comparison = compare(baseline, results, strict=False, torch="2.13.0", asic_sim="3")
    page = benchmark(render_html, document, comparison=comparison, baseline="b.json")
    path = tmp_path / "report.html"
    path.write_text(page)

    started = time.perf_counter()
    open_page(driver, path.as_uri())
    load_s = time.perf_counter() - started
    timing = driver.execute_script(
        "var t = performance.getEntriesByType('navigation')[0];"
        "return [t.domContentLoadedEventEnd, t.loadEventEnd,"
        " Number(document.documentElement.dataset.readyMs)];"
    )
    rows = driver.execute_script("return document.querySelectorAll('#tests > tbody').length")
    assert rows == N_TESTS  # the whole suite is on the page
    header = driver.find_element(By.CSS_SELECTOR, "th[data-key=cycles]")
    started = time.perf_counter()
    header.click()
    sort_s = time.perf_counter() - started
    started = time.perf_counter()
    driver.find_element(By.CSS_SELECTOR, "input[name=has][value=regressed]").click()
    filter_s = time.perf_counter() - started
    shown = driver.find_element(By.ID, "shown").text
    assert shown == f"{N_TESTS // 10} of {N_TESTS} tests"
    assert console_errors(driver) == []

    figures = {
        "tests": N_TESTS,
        "html_bytes": len(page.encode()),
        "load_s": round(load_s, 3),
        "dom_content_loaded_ms": round(timing[0]),
        "load_event_ms": round(timing[1]),
        "script_ms": timing[2],
        "sort_s": round(sort_s, 3),
        "filter_s": round(filter_s, 3),
    }
    benchmark.extra_info.update(figures)
    with capsys.disabled():
        print(
            f"\nhtml report, {N_TESTS} tests: {figures['html_bytes'] / 1e6:.2f} MB, "
            f"loaded in {load_s:.2f}s (DOMContentLoaded {figures['dom_content_loaded_ms']} ms, "
            f"script {figures['script_ms']} ms), sort {sort_s:.2f}s, filter {filter_s:.2f}s"
        )
