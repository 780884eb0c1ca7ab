"""The ``--nobreak-html`` report: one self-contained page (inline CSS, JS and SVG, no network).

Rendered from the JSON report document (:mod:`pytest_nobreak.report.json_report`), so a pytest
run and ``python -m pytest_nobreak merge --html`` draw the same page from the same data. Pure: no
pytest, no torch.

Everything that comes from the run (test ids, paths, source lines, reasons, hints) is put in the
page through :func:`html.escape` only, as text or as a quoted attribute, and the page's script
reads nothing but ``data-`` attributes and its own URL fragment: no run data is ever inside a
``<script>`` or parsed as HTML. The script sorts and filters the table, opens a test's details
and keeps that state in the fragment (``#outcome=failed&has=breaks&sort=cycles-``), so a link
names a view.

>>> page = render_html({"version": 1, "torch": "2.13.0", "backend": "eager", "device": "",
...                     "tests": {}})
>>> page.startswith("<!DOCTYPE html>")
True
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_nobreak.gate.atomic import write_atomic
from pytest_nobreak.gate.baseline import Comparison
from pytest_nobreak.report.html_details import Row, attr, details, outcome_class, text
from pytest_nobreak.report.json_report import CHOICES_KEY, ROOFS_KEY, TestRecord
from pytest_nobreak.report.kernel_choices import shown
from pytest_nobreak.report.roofline import Point, Roof, render_svg
from pytest_nobreak.watch.events import (
    CORE_FIGURES,
    EXPORT_FIGURES,
    OWN,
    BreakEvent,
    op_family,
)
from pytest_nobreak.watch.render import (
    percent,
)

__all__ = ["HtmlReportError", "check_html_path", "render_html", "write_html"]

#: In every page's head: how a path that holds one of our pages is told from any other file.
GENERATOR = '<meta name="generator" content="pytest-nobreak">'

TITLE = "pytest-nobreak compile report"
#: The table's figure columns: (key in the row's data, header, tooltip).
_COLUMNS = (
    ("graphs", "graphs", "graphs compiled"),
    ("graph_breaks", "breaks", "graph breaks"),
    ("eager_frames", "eager", "frames that ran eagerly"),
    ("recompiles", "recomp", "recompiles"),
    (
        "host_syncs",
        "syncs",
        "host syncs: times a compiled graph made the host wait for a device value"
        " (.item(), a boolean mask, nonzero, unique, a copy to the host); '-': not measured",
    ),
    (
        "foreign_breaks",
        "foreign",
        "breaks and eager fallbacks in a library's code, not yours (nobreak_first_party names"
        " installed packages that are yours); '-': not measured",
    ),
    (
        "export_problems",
        "export",
        "problems of the test's exported programs (torch.export): failed modes, draft_export's"
        " findings, specialized dimensions, disagreeing programs; '-': the test exported nothing",
    ),
    (
        "specialized_dims",
        "static",
        "dimensions declared dynamic that an exported program made static or narrowed;"
        " '-': the test exported nothing",
    ),
    ("dut_ops", "dut ops", "GEMMs run on the DUT"),
    ("host_fallbacks", "host", "matmul-class calls that ran on the host"),
    ("dut_share", "dut%", "share of the test's MACs that ran on the DUT"),
    ("cycles", "cycles", "DUT cycles"),
    ("utilization", "util", "MACs / (array size x cycles), over the test's DUT GEMMs"),
)
#: The "has ..." filters: (name, label).
_FLAGS = (
    ("breaks", "breaks"),
    ("host", "host fallbacks"),
    ("syncs", "host syncs"),
    ("recompiles", "recompiles"),
    ("export", "export problems"),
    ("regressed", "regressions"),
)


def render_html(
    document: Mapping[str, Any],
    *,
    comparison: Comparison | None = None,
    baseline: str | None = None,
    title: str = TITLE,
) -> str:
    """The page for a JSON report ``document``.

    ``comparison`` is the run's comparison with the baseline file ``baseline`` (a path, as
    shown); without it the page has no baseline column. Raises ``ValueError`` for a malformed
    document entry.
    """
    records = [TestRecord.from_json(nodeid, entry) for nodeid, entry in document["tests"].items()]
    records.sort(key=lambda r: r.nodeid)
    changes = comparison.by_test() if comparison is not None else {}
    regressions = {c.nodeid for c in comparison.regressions} if comparison is not None else set()
    missing = set(comparison.missing) if comparison is not None else set()
    rows = [
        Row(record, changes.get(record.nodeid, ()), record.nodeid in regressions)
        for record in records
    ]
    asic = any(r.record.figures.dut_ops is not None for r in rows)
    body = [
        _header(document, rows, comparison, baseline, title),
        _controls(rows),
        _table(rows, asic=asic, baselined=comparison is not None, missing=missing),
        _host_summary(rows),
        _sync_summary(rows),
        _roofline(document, rows),
    ]
    return _PAGE.format(
        generator=GENERATOR,
        title=text(title),
        style=_STYLE,
        body="\n".join(part for part in body if part),
        script=_SCRIPT,
        script_hash=_SCRIPT_HASH,
    )


# --------------------------------------------------------------------------- one test


# --------------------------------------------------------------------------- sections


def _header(
    document: Mapping[str, Any],
    rows: Sequence[Row],
    comparison: Comparison | None,
    baseline: str | None,
    title: str,
) -> str:
    outcomes = collections.Counter(r.record.outcome for r in rows)
    facts = [
        ("torch", document.get("torch") or "?"),
        ("backend", document.get("backend") or "?"),
        ("device", document.get("device") or "-"),
    ]
    if document.get("asic_sim"):
        facts.append(("simulator", f"v{document['asic_sim']}"))
    if document.get("host_gemm"):
        facts.append(("host GEMM", str(document["host_gemm"])))
    if document.get("host_passes"):
        facts.append(("host passes", str(document["host_passes"])))
    if document.get(CHOICES_KEY):
        facts.append(("host GEMM by timing", shown(document[CHOICES_KEY])))
    facts.append(("baseline", baseline or "none"))
    counts = [f"{len(rows)} watched tests"]
    counts += [f"{n} {outcome}" for outcome, n in sorted(outcomes.items())]
    if comparison is not None:
        regressed = len({c.nodeid for c in comparison.regressions})
        counts.append(f"{regressed} regressed")
        if comparison.missing:
            counts.append(f"{len(comparison.missing)} not in the baseline")
        if comparison.version_mismatch:
            counts.append(f"baseline from {comparison.version_mismatch}: regressions do not fail")
    with_breaks = sum(1 for r in rows if "breaks" in r.flags())
    with_host = sum(1 for r in rows if "host" in r.flags())
    counts += [f"{with_breaks} with breaks", f"{with_host} with host fallbacks"]
    if any(r.record.figures.host_syncs is not None or r.sync_events for r in rows):
        # Not on the page of a report written before host syncs were counted: there "0 with
        # host syncs" would be a figure nobody measured.
        counts.append(f"{sum(1 for r in rows if 'syncs' in r.flags())} with host syncs")
    dl = "".join(f"<div><dt>{text(k)}</dt><dd>{text(v)}</dd></div>" for k, v in facts)
    return (
        f"<header><h1>{text(title)}</h1><dl class='facts'>{dl}</dl>"
        f"<p class='counts' id='counts'>{text(' · '.join(counts))}</p></header>"
    )


def _owners(events: Iterable[BreakEvent]) -> list[str]:
    """Whose code the events happened in, the user's (``own``) first."""
    owners = {e.owned_by for e in events}
    return sorted(owners, key=lambda owner: (owner != OWN, owner))


