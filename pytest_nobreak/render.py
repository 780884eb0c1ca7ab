"""The failure message: every break, a few lines each, instead of Dynamo's 40-line warnings."""

from __future__ import annotations

import os
from collections.abc import Sequence

from pytest_nobreak.events import BreakEvent, Figures, OtherSite

#: Breaks listed in full; the rest are summarised in one line, so a message stays ~60 lines.
MAX_LISTED = 8
MAX_HINTS = 2
#: Other sites of one host fallback named on its "also at" line before "(+N more)".
MAX_ALSO_AT = 3
_MAX_TEXT = 240

KIND_LABELS = {
    "graph_break": "graph break",
    "eager_fallback": "eager fallback",
    "backend_error": "backend compiler fallback (whole frame ran eagerly)",
    "recompile_limit": "recompile limit hit (unmatched inputs run eagerly)",
    "recompile": "too many recompiles",
    "host_fallback": "host fallback (ran on the host, not the DUT)",
}


def short_path(path: str | None, root: str | None = None) -> str | None:
    """``path`` relative to ``root`` (default: the working directory) when it lies below it."""
    if path is None:
        return None
    root = root or os.getcwd()
    try:
        rel = os.path.relpath(path, root)
    except ValueError:  # another drive on Windows
        return path
    return path if rel.startswith("..") else rel


def _clip(text: str, limit: int = _MAX_TEXT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def percent(share: float) -> str:
    """A share as a user reads it: ``100%``, ``62%``, ``37.5%``, ``<0.1%``.

    Never rounds to ``0%`` or ``100%`` when it is not exactly that: "100% on the DUT" must mean
    that nothing ran on the host.
    """
    if share <= 0:
        return "0%"
    if share >= 1:
        return "100%"
    text = f"{share * 100:.1f}".removesuffix(".0")
    if text == "0":
        return "<0.1%"
    if text == "100":
        return ">99.9%"
    return f"{text}%"


def host_fallback_summary(event: BreakEvent, run_macs: int | None = None) -> str:
    """``x3 calls, 884,736 host MACs, 62% of the test's MACs``: what a host fallback cost.

    ``run_macs`` is every MAC (DUT and host) the test ran; without it the share is left out.
    """
    calls = event.calls or 1
    parts = [f"x{calls} calls" if calls > 1 else "1 call"]
    if event.macs is not None:
        parts.append(f"{event.macs:,} host MACs")
        if run_macs:
            parts.append(f"{percent(event.macs / run_macs)} of the test's MACs")
    return ", ".join(parts)


def _where(file: str | None, line: int | None) -> str:
    where = short_path(file) or "<unknown location>"
    return where if line is None else f"{where}:{line}"


def _also_at(sites: Sequence[OtherSite]) -> str:
    named = [
        _where(site.file, site.line) + (f" (x{site.calls})" if site.calls > 1 else "")
        for site in sites[:MAX_ALSO_AT]
    ]
    more = len(sites) - MAX_ALSO_AT
    return ", ".join(named) + (f" (+{more} more)" if more > 0 else "")


def render_event(
    event: BreakEvent,
    count: int = 1,
    index: int | None = None,
    *,
    run_macs: int | None = None,
    brief: bool = False,
) -> list[str]:
    """The lines of one break: what, where (with the source line), why, hints, docs.

    A host fallback reads: the op with its calls and host MACs (a share of ``run_macs``, the
    test's MACs, when given), where, the shapes of its first call, why, and its other sites.
    ``brief``: the first three lines, what, where and why (the warning of an unmarked test).
    """
    label = KIND_LABELS.get(event.kind, event.kind)
    gb = f" {event.gb_id}" if event.gb_id else ""
    prefix = f"{index}. " if index is not None else ""
    pad = " " * len(prefix)
    host = event.kind == "host_fallback"
    if host:
        cost = f"  ({host_fallback_summary(event, run_macs)})"
    else:
        cost = f"  (x{count})" if count > 1 else ""
    lines = [f"{prefix}{label}{gb}: {event.title}{cost}"]
    source = f"  >  {_clip(event.source, 100)}" if event.source else ""
    lines.append(f"{pad}at {_where(event.file, event.line)}{source}")
    if host and event.detail and not brief:
        lines.append(f"{pad}shapes: {event.detail}")
    if event.reason and event.reason != event.gb_type:
        lines.append(f"{pad}why: {_clip(event.reason)}")
    if event.also_at:
        lines.append(f"{pad}also at {_also_at(event.also_at)}")
    for hint in event.hints[:MAX_HINTS]:
        lines.append(f"{pad}hint: {_clip(hint)}")
    if event.link:
        lines.append(f"{pad}docs: {event.link}")
    return lines[:3] if brief else lines


def render_failure(
    *,
    title: str,
    figures: Figures,
    problems: Sequence[BreakEvent],
    counts: Sequence[int],
    run_macs: int | None = None,
) -> str:
    """The whole message: a summary line, each break, and how to allow a known one.

    ``run_macs``: every MAC the test ran (DUT and host), for the share of each host fallback.
    """
    n = sum(counts)
    summary = ", ".join(f"{k}={v}" for k, v in figures.as_dict().items())
    lines = [f"{title}: {n} problem{'s' if n != 1 else ''} ({summary})"]
    for i, (event, count) in enumerate(zip(problems, counts, strict=True), start=1):
        if i > MAX_LISTED:
            rest = len(problems) - MAX_LISTED
            lines.append(f"... and {rest} more (see --nobreak-json for all of them)")
            break
        lines.append("")
        lines.extend(render_event(event, count, index=i, run_macs=run_macs))
    lines.append("")
    lines.append(allow_hint(problems))
    return "\n".join(lines)


def allow_hint(problems: Sequence[BreakEvent]) -> str:
    """How to tolerate these breaks, naming the first one's id (or type) as the example.

    When host fallbacks come after other breaks, a second line says how to accept them too.
    """
    first = problems[0] if problems else None
    host = "To accept host fallbacks: @pytest.mark.no_graph_break(allow_host_fallback=True)."
    if first is not None and first.kind == "host_fallback":
        return host
    if first is not None and first.kind == "recompile":
        hint = "To accept more recompiles: @pytest.mark.no_graph_break(max_recompiles=N)."
    else:
        example = (first.gb_id or first.gb_type) if first is not None else "GB0170"
        hint = (
            "To allow a known break: "
            f'@pytest.mark.no_graph_break(allow=[r"{_regex_escape(example)}"])'
            " (regexes searched in the id, type, reason and file:line)."
        )
    if any(p.kind == "host_fallback" for p in problems):
        hint += "\n" + host
    return hint


def _regex_escape(text: str) -> str:
    out = []
    for ch in text[:60]:
        out.append("\\" + ch if ch in r".^$*+?{}[]\|()" else ch)
    return "".join(out)
