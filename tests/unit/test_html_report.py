"""The ``--nobreak-html`` page as markup: what each test's row and details hold, the baseline
column, the per-family bars, the roofline, and that run data is only ever text. (How it looks
and behaves in a browser: tests/browser/test_html_in_chromium.py.)"""

from __future__ import annotations

import html.parser
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_nobreak.baseline import Baseline, compare
from pytest_nobreak.events import BreakEvent, CallSite, ChainLink, Figures, GemmRecord
from pytest_nobreak.html_report import (
    GENERATOR,
    HtmlReportError,
    check_html_path,
    render_html,
)
from pytest_nobreak.json_report import TestRecord, build_report

EVIL = "</script><script>alert(1)</script><b class=pwned>x</b>"
ROOF = {"peak_ops_per_s": 32.8e12, "bandwidth_bytes_per_s": 100e9, "description": "default"}
BRANCH = BreakEvent(
    kind="graph_break",
    gb_type="Data-dependent branching",
    gb_id="GB0170",
    file="models.py",
    line=5,
    source="if x.sum() > 0:",
    reason="Detected data-dependent branching",
    hints=("Use torch.cond",),
    link="https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0170.html",
    call_sites=(CallSite("test_m.py", 9, "f(x)"),),
    chain=(ChainLink("GB0170", "Data-dependent branching"), ChainLink("GB0066", "x")),
    context=("def f(x):", "    x = x * 2", "    if x.sum() > 0:", "        return x"),
    context_start=3,
)
CONV_HOST = BreakEvent(
    kind="host_fallback",
    gb_type="Host fallback: conv2d",
    file="models.py",
    line=14,
    reason="autograd is live",
    calls=3,
    macs=300,
)


def gemm(family: str, m: int, calls: int = 1, util: float = 0.5) -> GemmRecord:
    return GemmRecord(
        "default", family, m, 8, 8, calls, m * 64, 100, util, 0.5, 0.4, 2.0, 1e10, "memory"
    )


def document(*records: TestRecord, roofs: bool = True) -> dict[str, Any]:
    return build_report(
        "2.13.0",
        "asic",
        "default",
        records,
        asic_sim="3",
        roofs={"default": ROOF} if roofs else None,
    )


def asic_figures(**kw: int) -> Figures:
    base = {"graphs": 1, "dut_ops": 1, "host_fallbacks": 0, "macs": 100, "host_macs": 0}
    return Figures(**{**base, "cycles": 100, **kw})


class Page(html.parser.HTMLParser):
    """The page's elements (tag, attributes) and its text, as a browser's parser sees them."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.scripts = 0
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        self.scripts += tag == "script"

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def all(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [
            a
            for t, a in self.elements
            if t == tag and all(a.get(k.rstrip("_")) == v for k, v in attrs.items())
        ]

    def groups(self) -> dict[str, Mapping[str, str | None]]:
        """The table's row groups by test id."""
        return {str(a["data-nodeid"]): a for a in self.all("tbody") if "data-nodeid" in a}


def test_a_run_with_breaks_host_fallbacks_recompiles_and_dut_gemms() -> None:
    broken = TestRecord(
        "t.py::test_branch", "failed", True, Figures(graphs=2, graph_breaks=1), (BRANCH,)
    )
    mixed = TestRecord(
        "t.py::test_cnn",
        "passed",
        True,
        asic_figures(recompiles=1, host_fallbacks=3, host_macs=300, macs=700),
        (CONV_HOST,),
        recompile_reasons=("tensor 'x' size mismatch at index 0. expected 2, actual 3",),
        gemms=(gemm("conv", 1), gemm("matmul", 2, util=0.1)),
    )
    clean = TestRecord("t.py::test_clean", "passed", True, asic_figures())
    text = render_html(document(broken, mixed, clean))
    page = Page(text)
    assert page.scripts == 1  # the page's own script, and nothing else
    groups = page.groups()
    assert list(groups) == ["t.py::test_branch", "t.py::test_clean", "t.py::test_cnn"]
    assert groups["t.py::test_branch"]["data-flags"] == "breaks"
    assert groups["t.py::test_cnn"]["data-flags"] == "host recompiles"
    assert groups["t.py::test_clean"]["data-flags"] == ""
    assert groups["t.py::test_cnn"]["data-dut_share"] == repr(0.7)
    # Cycle-weighted utilization of its GEMMs: (0.5*100 + 0.1*100) / 200.
    assert float(str(groups["t.py::test_cnn"]["data-utilization"])) == pytest.approx(0.3)
    body = " ".join(" ".join(page.text).split())
    assert "3 watched tests · 1 failed · 2 passed · 1 with breaks · 1 with host fallbacks" in body
    # The break: its chain, reason, the user's line among its neighbours, call site, hint,
    # docs link and fix.
    assert "graph break GB0170 → GB0066 at models.py:5: Data-dependent branching" in body
    assert "called from test_m.py:9 f(x)" in body
    assert "5 if x.sum() > 0:" in body
    marked = text[text.index("<mark>") : text.index("</mark>")]
    assert "if x.sum() &gt; 0:" in marked
    assert ">5<" in marked
    assert page.all("a", href=BRANCH.link)
    assert "torch.where(x.sum() > 0" in body  # the fixes table's rewrite of the user's line
    # Host fallbacks by op, for the test and the run; its recompile's guard.
    assert "conv2d 3 300 autograd is live" in body
    assert "tests calls host MACs conv2d conv 1 3 300" in body
    assert "tensor 'x' size mismatch at index 0. expected 2, actual 3" in body
    # Per family: conv 64 MACs on the DUT, 300 on the host; matmul all on the DUT.
    bars = {a["data-family"]: float(str(a["data-share"])) for a in page.all("div", class_="bar")}
    assert bars == {"matmul": 1.0, "conv": pytest.approx(64 / 364)}
    # The roofline: the --asic-roofline drawing, one point per distinct GEMM.
    assert "<svg" in text
    assert "conv 1×8×8" in body
    assert "matmul 2×8×8" in body


