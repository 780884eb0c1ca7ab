"""One test of the --nobreak-html page, opened: its breaks, its DUT section (GEMMs, op
families, host fallbacks, syncs) and each event with the user's lines; and the escaping every
part of the page goes through."""

from __future__ import annotations

import collections
import dataclasses
import html
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from pytest_nobreak.gate.baseline import Change
from pytest_nobreak.report.json_report import TestRecord
from pytest_nobreak.watch.events import (
    EXPORT_KINDS,
    OP_FAMILIES,
    BreakEvent,
    GemmRecord,
    op_family,
)
from pytest_nobreak.watch.render import (
    KIND_LABELS,
    calls_text,
    event_line,
    host_fallback_summary,
    percent,
)


@dataclasses.dataclass(frozen=True)
class Row:
    record: TestRecord
    changes: tuple[Change, ...]
    regressed: bool

    @property
    def host_events(self) -> list[BreakEvent]:
        return [e for e in self.record.breaks if e.kind == "host_fallback"]

    @property
    def sync_events(self) -> list[BreakEvent]:
        return [e for e in self.record.breaks if e.kind == "host_sync"]

    @property
    def stalled_cycles(self) -> int | None:
        """The DUT cycles the test's host syncs cost: its cycles beyond those of its GEMMs
        (each sync the device stalled for adds a fixed cost to ``cycles``); ``None`` when it
        stalled for none, or the figures do not tell."""
        figures = self.record.figures
        if not figures.syncs or figures.cycles is None:
            return None
        stalled = figures.cycles - sum(g.cycles * g.calls for g in self.record.gemms)
        return stalled if stalled > 0 else None

    @property
    def utilization(self) -> float | None:
        """The cycle-weighted mean of the GEMMs' utilization (the test's MACs over what the
        array could have done in its cycles, on one device)."""
        weight = sum(g.cycles * g.calls for g in self.record.gemms)
        if not weight:
            return None
        return sum(g.utilization * g.cycles * g.calls for g in self.record.gemms) / weight

    def flags(self) -> list[str]:
        out = []
        figures = self.record.figures
        if (
            figures.graph_breaks
            or figures.eager_frames
            or any(e.kind not in _NOT_BREAKS for e in self.record.breaks)
        ):
            out.append("breaks")
        if self.host_events or self.record.figures.host_fallbacks:
            out.append("host")
        if self.sync_events or figures.host_syncs or figures.syncs:
            out.append("syncs")
        if self.record.figures.recompiles:
            out.append("recompiles")
        if figures.export_problems or any(e.kind in EXPORT_KINDS for e in self.record.breaks):
            out.append("export")
        if self.regressed:
            out.append("regressed")
        return out

    def has_details(self) -> bool:
        record = self.record
        return bool(
            record.breaks or record.recompile_reasons or record.gemms or record.figures.syncs
        )


#: The kinds of event that are no break of the graph: it ran whole, on the host or waiting.
_NOT_BREAKS = ("host_fallback", "host_sync", *EXPORT_KINDS)


def details(row: Row) -> str:
    record = row.record
    out = []
    if record.gemms or row.host_events or record.figures.syncs:
        out.append(_dut_section(row))
    problems = [e for e in record.breaks if e.kind not in _NOT_BREAKS]
    # Under scope="own" a library's breaks did not fail the test: they are listed apart.
    mine, theirs = record.split_by_scope(problems)
    if mine:
        out.append("<h3>Breaks</h3>" + "".join(_event(e) for e in mine))
    if theirs:
        out.append(
            "<h3 class='theirs'>Not yours (reported, not failed)</h3>"
            + "".join(_event(e) for e in theirs)
        )
    exported = [e for e in record.breaks if e.kind in EXPORT_KINDS]
    if exported:
        out.append("<h3>Export</h3>" + "".join(_event(e) for e in exported))
    if row.host_events:
        out.append("<h3>Host fallbacks</h3>" + _host_table(row.host_events))
        out.append("".join(_event(e) for e in row.host_events))
    if row.sync_events:
        out.append("<h3>Host syncs</h3>" + "".join(_event(e) for e in row.sync_events))
    if record.recompile_reasons:
        items = "".join(f"<li><code>{text(r)}</code></li>" for r in record.recompile_reasons)
        out.append(f"<h3>Recompiles</h3><ol class='reasons'>{items}</ol>")
    return "".join(out)


