"""The failure message (host-fallback entries, call sites, chains, the allow hint), shares as
percentages, the terminal table, and what an event puts in the JSON report."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_nobreak.report.controller import figures_table
from pytest_nobreak.report.json_report import TestRecord
from pytest_nobreak.watch.events import BreakEvent, CallSite, ChainLink, Figures, OtherSite
from pytest_nobreak.watch.render import (
    allow_hint,
    percent,
    render_event,
    render_failure,
    short_path,
)

WHY = "torch.float64 operands: the DUT path quantizes float32/bfloat16/float16 only"
CONV = BreakEvent(
    kind="host_fallback",
    gb_type="Host fallback: conv2d",
    file="/elsewhere/models.py",
    line=14,
    source="y = self.conv(x.double())",
    reason=WHY,
    calls=3,
    macs=884736,
    detail="x[2, 3, 32, 32] w[16, 3, 3, 3]",
    also_at=(OtherSite("/elsewhere/models.py", 20, 2),),
)
BRANCH = BreakEvent(
    kind="graph_break",
    gb_type="Data-dependent branching",
    gb_id="GB0170",
    file="/elsewhere/models.py",
    line=9,
    reason="Detected data-dependent branching",
)


@pytest.mark.parametrize(
    ("share", "text"),
    [
        (0.0, "0%"),
        (1.0, "100%"),
        (0.62, "62%"),
        (0.375, "37.5%"),
        (0.0004, "<0.1%"),  # some host work: never "0%"
        (0.9996, ">99.9%"),  # some host work: never "100%"
        (0.00051, "0.1%"),
    ],
)
def test_percent(share: float, text: str) -> None:
    assert percent(share) == text


def test_a_host_fallback_entry() -> None:
    lines = render_event(CONV, index=2, run_macs=1_427_000)
    assert lines == [
        "2. host fallback (ran on the host, not the DUT): conv2d  (x3 calls, 884,736 host MACs, "
        "62% of the test's MACs)",
        "   at /elsewhere/models.py:14  >  y = self.conv(x.double())",
        "   shapes: x[2, 3, 32, 32] w[16, 3, 3, 3]",
        f"   why: {WHY}",
        "   also at /elsewhere/models.py:20 (x2)",
    ]


def test_one_call_without_the_tests_macs_and_without_other_sites() -> None:
    event = BreakEvent(
        kind="host_fallback", gb_type="Host fallback: bmm", reason="why", calls=1, macs=16
    )
    assert render_event(event) == [
        "host fallback (ran on the host, not the DUT): bmm  (1 call, 16 host MACs)",
        "at <unknown location>",
        "why: why",
    ]


def test_also_at_names_three_sites_then_counts_the_rest() -> None:
    others = tuple(OtherSite(f"/x/m{i}.py", i, 1 + i % 2) for i in range(1, 7))
    event = BreakEvent(
        kind="host_fallback", gb_type="Host fallback: addmm", reason="r", calls=9, also_at=others
    )
    assert render_event(event)[-1] == (
        "also at /x/m1.py:1 (x2), /x/m2.py:2, /x/m3.py:3 (x2) (+3 more)"
    )


def test_the_message_shares_host_macs_of_all_the_tests_macs() -> None:
    figures = Figures(graphs=1, dut_ops=1, host_fallbacks=3, macs=542264, host_macs=884736)
    message = render_failure(
        title="T", figures=figures, problems=[CONV], counts=[1], run_macs=884736 + 542264
    )
    lines = message.splitlines()
    assert lines[0] == (
        "T: 1 problem (graphs=1, graph_breaks=0, eager_frames=0, recompiles=0, dut_ops=1, "
        "host_fallbacks=3, macs=542264, host_macs=884736, cycles=0)"
    )
    assert "62% of the test's MACs" in lines[2]
    assert lines[-1] == (
        "To accept host fallbacks: @pytest.mark.no_graph_break(allow_host_fallback=True)."
    )


def test_host_fallbacks_after_another_break_say_how_to_accept_them_too() -> None:
    assert allow_hint([BRANCH, CONV]).splitlines() == [
        'To allow a known break: @pytest.mark.no_graph_break(allow=[r"GB0170"]) (regexes '
        "searched in the id, type, reason and file:line).",
        "To accept host fallbacks: @pytest.mark.no_graph_break(allow_host_fallback=True).",
    ]
    assert len(allow_hint([BRANCH]).splitlines()) == 1


def asic_record(nodeid: str, **figures: int) -> TestRecord:
    return TestRecord(nodeid, "passed", True, Figures(graphs=1, **figures))


def test_the_table_shows_the_dut_share_and_stays_aligned() -> None:
    records = [
        asic_record(
            "t.py::all_dut", dut_ops=2, host_fallbacks=0, macs=64, host_macs=0, cycles=12_345_678
        ),
        asic_record("t.py::mixed", dut_ops=1, host_fallbacks=1, macs=30, host_macs=50, cycles=9),
        # Recorded before host_macs existed: the share is unknown, not 100%.
        asic_record("t.py::old", dut_ops=1, host_fallbacks=0, macs=64, cycles=9),
        asic_record("t.py::no_macs", dut_ops=0, host_fallbacks=0, macs=0, host_macs=0, cycles=0),
        asic_record("t.py::eager"),
    ]
    lines = [text for text, _ in figures_table(records)]
    assert lines == [
        "test           graphs  breaks   eager  recomp  dut_ops    host    dut%    cycles  outcome",
        "t.py::all_dut       1       0       0       0        2       0    100%  12345678  passed",
        "t.py::mixed         1       0       0       0        1       1   37.5%         9  passed",
        "t.py::old           1       0       0       0        1       0       -         9  passed",
        "t.py::no_macs       1       0       0       0        0       0       -         0  passed",
        "t.py::eager         1       0       0       0        -       -       -         -  passed",
    ]


def test_the_table_names_a_host_fallback_by_its_op_and_cost() -> None:
    record = TestRecord("t.py::x", "passed", True, Figures(graphs=1), (CONV,))
    assert figures_table([record])[-1][0] == (
        "    host fallback (ran on the host, not the DUT) at /elsewhere/models.py:14: conv2d "
        "(x3 calls, 884,736 host MACs)"
    )


# --------------------------------------------------------------------------- breaks' structure


def graph_break(*sites: CallSite, **fields: object) -> BreakEvent:
    defaults: dict[str, object] = {
        "kind": "graph_break",
        "gb_type": "Call to `torch._dynamo.graph_break()`",
        "gb_id": "GB0025",
        "file": "helpers.py",
        "line": 3,
        "source": "torch._dynamo.graph_break()",
        "reason": "User-inserted graph break.",
        "call_sites": sites,
    }
    return BreakEvent(**{**defaults, **fields})  # type: ignore[arg-type]


TEST_LINE = CallSite("test_m.py", 9, "f(x)")


def test_one_call_chain_reads_like_a_traceback_innermost_first() -> None:
    event = graph_break(CallSite("m.py", 20, "return helper(x)"), TEST_LINE)
    assert render_event(event, 3)[:4] == [
        "graph break GB0025: Call to `torch._dynamo.graph_break()`  (x3)",
        "at helpers.py:3  >  torch._dynamo.graph_break()",
        "called from m.py:20  >  return helper(x)",
        "called from test_m.py:9  >  f(x)",
    ]


def test_a_deep_chain_keeps_the_innermost_calls_and_the_tests_line() -> None:
    deep = [CallSite("m.py", line) for line in range(10, 16)]
    lines = render_event(graph_break(*deep, TEST_LINE))
    assert lines[2:6] == [
        "called from m.py:10",
        "called from m.py:11",
        "... (5 more calls)",
        "called from test_m.py:9  >  f(x)",
    ]


def test_a_break_reached_from_several_call_sites_is_one_entry_with_a_count_per_site() -> None:
    problems = [
        graph_break(CallSite("m.py", 20, "r.a = 1"), TEST_LINE),
        BRANCH,
        graph_break(CallSite("m.py", 21, "r.b = 2"), TEST_LINE),
    ]
    message = render_failure(title="T", figures=Figures(), problems=problems, counts=[1, 1, 2])
    assert message.splitlines()[:9] == [
        "T: 4 problems (graphs=0, graph_breaks=0, eager_frames=0, recompiles=0)",
        "",
        "1. graph break GB0025: Call to `torch._dynamo.graph_break()`  (x3)",
        "   at helpers.py:3  >  torch._dynamo.graph_break()",
        "   called from m.py:20  >  r.a = 1",
        "   called from m.py:21  >  r.b = 2  (x2)",
        "   all called from test_m.py:9  >  f(x)",
        "   why: User-inserted graph break.",
        "",
    ]
    assert "2. graph break GB0170: Data-dependent branching" in message


def test_a_chain_shows_the_root_cause_then_what_it_caused() -> None:
    event = graph_break(
        kind="eager_fallback",
        chain=(
            ChainLink("GB0025", "Call to `torch._dynamo.graph_break()`", "User-inserted."),
            ChainLink("GB0066", "Graph break under GenericContextWrappingVariable", "In a cm."),
        ),
        library="contextlib (contextlib.py:144, in __exit__)",
    )
    lines = render_event(event)
    assert lines[0] == "eager fallback GB0025 → GB0066: Call to `torch._dynamo.graph_break()`"
    assert lines[2] == "inside contextlib (contextlib.py:144, in __exit__)"
    assert "then GB0066: In a cm." in lines


def test_hints_shared_by_several_breaks_are_shown_once() -> None:
    first = graph_break(hints=("Remove the call.",), link="https://x/gb0025.html")
    second = dataclasses.replace(first, line=7)
    lines = render_failure(
        title="T", figures=Figures(), problems=[first, second], counts=[1, 1]
    ).splitlines()
    assert lines.count("   hint: Remove the call.") == 1
    assert "   hints and docs: as for 1." in lines


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("marker", '@pytest.mark.no_graph_break(allow=[r"GB0170"])'),
        ("check", 'report.check(allow=[r"GB0170"])'),
    ],
)
def test_the_allow_hint_is_spelled_for_where_the_check_runs(spelling: str, expected: str) -> None:
    assert expected in allow_hint([BRANCH], spelling=spelling)
    assert allow_hint([CONV], spelling="check") == (
        "To accept host fallbacks: report.check(allow_host_fallback=True)."
    )


def test_a_relative_path_is_the_users_already() -> None:
    assert short_path("models.py", "/elsewhere") == "models.py"


def test_the_json_of_an_event_adds_its_chain_call_sites_and_library_only_when_set() -> None:
    event = graph_break(
        CallSite("m.py", 20, "r.a = 1"),
        chain=(ChainLink("GB0025", "a"), ChainLink(None, "torch.cond not captured whole")),
        library="os (<frozen os>:685, in __setitem__)",
    )
    data = event.to_json()
    assert data["chain"] == ["GB0025", "torch.cond not captured whole"]
    back = tuple(ChainLink.from_label(label) for label in data["chain"])
    assert [link.gb_id for link in back] == ["GB0025", None]
    assert [link.label for link in back] == data["chain"]
    assert data["call_sites"] == [{"file": "m.py", "line": 20, "source": "r.a = 1"}]
    assert data["library"] == "os (<frozen os>:685, in __setitem__)"
    basic = {"kind", "gb_id", "gb_type", "file", "line", "reason", "owner"}
    assert set(BRANCH.to_json()) == {*basic, "fix"}
    unknown = dataclasses.replace(BRANCH, gb_id="GB9999", fix=None)
    assert set(unknown.to_json()) == basic
    # An owner not known (a report written before owners) is left out, not written as null.
    assert "owner" not in dataclasses.replace(BRANCH, owner=None).to_json()


def test_callers_a_call_site_does_not_share_are_named_on_its_line() -> None:
    problems = [
        graph_break(CallSite("m.py", 20, "r.a = 1"), CallSite("m.py", 30), TEST_LINE),
        graph_break(CallSite("m.py", 21, "r.b = 2"), TEST_LINE),
    ]
    lines = render_failure(title="T", figures=Figures(), problems=problems, counts=[1, 1])
    assert lines.splitlines()[4:7] == [
        "   called from m.py:20 (from m.py:30)  >  r.a = 1",
        "   called from m.py:21  >  r.b = 2",
        "   all called from test_m.py:9  >  f(x)",
    ]


def test_the_table_fits_the_width_shortening_node_ids_from_the_left() -> None:
    """The figures and the outcome are what the table is for: a long node id gives way, from
    the left (its end names the test); a break line is cut at the right."""
    long_id = "tests/models/vision/test_convnext.py::TestConvNext::test_compiles_whole[batch4]"
    records = [
        TestRecord(long_id, "passed", False, Figures(graphs=2, graph_breaks=1), (BRANCH,)),
        TestRecord("t.py::short", "failed", True, Figures(graphs=1)),
    ]
    full = [text for text, _ in figures_table(records)]
    assert full[1].startswith(long_id + "       2")  # no width: the whole id
    lines = [text for text, _ in figures_table(records, width=72)]
    assert all(len(line) <= 72 for line in lines), lines
    assert lines == [
        "test                             graphs  breaks   eager  recomp  outcome",
        "...:test_compiles_whole[batch4]       2       1       0       0  passed",
        "    graph break GB0170 at /elsewhere/models.py:9: Data-dependent bran...",
        "t.py::short                           1       0       0       0  failed",
    ]
    # However narrow: the figures stay whole, the id keeps 20 characters, the line wraps.
    narrow = [text for text, _ in figures_table(records, width=40)]
    assert narrow[1].split()[1:] == ["2", "1", "0", "0", "passed"]
    assert len(narrow[1].split()[0]) == 20


def test_a_table_without_rows_has_no_header() -> None:
    assert figures_table([]) == []