def _controls(rows: Sequence[Row]) -> str:
    outcomes = sorted({r.record.outcome for r in rows})
    options = "".join(f"<option value={attr(o)}>{text(o)}</option>" for o in outcomes)
    owners = "".join(
        f"<option value={attr(o)}>{text('your code' if o == OWN else o)}</option>"
        for o in _owners(e for r in rows for e in r.record.breaks)
    )
    flags = "".join(
        f"<label><input type='checkbox' name='has' value={attr(name)}> has {text(label)}</label>"
        for name, label in _FLAGS
    )
    return (
        "<form id='filters' class='filters'>"
        "<label>test <input type='search' id='q' placeholder='part of a test id'></label>"
        f"<label>outcome <select id='outcome'><option value=''>any</option>{options}"
        f"</select></label>"
        f"<label>breaks in <select id='owner'><option value=''>anyone's code</option>{owners}"
        f"</select></label>{flags}"
        "<button type='button' id='expand'>open all</button>"
        f"<span id='shown'>{len(rows)} of {len(rows)} tests</span></form>"
    )


def _table(rows: Sequence[Row], *, asic: bool, baselined: bool, missing: set[str]) -> str:
    exported = any(r.record.figures.export_problems is not None for r in rows)
    columns = [
        c
        for c in _COLUMNS
        if (asic or c[0] in CORE_FIGURES) and (exported or c[0] not in EXPORT_FIGURES)
    ]
    head = ["<th data-key='nodeid' data-type='text' aria-sort='ascending'>test</th>"]
    head += [
        f"<th data-key={attr(key)} data-type='num' title={attr(tip)}>{text(label)}</th>"
        for key, label, tip in columns
    ]
    head.append("<th data-key='outcome' data-type='text'>outcome</th>")
    if baselined:
        head.append(
            "<th data-key='change' data-type='num' title='against the baseline'>change</th>"
        )
    width = len(head)
    bodies = [_tbody(row, columns, width, baselined, row.record.nodeid in missing) for row in rows]
    return (
        "<table id='tests'><thead><tr>"
        + "".join(head)
        + "</tr></thead>\n"
        + "\n".join(bodies)
        + "\n</table>"
        + ("" if rows else "<p class='empty'>No watched test ran.</p>")
    )