def _dut_section(row: Row) -> str:
    figures = row.record.figures
    facts = []
    if figures.cycles is not None:
        facts.append(f"{figures.cycles:,} cycles")
    if row.utilization is not None:
        facts.append(f"utilization {percent(row.utilization)}")
    if figures.dut_share is not None:
        facts.append(f"{percent(figures.dut_share)} of the MACs on the DUT")
    if figures.syncs:
        facts.append(_syncs_text(figures.syncs, row.stalled_cycles))
    bars = _family_bars(row.record.gemms, row.host_events)
    gemms = _gemm_table(row.record.gemms) if row.record.gemms else ""
    return f"<h3>On the DUT</h3><p>{text(', '.join(facts))}</p>{bars}{gemms}"


def _family_bars(gemms: Iterable[GemmRecord], host: Iterable[BreakEvent]) -> str:
    """One bar per op family: the share of its MACs that ran on the DUT (green) and on the
    host (red)."""
    dut: collections.Counter[str] = collections.Counter()
    off: collections.Counter[str] = collections.Counter()
    for gemm in gemms:
        dut[gemm.family] += gemm.macs * gemm.calls
    for event in host:
        off[op_family(event.title)] += event.macs or 0
    rows = []
    for family in (*OP_FAMILIES, *sorted(set(dut) - set(OP_FAMILIES))):
        total = dut[family] + off[family]
        if not total:
            continue
        share = dut[family] / total
        label = f"{family}: {percent(share)} on the DUT"
        if off[family]:
            label += f", {off[family]:,} host MACs"
        rows.append(
            f"<div class='bar' role='img' aria-label={attr(label)} data-family={attr(family)}"
            f" data-share={attr(repr(share))}>"
            f"<span class='family'>{text(family)}</span><span class='track'>"
            f"<span class='dut' style='width:{share * 100:.2f}%'></span></span>"
            f"<span class='label'>{text(label)}</span></div>"
        )
    return "<div class='bars'>" + "".join(rows) + "</div>" if rows else ""


