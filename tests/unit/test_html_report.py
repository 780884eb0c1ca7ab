"""The ``--nobreak-html`` page as markup: what each test's row and details hold, the baseline
column, the per-family bars, the roofline, and that run data is only ever text. (How it looks
and behaves in a browser: tests/browser/test_html_in_chromium.py.)"""

from __future__ import annotations

import html.parser
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_nobreak.gate.baseline import Baseline, compare
from pytest_nobreak.report.html_report import (
    GENERATOR,
    HtmlReportError,
    check_html_path,
    render_html,
)
from pytest_nobreak.report.json_report import TestRecord, build_report
from pytest_nobreak.watch.events import BreakEvent, CallSite, ChainLink, Figures, GemmRecord

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
    assert page.all("a", href=str(BRANCH.link))
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
    """``events.OP_FAMILIES`` restates ``asic_backend.sim.device.GEMM_FAMILIES`` (events must not
    import the simulator, which imports torch): the two must not drift apart."""
    from asic_backend.sim.device import GEMM_FAMILIES
    from pytest_nobreak.watch.events import OP_FAMILIES

    assert OP_FAMILIES == GEMM_FAMILIES


# --------------------------------------------------------------------------- host syncs

ITEM_SYNC = BreakEvent(
    kind="host_sync",
    gb_type="Tensor.item",
    file="models.py",
    line=12,
    source="s = h.abs().max().item()",
    reason="the host reads a device value to decide what comes next (a data-dependent scalar)",
    calls=3,
    detail="data-dependent scalar",
    fix="keep the scalar a 0-d tensor: h * h.abs().max()",
    call_sites=(CallSite("test_m.py", 20, "model(x)"),),
    context=("def forward(self, h):", "    s = h.abs().max().item()", "    return h * s"),
    context_start=11,
)
MASK_SYNC = BreakEvent(
    kind="host_sync",
    gb_type="boolean mask indexing",
    file="models.py",
    line=30,
    source="h = h[h > 0]",
    reason="the output's size depends on the data (a data-dependent shape)",
    calls=1,
    detail="data-dependent shape",
)
SYNC_CYCLES = 1000  # what each sync the DUT stalled for costs in these records


def synced(nodeid: str, syncs: int, *events: BreakEvent) -> TestRecord:
    """A test on the DUT whose compiled graphs synced ``syncs`` times, each stalling the DUT:
    its cycles are its GEMM's and the stalls'."""
    ran = gemm("matmul", 2)
    figures = asic_figures(
        host_syncs=syncs, syncs=syncs, cycles=ran.cycles * ran.calls + syncs * SYNC_CYCLES
    )
    return TestRecord(nodeid, "passed", True, figures, events, gemms=(ran,))


def test_host_syncs_have_a_column_a_filter_and_their_events() -> None:
    records = (
        synced("t.py::test_item", 3, ITEM_SYNC),
        synced("t.py::test_mask", 1, MASK_SYNC),
        synced("t.py::test_clean", 0),
        TestRecord("t.py::test_fallback", "passed", True, asic_figures(host_syncs=0), (CONV_HOST,)),
    )
    text = render_html(document(*records))
    page = Page(text)
    # The column, sortable as a number, between the graph figures and the DUT's.
    keys = [a["data-key"] for a in page.all("th") if "data-key" in a]
    assert keys.index("host_syncs") == keys.index("recompiles") + 1
    (head,) = page.all("th", **{"data-key": "host_syncs"})
    assert head["data-type"] == "num"
    groups = page.groups()
    assert {n: g["data-host_syncs"] for n, g in groups.items()} == {
        "t.py::test_clean": "0",
        "t.py::test_fallback": "0",
        "t.py::test_item": "3",
        "t.py::test_mask": "1",
    }
    # The filter: the tests with host syncs, which are not tests with breaks.
    assert page.all("input", name="has", value="syncs")
    assert "has host syncs" in " ".join(" ".join(page.text).split())
    assert groups["t.py::test_item"]["data-flags"] == "syncs"
    assert groups["t.py::test_mask"]["data-flags"] == "syncs"
    assert groups["t.py::test_clean"]["data-flags"] == ""
    assert groups["t.py::test_fallback"]["data-flags"] == "host"
    body = " ".join(" ".join(page.text).split())
    assert "0 with breaks · 1 with host fallbacks · 2 with host syncs" in body
    # Each event under its test, in a section of its own, styled as its kind.
    assert len(page.all("div", class_="event host_sync")) == 2
    item = detail_text(text, "t.py::test_item")
    assert (
        "Host syncs host sync (the host waited for a device value) at models.py:12: Tensor.item"
        in item
    )
    assert "x3 calls, each a device→host round trip; data-dependent scalar" in item
    assert "11 def forward(self, h): 12 s = h.abs().max().item() 13 return h * s" in item
    assert "called from test_m.py:20 model(x)" in item
    assert "fix keep the scalar a 0-d tensor: h * h.abs().max()" in item
    assert "Breaks" not in item  # a sync is not a break of the graph
    mask = detail_text(text, "t.py::test_mask")
    assert "at models.py:30: boolean mask indexing" in mask
    assert "1 call, each a device→host round trip; data-dependent shape" in mask
    # What the stalls cost the DUT: its cycles beyond its GEMMs'.
    assert "3 host syncs (3,000 cycles stalled)" in item
    # The run's syncs by op, most calls first.
    assert (
        "Host syncs by op op form tests calls Tensor.item data-dependent scalar 1 3 "
        "boolean mask indexing data-dependent shape 1 1" in body
    )


