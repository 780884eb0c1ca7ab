"""The failure message: every break, a few lines each, instead of Dynamo's 40-line warnings."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from pytest_nobreak.watch.events import EXPORT_KINDS, BreakEvent, CallSite, Figures, OtherSite

#: Breaks listed in full; the rest are summarised in one line, so a message stays ~60 lines.
MAX_LISTED = 8
MAX_HINTS = 2
#: Other sites of one host fallback named on its "also at" line before "(+N more)".
MAX_ALSO_AT = 3
#: Call sites of one break listed (one line each) before "(+N more call sites)".
MAX_CALL_SITES = 4
#: Frames of one call chain shown: the innermost ones and, always, the outermost (the test's).
MAX_CALL_DEPTH = 3
_MAX_TEXT = 240
_ELIDED = "..."

KIND_LABELS = {
    "graph_break": "graph break",
    "eager_fallback": "eager fallback",
    "partial_fallback": "eager fallback after a break (the rest of the function ran eagerly)",
    "backend_error": "backend compiler fallback (whole frame ran eagerly)",
    "recompile_limit": "recompile limit hit (unmatched inputs run eagerly)",
    "recompile": "too many recompiles",
    "host_fallback": "host fallback (ran on the host, not the DUT)",
    "compile_error": "compile error (raised to the caller, nothing ran)",
    "host_sync": "host sync (the host waited for a device value)",
    "export_error": "export failed",
    "export_unsound": "unsound export (draft_export guessed)",
    "specialized_dim": "dynamic dimension specialized",
    "export_mismatch": "exported programs disagree",
    "export_sync": "host sync in the exported program",
}

#: How a failure message spells the options that tolerate a break: the marker's or ``check()``'s.
_OPTIONS_SPELLING = {
    "marker": "@pytest.mark.no_graph_break({})",
    "check": "report.check({})",
}
_FIRST_PARTY_SPELLING = {"marker": "nobreak_first_party", "check": "watch(first_party=[...])"}


def short_path(path: str | None, root: str | None = None) -> str | None:
    """``path`` relative to ``root`` (default: the working directory) when it lies below it.

    A relative path is already the user's (events hold paths relative to the rootdir).
    """
    if path is None or not os.path.isabs(path):
        return path
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
    parts = [calls_text(event.calls or 1)]
    if event.macs is not None:
        parts.append(f"{event.macs:,} host MACs")
        if run_macs:
            parts.append(f"{percent(event.macs / run_macs)} of the test's MACs")
    return ", ".join(parts)


def calls_text(calls: int) -> str:
    """``1 call``, ``x3 calls``."""
    return f"x{calls} calls" if calls > 1 else "1 call"


def event_line(event: BreakEvent) -> str:
    """One break in one line, as the compile report's table lists it under its test:
    ``graph break GB0170 at models.py:12: Data-dependent branching``."""
    where = short_path(event.file) or "<unknown>"
    if event.line is not None:
        where += f":{event.line}"
    gb = f" {event.ids}" if event.ids else ""
    what = event.title
    if event.kind == "host_fallback":
        what += f" ({host_fallback_summary(event)})"
    elif event.kind == "host_sync":
        what += f" ({calls_text(event.calls or 1)})"
    inside = "" if event.own else f" (inside {event.owner})"
    return f"{KIND_LABELS.get(event.kind, event.kind)}{gb} at {where}{inside}: {what}"


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
    others: Sequence[tuple[BreakEvent, int]] = (),
    same_hints_as: int | None = None,
) -> list[str]:
    """The lines of one break: what, where (with the source line and the calls that led
    there), why, what it caused, the fix (:mod:`pytest_nobreak.watch.fixes`), hints, docs.

    A host fallback reads: the op with its calls and host MACs (a share of ``run_macs``, the
    test's MACs, when given), where, the shapes of its first call, why, and its other sites.
    ``others``: the same break reached through other call sites, with their counts.
    ``same_hints_as``: the number of an earlier entry with the same hints and docs, which are
    then not repeated.
    """
    label = KIND_LABELS.get(event.kind, event.kind)
    ids = f" {event.ids}" if event.ids else ""
    prefix = f"{index}. " if index is not None else ""
    pad = " " * len(prefix)
    host = event.kind == "host_fallback"
    total = count + sum(n for _, n in others)
    if host:
        cost = f"  ({host_fallback_summary(event, run_macs)})"
    elif event.kind == "host_sync":
        cost = f"  ({calls_text(event.calls or 1)})"
    else:
        cost = f"  (x{total})" if total > 1 else ""
    head = f"{prefix}{label}{ids}: {event.title}{cost}"
    source = f"  >  {_clip(event.source, 100)}" if event.source else ""
    at = f"{pad}at {_where(event.file, event.line)}{source}"
    why = (
        [f"{pad}why: {_clip(event.reason)}"]
        if event.reason and event.reason != event.gb_type
        else []
    )
    lines = [head, at]
    if event.library:
        lines.append(f"{pad}inside {event.library}")
    if not event.own:
        lines.append(f"{pad}owner: {event.owner}")
    lines.extend(pad + line for line in _call_site_lines([(event, count), *others]))
    if host and event.detail:
        lines.append(f"{pad}shapes: {event.detail}")
    lines.extend(why)
    for link in event.chain[1:]:
        lines.append(f"{pad}then {link.label}: {_clip(link.reason or link.gb_type)}")
    if event.kind == "compile_error" and event.detail:
        lines.append(f"{pad}raised: {event.detail}")
    if event.kind in EXPORT_KINDS and event.detail:
        lines.append(f"{pad}mode: {event.detail}")
    if event.also_at:
        lines.append(f"{pad}also at {_also_at(event.also_at)}")
    if event.fix:
        lines.append(f"{pad}fix: {event.fix}")
    if same_hints_as is not None:
        lines.append(f"{pad}hints and docs: as for {same_hints_as}.")
        return lines
    for hint in event.hints[:MAX_HINTS]:
        lines.append(f"{pad}hint: {_clip(hint)}")
    if event.link:
        lines.append(f"{pad}docs: {event.link}")
    return lines


def _call_site_lines(members: Sequence[tuple[BreakEvent, int]]) -> list[str]:
    """``called from`` lines, innermost first: one chain as a short traceback; several as one
    line per call site (with its count), then the callers they share."""
    chains = [(event.call_sites, n) for event, n in members if event.call_sites]
    if not chains:
        return []
    if len(chains) == 1:
        return _prefixed("called from ", _deep(chains[0][0]))
    shared = _shared_callers([sites for sites, _ in chains])
    lines = []
    for sites, n in chains[:MAX_CALL_SITES]:
        own = sites[: len(sites) - len(shared)]
        # The site's own line; the callers between it and the shared ones, named only.
        via = f" (from {', '.join(_where(s.file, s.line) for s in own[1:])})" if own[1:] else ""
        where = _site(own[0], via) if own else "directly"
        lines.append(f"called from {where}" + (f"  (x{n})" if n > 1 else ""))
    if len(chains) > MAX_CALL_SITES:
        lines.append(f"(+{len(chains) - MAX_CALL_SITES} more call sites)")
    lines.extend(_prefixed("all called from ", _deep(shared)))
    return lines


def _prefixed(prefix: str, lines: list[str]) -> list[str]:
    return [line if line.startswith(_ELIDED) else prefix + line for line in lines]


def _shared_callers(chains: Sequence[tuple[CallSite, ...]]) -> tuple[CallSite, ...]:
    """The outermost call sites every chain ends with (the test's line, usually)."""
    shared: list[CallSite] = []
    for sites in zip(*(reversed(chain) for chain in chains), strict=False):
        if any(site != sites[0] for site in sites):
            break
        shared.append(sites[0])
    return tuple(reversed(shared))


def _deep(sites: Sequence[CallSite]) -> list[str]:
    """A chain a few frames deep; its outermost site (the test's line) is always shown."""
    if len(sites) <= MAX_CALL_DEPTH:
        return [_site(site) for site in sites]
    hidden = len(sites) - MAX_CALL_DEPTH + 1
    shown = [_site(site) for site in sites[: MAX_CALL_DEPTH - 1]]
    return [*shown, f"{_ELIDED} ({hidden} more calls)", _site(sites[-1])]


def _site(site: CallSite, via: str = "") -> str:
    source = f"  >  {_clip(site.source, 100)}" if site.source else ""
    return f"{_where(site.file, site.line)}{via}{source}"


def render_failure(
    *,
    title: str,
    figures: Figures,
    problems: Sequence[BreakEvent],
    counts: Sequence[int],
    run_macs: int | None = None,
    spelling: str = "marker",
    theirs: Mapping[str, int] | None = None,
) -> str:
    """The whole message: a summary line, each break, and how to allow a known one.

    ``theirs``: the problems a ``scope="own"`` verdict did not fail on, counted by owner; a
    last line says so, for the figures in the summary line count them.

    One break reached through several call sites is one entry listing them. ``run_macs``:
    every MAC the test ran (DUT and host), for the share of each host fallback. ``spelling``:
    how to pass the options that tolerate a break, ``"marker"`` or ``"check"`` (``watch()``).
    """
    n = sum(counts)
    # foreign_breaks only where there are some: it is the part of graph_breaks (and
    # eager_frames) that happened in a library, and a zero says nothing the line does not.
    summary = ", ".join(
        f"{k}={v}" for k, v in figures.as_dict().items() if v or k != "foreign_breaks"
    )
    lines = [f"{title}: {n} problem{'s' if n != 1 else ''} ({summary})"]
    groups: dict[tuple[object, ...], list[tuple[BreakEvent, int]]] = {}
    for event, count in zip(problems, counts, strict=True):
        groups.setdefault(event.site_key(), []).append((event, count))
    # Many breaks of one kind (a `print` in every layer) share their hints and docs link:
    # those are shown once, the first time.
    first_with: dict[tuple[object, ...], int] = {}
    for i, ((event, count), *others) in enumerate(groups.values(), start=1):
        if i > MAX_LISTED:
            rest = len(groups) - MAX_LISTED
            lines.append(f"... and {rest} more (see --nobreak-json for all of them)")
            break
        key = (event.link, event.hints[:MAX_HINTS])
        same = first_with.setdefault(key, i) if event.link or event.hints else None
        lines.append("")
        lines.extend(
            render_event(
                event,
                count,
                index=i,
                run_macs=run_macs,
                others=others,
                same_hints_as=same if same != i else None,
            )
        )
    lines.append("")
    lines.append(allow_hint(problems, spelling=spelling))
    if theirs:
        owners = ", ".join(f"{n} in {owner}" for owner, n in theirs.items())
        where = "the compile report lists them" if spelling == "marker" else "see report.breaks"
        lines.append(f'Reported, not failed (scope="own"): {owners}; {where}.')
    return "\n".join(lines)


def allow_hint(problems: Sequence[BreakEvent], *, spelling: str = "marker") -> str:
    """How to tolerate these problems: one line per kind among them, the breaks' first, naming
    the first break's id (or type) as the example: the root cause's id for a chain, which
    allows the whole chain."""
    options = _OPTIONS_SPELLING[spelling]
    kinds = {p.kind for p in problems}
    breaks = [p for p in problems if p.kind not in ("host_fallback", "host_sync", "recompile")]
    lines = []
    if breaks or not problems:
        first = breaks[0] if breaks else None
        example = (first.gb_id or first.gb_type) if first is not None else "GB0170"
        allow = f'allow=[r"{_regex_escape(example)}"]'
        lines.append(
            f"To allow a known break: {options.format(allow)}"
            " (regexes searched in the id, type, reason and file:line)."
        )
    if "recompile" in kinds:
        lines.append(f"To accept more recompiles: {options.format('max_recompiles=N')}.")
    syncs = sum(p.calls or 1 for p in problems if p.kind == "host_sync")
    if syncs:
        lines.append(
            f"To accept host syncs: {options.format(f'max_host_syncs={syncs}')} (the number "
            "this run executed; the test fails when it executes more)."
        )
    if "host_fallback" in kinds:
        lines.append(f"To accept host fallbacks: {options.format('allow_host_fallback=True')}.")
    # A recompile gate counts compiles, whatever code they were in: a scope does not change it.
    owners = list(
        dict.fromkeys(p.owned_by for p in problems if not p.own and p.kind != "recompile")
    )
    if owners:
        scope = options.format('scope="own"')
        yours = _FIRST_PARTY_SPELLING[spelling]
        lines.append(
            f"To fail only on problems in your own code: {scope} (those in "
            f"{', '.join(owners)} are then reported, not failed; {yours} names installed "
            "packages that are yours)."
        )
    return "\n".join(lines)


def _regex_escape(text: str) -> str:
    out = []
    for ch in text[:60]:
        out.append("\\" + ch if ch in r".^$*+?{}[]\|()" else ch)
    return "".join(out)