def _gemm_table(gemms: Sequence[GemmRecord]) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "device",
            "family",
            "m×k×n",
            "calls",
            "cycles",
            "util",
            "mapping",
            "compute",
            "bound",
        )
    )
    rows = []
    for g in sorted(gemms, key=lambda g: -g.macs * g.calls):
        cells = (
            g.device,
            g.family,
            f"{g.m}×{g.k}×{g.n}",
            f"{g.calls:,}",
            f"{g.cycles:,}",
            percent(g.utilization),
            percent(g.mapping_efficiency),
            percent(g.compute_utilization),
            g.bound,
        )
        rows.append("<tr>" + "".join(f"<td>{text(c)}</td>" for c in cells) + "</tr>")
    return (
        f"<table class='gemms'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _host_table(events: Sequence[BreakEvent]) -> str:
    """Host fallbacks grouped by op: calls, host MACs and reasons."""
    groups: dict[str, list[BreakEvent]] = {}
    for event in events:
        groups.setdefault(event.title, []).append(event)
    rows = []
    for op, group in sorted(groups.items(), key=lambda kv: -sum(e.macs or 0 for e in kv[1])):
        calls = sum(e.calls or 1 for e in group)
        macs = sum(e.macs or 0 for e in group)
        reasons = "; ".join(dict.fromkeys(e.reason for e in group))
        rows.append(
            f"<tr><td><code>{text(op)}</code></td><td class='num'>{calls:,}</td>"
            f"<td class='num'>{macs:,}</td><td>{text(reasons)}</td></tr>"
        )
    return (
        "<table class='host'><thead><tr><th>op</th><th>calls</th><th>host MACs</th>"
        f"<th>why</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _event(event: BreakEvent) -> str:
    parts = [f"<div class='event {_attr_class(event.kind)}'>"]
    parts.append(f"<p class='what'>{text(event_line(event))}</p>")
    if not event.own:
        parts.append(f"<p class='owner'>owner: {text(event.owned_by)}</p>")
    if event.reason:
        parts.append(f"<p class='reason'>{text(event.reason)}</p>")
    parts.append(_source(event))
    if event.call_sites:
        sites = "".join(
            f"<li><code>{text(_where(s.file, s.line))}</code>"
            + (f" <code class='src'>{text(s.source)}</code>" if s.source else "")
            + "</li>"
            for s in event.call_sites
        )
        parts.append(f"<p class='label'>called from</p><ul class='sites'>{sites}</ul>")
    if event.also_at:
        also = ", ".join(_where(s.file, s.line) for s in event.also_at)
        parts.append(f"<p class='also'>also at {text(also)}</p>")
    if event.kind == "host_fallback":
        summary = host_fallback_summary(event)
        if event.detail:
            summary += f"; first call {event.detail}"
        parts.append(f"<p class='cost'>{text(summary)}</p>")
    elif event.kind == "host_sync":
        summary = calls_text(event.calls or 1) + ", each a device→host round trip"
        if event.detail:
            summary += f"; {event.detail}"
        parts.append(f"<p class='cost'>{text(summary)}</p>")
    elif event.kind in EXPORT_KINDS and event.detail:
        parts.append(f"<p class='mode'>mode: {text(event.detail)}</p>")
    if event.library:
        parts.append(f"<p class='library'>inside {text(event.library)}</p>")
    if event.hints:
        hints = "".join(f"<li>{text(h)}</li>" for h in event.hints)
        parts.append(f"<p class='label'>hints</p><ul class='hints'>{hints}</ul>")
    if event.fix:
        parts.append(f"<p class='label'>fix</p><pre class='fix'>{text(event.fix)}</pre>")
    if event.link and _is_web_link(event.link):
        parts.append(
            f"<p class='docs'><a href={attr(event.link)} rel='noopener noreferrer'>"
            f"{text(event.link)}</a></p>"
        )
    parts.append("</div>")
    return "".join(parts)


def _source(event: BreakEvent) -> str:
    """The lines around the user's line, numbered, with that line marked; its text alone when
    the lines were not read."""
    if event.context and event.context_start is not None:
        lines = []
        for number, source_line in enumerate(event.context, event.context_start):
            mark = number == event.line
            line = f"<span class='ln'>{number}</span>{text(source_line) or ' '}"
            lines.append(f"<mark>{line}</mark>" if mark else f"<span>{line}</span>")
        where = _where(event.file, event.line)
        return (
            f"<figure class='source'><figcaption>{text(where)}</figcaption>"
            # Each line is a block of its own: a newline between them would be a blank line.
            f"<pre>{''.join(lines)}</pre></figure>"
        )
    if event.source:
        return f"<pre class='source'><mark>{text(event.source)}</mark></pre>"
    return ""


def _syncs_text(syncs: int, stalled: int | None) -> str:
    """``3 host syncs (3,000 cycles stalled)``; the cycles only when known."""
    what = f"{syncs:,} host sync{'s' if syncs != 1 else ''}"
    return what + (f" ({stalled:,} cycles stalled)" if stalled else "")


def text(value: object) -> str:
    return html.escape(str(value), quote=False)


def attr(value: object) -> str:
    """A quoted attribute value: every quote and angle bracket escaped."""
    return '"' + html.escape(str(value), quote=True) + '"'


def _attr_class(kind: str) -> str:
    return kind if kind in KIND_LABELS else "other"


def outcome_class(outcome: str) -> str:
    return outcome if outcome.isalpha() else "other"


def _where(file: str | None, line: int | None) -> str:
    where = file or "<unknown location>"
    return where if line is None else f"{where}:{line}"


def _is_web_link(link: str) -> bool:
    # A docs link from the run is shown as a link only if it is a web address: a
    # "javascript:" URL must never become clickable.
    return urlsplit(link).scheme in ("http", "https")