def detail_text(page_text: str, nodeid: str) -> str:
    """The text of the details of ``nodeid``'s row."""
    start = page_text.index("<tr class='detail'", page_text.index(f"data-nodeid={_quoted(nodeid)}"))
    detail = Page(page_text[start : page_text.index("</tbody>\n", start)])
    return " ".join(" ".join(detail.text).split())


def _quoted(value: str) -> str:
    return '"' + html.escape(value, quote=True) + '"'


def test_syncs_not_measured_are_a_dash_and_no_count() -> None:
    """A report written before host syncs were counted has no ``host_syncs``: not measured,
    so a dash, sorted below every measured figure, and no "with host syncs" count."""
    old = document(TestRecord("t.py::test_old", "passed", True, Figures(graphs=1)))
    assert "host_syncs" not in old["tests"]["t.py::test_old"]
    text = render_html(old)
    page = Page(text)
    (group,) = page.groups().values()
    assert group["data-host_syncs"] == ""
    start = text.index("<tr class='test'>")
    row = text[start : text.index("</tr>", start)]
    cells = [c.split("<", 1)[0] for c in row.split("<td class='num'>")[1:]]
    # graphs, breaks, eager, recompiles, syncs, foreign
    assert cells == ["1", "0", "0", "0", "-", "-"]
    assert "with host syncs" not in " ".join(page.text)


def test_a_run_without_the_asic_still_has_the_syncs_column() -> None:
    record = TestRecord("t.py::test_cpu", "passed", True, Figures(graphs=1, host_syncs=2))
    page = Page(render_html(document(record, roofs=False)))
    keys = [a["data-key"] for a in page.all("th") if "data-key" in a]
    assert "host_syncs" in keys
    assert "dut_ops" not in keys
    (group,) = page.groups().values()
    assert (group["data-host_syncs"], group["data-flags"]) == ("2", "syncs")
    assert "1 with host syncs" in " ".join(page.text)


def test_a_test_with_breaks_and_syncs_matches_both_filters() -> None:
    record = TestRecord(
        "t.py::test_both",
        "failed",
        True,
        Figures(graphs=2, graph_breaks=1, host_syncs=1),
        (BRANCH, MASK_SYNC),
    )
    text = render_html(document(record))
    (group,) = Page(text).groups().values()
    assert group["data-flags"] == "breaks syncs"
    detail = detail_text(text, "t.py::test_both")
    assert detail.index("Breaks") < detail.index("Host syncs")
    assert detail.count("host sync (the host waited") == 1


def roofline_tips(text: str) -> dict[str, str]:
    """The roofline's point tooltips, by layer."""
    import xml.etree.ElementTree as ET

    svg = text[text.index("<svg") : text.index("</svg>") + len("</svg>")]
    ns = "{http://www.w3.org/2000/svg}"
    return {
        str(c.get("data-layer")): "".join(c.find(f"{ns}title").itertext())  # type: ignore[union-attr]
        for c in ET.fromstring(svg).iter(f"{ns}circle")
        if c.get("class") == "point"
    }


def test_the_roofline_tooltips_name_the_syncs_the_dut_stalled_for() -> None:
    shared = synced("t.py::test_a", 3, ITEM_SYNC)
    also = synced("t.py::test_b", 2, MASK_SYNC)
    clean = TestRecord(
        "t.py::test_c", "passed", True, asic_figures(host_syncs=0, syncs=0), gemms=(gemm("bmm", 4),)
    )
    tips = roofline_tips(render_html(document(shared, also, clean)))
    # One point per distinct GEMM: test_a and test_b ran the same one.
    assert tips["matmul 2×8×8"].endswith(
        "; 5 host syncs (5,000 cycles stalled) in the tests that ran it"
    )
    assert "host sync" not in tips["bmm 4×8×8"]


def test_a_stall_whose_cost_the_figures_do_not_tell_is_a_count() -> None:
    # Cycles no more than its GEMMs': the syncs' cost was not added (or is zero).
    record = TestRecord(
        "t.py::test_a",
        "passed",
        True,
        asic_figures(host_syncs=1, syncs=1, cycles=100),
        (MASK_SYNC,),
        gemms=(gemm("matmul", 2),),
    )
    text = render_html(document(record))
    assert roofline_tips(text)["matmul 2×8×8"].endswith("; 1 host sync in the tests that ran it")
    body = " ".join(" ".join(Page(text).text).split())
    assert "100 cycles, utilization 50%, 100% of the MACs on the DUT, 1 host sync " in body
    assert "cycles stalled" not in body