def test_every_piece_of_run_data_is_text_never_markup() -> None:
    evil_event = BreakEvent(
        kind="graph_break",
        gb_type=EVIL,
        gb_id="GB0170",
        file=f"{EVIL}.py",
        line=1,
        source=EVIL,
        reason=EVIL,
        hints=(EVIL,),
        link="javascript:alert(1)",
        call_sites=(CallSite(EVIL, 2, EVIL),),
        context=(EVIL,),
        context_start=1,
    )
    record = TestRecord(
        f"t.py::test[{EVIL}]",
        EVIL,
        True,
        asic_figures(recompiles=1),
        (evil_event,),
        recompile_reasons=(EVIL,),
        gemms=(dataclass_replace_family(gemm("conv", 1), EVIL),),
    )
    text = render_html(document(record), title=EVIL)
    page = Page(text)
    assert page.scripts == 1
    assert not page.all("b")  # no element of the payload's
    assert not [a for _, a in page.elements if any(name.startswith("on") for name in a)]
    assert "javascript:" not in " ".join(str(a.get("href")) for a in page.all("a"))
    assert EVIL in "".join(page.text)  # shown, as text


def dataclass_replace_family(record: GemmRecord, family: str) -> GemmRecord:
    import dataclasses

    return dataclasses.replace(record, family=family)


def test_the_baseline_column_names_each_change() -> None:
    before = {
        "t.py::test_worse": Figures(graphs=1),
        "t.py::test_better": Figures(graphs=2, graph_breaks=1),
        "t.py::test_same": Figures(graphs=1),
    }
    after = {
        "t.py::test_worse": Figures(graphs=2, graph_breaks=1),
        "t.py::test_better": Figures(graphs=1),
        "t.py::test_same": Figures(graphs=1),
        "t.py::test_new": Figures(graphs=1),
    }
    records = [TestRecord(n, "passed", True, f) for n, f in after.items()]
    comparison = compare(
        Baseline("2.13.0", "3", before), after, strict=False, torch="2.13.0", asic_sim="3"
    )
    page = Page(render_html(document(*records), comparison=comparison, baseline="b.json"))
    groups = page.groups()
    assert {n: g["data-change"] for n, g in groups.items()} == {
        "t.py::test_better": "1",
        "t.py::test_new": "0",
        "t.py::test_same": "0",
        "t.py::test_worse": "2",
    }
    assert groups["t.py::test_worse"]["data-flags"] == "breaks regressed"
    body = " ".join(" ".join(page.text).split())
    assert "baseline b.json" in body
    assert "1 regressed · 1 not in the baseline" in body
    assert "graph_breaks 0 → 1" in body
    assert "not in baseline" in body


def test_no_watched_test_is_still_a_page() -> None:
    page = Page(render_html(document(roofs=False)))
    assert "No watched test ran." in " ".join(page.text)
    assert page.groups() == {}


def test_a_path_that_holds_another_file_is_never_clobbered(tmp_path: Path) -> None:
    mine = tmp_path / "report.html"
    mine.write_text(render_html(document()))
    check_html_path(mine)  # our own page: replaced
    check_html_path(tmp_path / "new" / "r.html")  # missing directories are made
    other = tmp_path / "index.html"
    other.write_text("<html>the team's dashboard</html>")
    with pytest.raises(HtmlReportError, match="is not a pytest-nobreak HTML report"):
        check_html_path(other)
    with pytest.raises(HtmlReportError, match="is a directory"):
        check_html_path(tmp_path)
    assert GENERATOR in mine.read_text()


def test_the_op_families_are_the_simulators() -> None:
    """``events.OP_FAMILIES`` restates ``asic_backend.device.GEMM_FAMILIES`` (events must not
    import the simulator, which imports torch): the two must not drift apart."""
    from asic_backend.device import GEMM_FAMILIES
    from pytest_nobreak.events import OP_FAMILIES

    assert OP_FAMILIES == GEMM_FAMILIES