def _tbody(
    row: Row,
    columns: Sequence[tuple[str, str, str]],
    width: int,
    baselined: bool,
    missing: bool,
) -> str:
    record = row.record
    figures = record.figures.as_dict()
    data = {
        "nodeid": record.nodeid,
        "outcome": record.outcome,
        "flags": " ".join(row.flags()),
        "owners": " ".join(_owners(record.breaks)),
    }
    cells = []
    for key, _, _ in columns:
        value: float | int | None
        if key == "dut_share":
            value = record.figures.dut_share
            shown = "-" if value is None else percent(value)
        elif key == "utilization":
            value = row.utilization
            shown = "-" if value is None else percent(value)
        else:
            value = figures.get(key)
            shown = "-" if value is None else f"{value:,}"
        data[key] = "" if value is None else repr(value)
        cells.append(f"<td class='num'>{text(shown)}</td>")
    klass = outcome_class(record.outcome)
    cells.append(f"<td class='outcome {klass}'>{text(record.outcome)}</td>")
    if baselined:  # the columns' order is the header's
        data["change"] = str(2 if row.regressed else 1 if row.changes else 0)
        cells.append(f"<td class='change'>{_change_cell(row, missing)}</td>")
    attrs = " ".join(f"data-{k}={attr(v)}" for k, v in data.items())
    toggle = (
        f"<button type='button' class='open' aria-expanded='false'>{text(record.nodeid)}</button>"
        if row.has_details()
        else f"<span class='id'>{text(record.nodeid)}</span>"
    )
    main = f"<tr class='test'><td class='nodeid'>{toggle}</td>{''.join(cells)}</tr>"
    detail = ""
    if row.has_details():
        detail = f"<tr class='detail' hidden><td colspan='{width}'>{details(row)}</td></tr>"
    return f"<tbody {attrs}>{main}{detail}</tbody>"


def _change_cell(row: Row, missing: bool) -> str:
    if missing:
        return "<span class='new'>not in baseline</span>"
    if not row.changes:
        return "<span class='same'>=</span>"
    parts = []
    for change in row.changes:
        klass = "worse" if change.is_regression and row.regressed else "better"
        described = change.describe().replace(" -> ", " → ")
        parts.append(f"<span class={attr(klass)}>{text(described)}</span>")
    return "<br>".join(parts)


def _by_op(
    rows: Sequence[Row], events: Callable[[Row], Sequence[BreakEvent]]
) -> dict[str, list[tuple[str, BreakEvent]]]:
    """``events`` of every row by op, each with its test's nodeid, in first-seen order."""
    ops: dict[str, list[tuple[str, BreakEvent]]] = {}
    for row in rows:
        for event in events(row):
            ops.setdefault(event.title, []).append((row.record.nodeid, event))
    return ops


def _host_summary(rows: Sequence[Row]) -> str:
    """The run's host fallbacks by op: which tests, how many calls and MACs."""
    ops = _by_op(rows, lambda row: row.host_events)
    if not ops:
        return ""
    lines = []
    for op, seen in sorted(ops.items(), key=lambda kv: -sum(e.macs or 0 for _, e in kv[1])):
        tests = len({nodeid for nodeid, _ in seen})
        calls = sum(e.calls or 1 for _, e in seen)
        macs = sum(e.macs or 0 for _, e in seen)
        lines.append(
            f"<tr><td><code>{text(op)}</code></td><td>{text(op_family(op))}</td>"
            f"<td class='num'>{tests}</td><td class='num'>{calls:,}</td>"
            f"<td class='num'>{macs:,}</td></tr>"
        )
    return (
        "<section id='host-ops'><h2>Host fallbacks by op</h2><table class='host'><thead><tr>"
        "<th>op</th><th>family</th><th>tests</th><th>calls</th><th>host MACs</th></tr></thead>"
        f"<tbody>{''.join(lines)}</tbody></table></section>"
    )


