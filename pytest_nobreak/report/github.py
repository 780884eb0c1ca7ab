"""GitHub Actions output: workflow-command annotations and the job's step summary.

Annotations point at the *model's* line (where Dynamo broke), not at the test, because that is
the line a reviewer has to change. Everything here is pure except :func:`emit`, which writes what
the pure functions produce, and is only called on the xdist controller so nothing is doubled.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, TextIO

from pytest_nobreak.gate.baseline import UPDATE_OPTION, Change, Comparison
from pytest_nobreak.report.json_report import TestRecord
from pytest_nobreak.watch.events import EXPORT_FIGURES, BreakEvent

__all__ = ["emit", "step_summary_markdown", "workflow_commands"]

Level = Literal["error", "warning"]

#: Rows in the step summary before only the tests with something to report are listed.
MAX_ROWS = 200
# How many test ids one annotation names before it says "and N more".
_MAX_TESTS_NAMED = 5
# The step summary's figure columns, in order.
_SUMMARY_FIGURES = (
    "graphs",
    "graph_breaks",
    "eager_frames",
    "recompiles",
    "host_syncs",
    "foreign_breaks",
    "export_problems",
    "specialized_dims",
    "dut_ops",
    "macs",
    "host_macs",
    "cycles",
)
_SUMMARY_TITLES = {
    "graph_breaks": "breaks",
    "eager_frames": "eager",
    "host_syncs": "syncs",
    "foreign_breaks": "foreign",
    "export_problems": "export",
    "specialized_dims": "static",
}


def workflow_commands(
    records: Iterable[TestRecord],
    workspace: str | None,
    comparison: Comparison | None = None,
    *,
    rootdir: str | None = None,
    update_command: str = f"pytest {UPDATE_OPTION}",
    fail_unmarked: bool = False,
) -> list[str]:
    """Workflow commands (``::error ...::msg``) for the breaks and the baseline drift.

    One annotation per distinct break the reports name (``TestRecord.reported_breaks``), at
    its file and line, naming the tests it occurred in: ``error`` when it failed a marked test
    or, with ``fail_unmarked``, the run; ``warning`` when it was only observed. A host sync's
    says how often the host waited there (its calls, summed over those tests). Baseline
    regressions and missing entries are ``error`` when they fail the run and ``warning`` when
    they do not. Paths are made relative to ``workspace`` (``GITHUB_WORKSPACE``) so GitHub can
    attach them to the diff; relative paths (test ids, and break files as the plugin records
    them) are taken relative to ``rootdir`` when it is given. ``update_command`` is the command
    the messages tell the user to run to accept a change.
    """
    lines = _break_annotations(records, workspace, rootdir, fail_unmarked)
    if comparison is not None:
        lines += _baseline_annotations(comparison, workspace, rootdir, update_command)
    return lines


def step_summary_markdown(records: Sequence[TestRecord], comparison: Comparison | None) -> str:
    """A markdown section with one row per test, for ``$GITHUB_STEP_SUMMARY``.

    Figures that moved against the baseline show ``before → after``, in bold when they regressed;
    ``syncs`` are the test's host syncs (``host_syncs``), ``foreign`` its breaks in a library's
    code (``foreign_breaks``, a column only when a test has some), ``–`` where not measured.
    Beyond :data:`MAX_ROWS` tests, only those with breaks, a non-passing outcome or a baseline
    change are listed.
    """
    changes = comparison.by_test() if comparison is not None else {}
    rows = sorted(records, key=lambda record: record.nodeid)
    statuses = _statuses(rows, comparison)
    shown = rows
    if len(rows) > MAX_ROWS:
        shown = [r for r in rows if statuses[r.nodeid] != "passed" or r.reported_breaks]
        shown = shown[:MAX_ROWS]

    broken = sum(1 for r in rows if any(e.kind != "host_sync" for e in r.reported_breaks))
    syncing = sum(1 for r in rows if any(e.kind == "host_sync" for e in r.reported_breaks))
    out = ["### pytest-nobreak", ""]
    out.append(f"{len(rows)} watched tests, {broken} with graph breaks or eager fallbacks.")
    if syncing:
        out[-1] += f" {syncing} with host syncs."
    if comparison is not None:
        out[-1] += (
            f" Baseline: {len(comparison.regressions)} regressed figures,"
            f" {len(comparison.improvements)} improved, {len(comparison.missing)} tests missing."
        )
        if comparison.version_mismatch is not None:
            out.append("")
            out.append(
                f"> Baseline recorded with {comparison.version_mismatch}: regressions are "
                "warnings, not failures."
            )
    # ``foreign`` only when a test broke in a library's code: a column of zeros says nothing;
    # the export figures only when a test exported.
    names = [
        name
        for name in _SUMMARY_FIGURES
        if (name != "foreign_breaks" or any(r.figures.foreign_breaks for r in rows))
        and (name not in EXPORT_FIGURES or any(getattr(r.figures, name) is not None for r in rows))
    ]
    out += [
        "",
        "| test | " + " | ".join(_SUMMARY_TITLES.get(n, n) for n in names) + " | status |",
        "|---|" + "---:|" * len(names) + "---|",
    ]
    for record in shown:
        moved = {change.figure: change for change in changes.get(record.nodeid, ())}
        figures = record.figures.as_dict()
        cells = [f"`{_cell(record.nodeid)}`"]
        for name in names:
            cells.append(_figure_cell(figures.get(name), moved.get(name)))
        cells.append(statuses[record.nodeid])
        out.append("| " + " | ".join(cells) + " |")
    if len(shown) < len(rows):
        out.append("")
        out.append(
            f"{len(rows) - len(shown)} more tests not listed; the JSON report has every test."
        )
    return "\n".join(out) + "\n"


def emit(
    records: Sequence[TestRecord],
    comparison: Comparison | None,
    env: Mapping[str, str],
    *,
    stream: TextIO,
    rootdir: str | None = None,
    update_command: str = f"pytest {UPDATE_OPTION}",
    fail_unmarked: bool = False,
) -> list[str]:
    """Write the annotations to ``stream`` when ``GITHUB_ACTIONS`` is ``"true"``, and append the
    summary to the file named by ``GITHUB_STEP_SUMMARY`` when it is set.

    ``env`` is passed in (normally ``os.environ``) so this stays testable. Returns one line per
    problem (the summary file could not be written) for the caller to warn about: reporting must
    never crash the run.
    """
    problems: list[str] = []
    if env.get("GITHUB_ACTIONS") == "true":
        for line in workflow_commands(
            records,
            env.get("GITHUB_WORKSPACE"),
            comparison,
            rootdir=rootdir,
            update_command=update_command,
            fail_unmarked=fail_unmarked,
        ):
            stream.write(line + "\n")
        stream.flush()
    summary_path = env.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        try:
            with open(summary_path, "a", encoding="utf-8") as summary:
                summary.write(step_summary_markdown(records, comparison) + "\n")
        except OSError as exc:
            problems.append(f"could not append to GITHUB_STEP_SUMMARY {summary_path}: {exc}")
    return problems


def _break_annotations(
    records: Iterable[TestRecord], workspace: str | None, rootdir: str | None, fail_unmarked: bool
) -> list[str]:
    # A model shared by many tests breaks at the same line in each; GitHub shows only a few
    # annotations per step, so one per distinct break, listing the tests, keeps them all visible.
    found: dict[tuple[str, int, str, str, str, str], tuple[BreakEvent, Level, list[str]]] = {}
    calls: dict[tuple[str, int, str, str, str, str], int] = {}  # a host sync's, over its tests
    for record in records:
        failed = record.outcome == "failed" if record.marked else fail_unmarked
        for event in record.reported_breaks:
            # Under scope="own" a library's problem is reported, never what failed the test.
            fails = failed and (record.scope == "all" or event.own)
            level: Level = "error" if fails else "warning"
            key = (
                event.file or "",
                event.line or 0,
                event.kind,
                event.gb_id or "",
                event.gb_type,
                event.reason,
            )
            _, old_level, tests = found.get(key, (event, level, []))
            if record.nodeid not in tests:
                tests.append(record.nodeid)
            found[key] = (event, "error" if "error" in (old_level, level) else "warning", tests)
            if event.kind == "host_sync" and event.calls is not None:
                calls[key] = calls.get(key, 0) + event.calls
    lines = []
    for site, (event, level, tests) in sorted(found.items(), key=lambda item: item[0]):
        title = event.kind.replace("_", " ")
        if event.gb_id:
            title += f" {event.gb_id}"
        if event.gb_type:
            title += f": {event.title}"
        why = event.reason or event.gb_type
        if site in calls:  # how often the host waited there, in all the tests named
            why += f" (x{calls[site]} calls)" if calls[site] != 1 else " (1 call)"
        owner = "" if event.own else f"\nowner: {event.owner}"
        message = f"{why}{owner}\n{_tests_phrase(tests)}"
        path = _relative(event.file, workspace, rootdir) if event.file else None
        lines.append(_command(level, message, file=path, line=event.line, title=title))
    return lines


def _baseline_annotations(
    comparison: Comparison, workspace: str | None, rootdir: str | None, update_command: str
) -> list[str]:
    lines = []
    if comparison.version_mismatch is not None:
        lines.append(
            _command(
                "warning",
                f"The baseline was recorded with {comparison.version_mismatch}; regressions "
                f"are warnings until it is re-recorded with {update_command}.",
                title="nobreak baseline version",
            )
        )
    level: Level = "error" if comparison.version_mismatch is None else "warning"
    regressed: dict[str, list[Change]] = {}
    for change in comparison.regressions:
        regressed.setdefault(change.nodeid, []).append(change)
    for nodeid, changes in regressed.items():
        moved = ", ".join(change.describe() for change in changes)
        lines.append(
            _command(
                level,
                f"{nodeid}: {moved}",
                file=_test_file(nodeid, workspace, rootdir),
                title="nobreak regression",
            )
        )
    for nodeid in comparison.missing:
        lines.append(
            _command(
                "error" if comparison.strict else "warning",
                f"{nodeid} has no baseline entry; record it with {update_command}",
                file=_test_file(nodeid, workspace, rootdir),
                title="not in the nobreak baseline",
            )
        )
    return lines


def _command(
    level: Level, message: str, *, file: str | None = None, line: int | None = None, title: str
) -> str:
    properties = []
    if file:
        properties.append(f"file={_escape_property(file)}")
        if line is not None:
            properties.append(f"line={line}")
    properties.append(f"title={_escape_property(title)}")
    return f"::{level} {','.join(properties)}::{_escape_data(message)}"


def _escape_data(text: str) -> str:
    # GitHub's workflow-command escaping; "%" first so the escapes themselves are not escaped.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    # Property values are also delimited by "," and "::", so those are escaped too.
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _relative(path: str, workspace: str | None, rootdir: str | None = None) -> str:
    """``path`` as GitHub wants it: relative to the workspace.

    The plugin records test ids and break files relative to the rootdir, which differs from the
    workspace when the project lives in a subdirectory of the repository; without a workspace
    (not on Actions) they stay as recorded. Paths outside the workspace (site-packages) stay
    absolute: GitHub cannot attach them to the diff anyway, and "../../.." would only hide
    where they are.
    """
    if not workspace:
        return path.replace(os.sep, "/")
    if rootdir is not None and not os.path.isabs(path):
        path = os.path.join(rootdir, path)
    if not os.path.isabs(path):
        return path.replace(os.sep, "/")
    try:
        relative = os.path.relpath(path, workspace)
    except ValueError:  # another drive on Windows
        return path
    if relative == ".." or relative.startswith(".." + os.sep):
        return path
    return relative.replace(os.sep, "/")


def _test_file(nodeid: str, workspace: str | None, rootdir: str | None) -> str:
    return _relative(nodeid.split("::", 1)[0], workspace, rootdir)


def _tests_phrase(tests: list[str]) -> str:
    if len(tests) == 1:
        return f"in {tests[0]}"
    named = ", ".join(tests[:_MAX_TESTS_NAMED])
    more = len(tests) - _MAX_TESTS_NAMED
    return f"in {len(tests)} tests: {named}" + (f" and {more} more" if more > 0 else "")


def _statuses(records: Sequence[TestRecord], comparison: Comparison | None) -> dict[str, str]:
    regressed = improved = missing = frozenset[str]()
    if comparison is not None:
        regressed = frozenset(change.nodeid for change in comparison.regressions)
        improved = frozenset(change.nodeid for change in comparison.improvements)
        missing = frozenset(comparison.missing)
    warning_only = comparison is not None and comparison.version_mismatch is not None
    statuses = {}
    for record in records:
        words = [] if record.outcome == "passed" else [record.outcome]
        if record.nodeid in regressed:
            words.append("regressed (warning)" if warning_only else "regressed")
        elif record.nodeid in improved:
            words.append("improved")
        if record.nodeid in missing:
            words.append("not in baseline")
        statuses[record.nodeid] = ", ".join(words) or "passed"
    return statuses


def _figure_cell(value: int | None, change: Change | None) -> str:
    if change is None:
        return _dash(value)
    text = f"{_dash(change.before)} → {_dash(change.after)}"
    return f"**{text}**" if change.is_regression else text


def _dash(value: int | None) -> str:
    return "–" if value is None else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
