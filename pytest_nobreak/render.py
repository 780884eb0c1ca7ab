"""The failure message: every break, a few lines each, instead of Dynamo's 40-line warnings."""

from __future__ import annotations

import os
from collections.abc import Sequence

from pytest_nobreak.events import BreakEvent, Figures

#: Breaks listed in full; the rest are summarised in one line, so a message stays ~60 lines.
MAX_LISTED = 8
MAX_HINTS = 2
_MAX_TEXT = 240

KIND_LABELS = {
    "graph_break": "graph break",
    "eager_fallback": "eager fallback",
    "backend_error": "backend compiler fallback (whole frame ran eagerly)",
    "recompile_limit": "recompile limit hit (unmatched inputs run eagerly)",
    "recompile": "too many recompiles",
    "host_fallback": "host fallback (linear ran on the host, not the DUT)",
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


def render_event(event: BreakEvent, count: int = 1, index: int | None = None) -> list[str]:
    """The lines of one break: what, where (with the source line), why, hints, docs."""
    label = KIND_LABELS.get(event.kind, event.kind)
    gb = f" {event.gb_id}" if event.gb_id else ""
    times = f"  (x{count})" if count > 1 else ""
    prefix = f"{index}. " if index is not None else ""
    pad = " " * len(prefix)
    lines = [f"{prefix}{label}{gb}: {event.gb_type}{times}"]
    where = short_path(event.file) or "<unknown location>"
    if event.line is not None:
        where = f"{where}:{event.line}"
    lines.append(f"{pad}at {where}" + (f"  >  {_clip(event.source, 100)}" if event.source else ""))
    if event.reason and event.reason != event.gb_type:
        lines.append(f"{pad}why: {_clip(event.reason)}")
    for hint in event.hints[:MAX_HINTS]:
        lines.append(f"{pad}hint: {_clip(hint)}")
    if event.link:
        lines.append(f"{pad}docs: {event.link}")
    return lines


def render_failure(
    *,
    title: str,
    figures: Figures,
    problems: Sequence[BreakEvent],
    counts: Sequence[int],
) -> str:
    """The whole message: a summary line, each break, and how to allow a known one."""
    n = sum(counts)
    summary = ", ".join(f"{k}={v}" for k, v in figures.as_dict().items())
    lines = [f"{title}: {n} problem{'s' if n != 1 else ''} ({summary})"]
    for i, (event, count) in enumerate(zip(problems, counts, strict=True), start=1):
        if i > MAX_LISTED:
            rest = len(problems) - MAX_LISTED
            lines.append(f"... and {rest} more (see --nobreak-json for all of them)")
            break
        lines.append("")
        lines.extend(render_event(event, count, index=i))
    lines.append("")
    lines.append(allow_hint(problems))
    return "\n".join(lines)


def allow_hint(problems: Sequence[BreakEvent]) -> str:
    """How to tolerate these breaks, naming the first one's id (or type) as the example."""
    first = problems[0] if problems else None
    if first is not None and first.kind == "host_fallback":
        return "To accept host fallbacks: @pytest.mark.no_graph_break(allow_host_fallback=True)."
    if first is not None and first.kind == "recompile":
        return "To accept more recompiles: @pytest.mark.no_graph_break(max_recompiles=N)."
    example = (first.gb_id or first.gb_type) if first is not None else "GB0170"
    return (
        f'To allow a known break: @pytest.mark.no_graph_break(allow=[r"{_regex_escape(example)}"])'
        " (regexes searched in the id, type, reason and file:line)."
    )


def _regex_escape(text: str) -> str:
    out = []
    for ch in text[:60]:
        out.append("\\" + ch if ch in r".^$*+?{}[]\|()" else ch)
    return "".join(out)