def _sync_summary(rows: Sequence[Row]) -> str:
    """The run's host syncs by op: in what form, which tests, how many calls."""
    ops = _by_op(rows, lambda row: row.sync_events)
    if not ops:
        return ""
    lines = []
    for op, seen in sorted(
        ops.items(), key=lambda kv: (-sum(e.calls or 1 for _, e in kv[1]), kv[0])
    ):
        tests = len({nodeid for nodeid, _ in seen})
        calls = sum(e.calls or 1 for _, e in seen)
        forms = ", ".join(dict.fromkeys(e.detail for _, e in seen if e.detail))
        lines.append(
            f"<tr><td><code>{text(op)}</code></td><td>{text(forms)}</td>"
            f"<td class='num'>{tests}</td><td class='num'>{calls:,}</td></tr>"
        )
    return (
        "<section id='sync-ops'><h2>Host syncs by op</h2><table class='host'><thead><tr>"
        "<th>op</th><th>form</th><th>tests</th><th>calls</th></tr></thead>"
        f"<tbody>{''.join(lines)}</tbody></table></section>"
    )


def _roofline(document: Mapping[str, Any], rows: Sequence[Row]) -> str:
    """The run's distinct DUT GEMMs on the ``--asic-roofline`` chart (the same drawing); each
    point's tooltip names the host syncs the DUT stalled for in the tests that ran it."""

    roofs_data = document.get(ROOFS_KEY) or {}
    points: dict[tuple[Any, ...], Point] = {}
    # The tests with host syncs that ran each GEMM (each test once per GEMM).
    stalled_by: dict[tuple[Any, ...], dict[str, Row]] = {}
    for row in rows:
        for g in row.record.gemms:
            if g.device not in roofs_data:
                continue
            key = (g.device, g.family, g.m, g.k, g.n)
            if row.record.figures.syncs:
                stalled_by.setdefault(key, {})[row.record.nodeid] = row
            point = Point(
                device=g.device,
                layer=f"{g.family} {g.m}×{g.k}×{g.n}",
                arithmetic_intensity=g.arithmetic_intensity,
                attained_ops_per_s=g.attained_ops_per_s,
                bound="memory" if g.bound == "memory" else "compute",
                utilization=g.utilization,
                mapping_efficiency=g.mapping_efficiency,
                compute_utilization=g.compute_utilization,
            )
            points.setdefault(key, point)
    if not points:
        return ""
    for key, tests in stalled_by.items():
        stalls = [r.stalled_cycles for r in tests.values()]
        points[key] = dataclasses.replace(
            points[key],
            syncs=sum(r.record.figures.syncs or 0 for r in tests.values()),
            # The cost only when every one of those tests' costs is known: never a part of it.
            stalled_cycles=None if None in stalls else sum(c or 0 for c in stalls),
        )
    roofs = [Roof(key, **fields) for key, fields in sorted(roofs_data.items())]
    ordered = [points[key] for key in sorted(points)]
    svg = render_svg(
        roofs,
        ordered,
        subtitle="one point per distinct GEMM the run's tests ran on the DUT",
    )
    return f"<section id='roofline'><h2>Roofline</h2><div class='svg'>{svg}</div></section>"


# --------------------------------------------------------------------------- helpers


class HtmlReportError(Exception):
    """The page cannot be written at a path. ``str()`` is one line."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"HTML report {os.fspath(path)}: {problem}")
        self.problem = problem


def check_html_path(path: str | os.PathLike[str]) -> None:
    """Raise :class:`HtmlReportError` unless the page can be written at ``path``: not a
    directory, in a directory this process may write in (missing ones are made at the end),
    and, if a file is there, a page this plugin wrote (anything else is never clobbered)."""
    p = Path(path)
    if p.is_dir():
        raise HtmlReportError(path, "is a directory; pass the path of a file")
    if p.exists():
        try:
            with p.open("rb") as f:
                head = f.read(2048)
        except OSError as exc:
            raise HtmlReportError(path, f"cannot be read ({exc.strerror or exc})") from None
        if GENERATOR.encode() not in head:
            raise HtmlReportError(
                path,
                "exists and is not a pytest-nobreak HTML report; delete it or pass another path",
            )
        return
    parent = next(d for d in p.parents if d.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise HtmlReportError(path, f"cannot write in {parent}; pass another path")


def write_html(path: str | os.PathLike[str], page: str) -> None:
    """Write the page atomically (a reader never sees half a page)."""
    write_atomic(path, page)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
{generator}
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; script-src '{script_hash}'">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
{body}
<script>{script}</script>
</body>
</html>
"""

#: The page's style and script, package data beside this module (linted as CSS and JS, not as
#: Python strings); read once, at import.
_STYLE = resources.files(__package__).joinpath("html_report.css").read_text(encoding="utf-8")
_SCRIPT = resources.files(__package__).joinpath("html_report.js").read_text(encoding="utf-8")

# Only this script may run: the page's policy names its hash, so even markup slipped into the
# page could not run a script of its own (escaping is the defence; this is the second line).
_SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
