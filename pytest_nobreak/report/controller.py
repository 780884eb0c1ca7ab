"""What the controller does once the tests ran: files, baseline verdict, terminal summary.

Runs only on the xdist controller (or in a serial run), from ``pytest_sessionfinish``. Nothing
here raises into pytest: a problem with a file is one error line and a non-zero exit status.

Everything written here must come out the same whether the tests ran in this process or on
xdist workers: the controller runs no test and usually has not imported torch, so versions are
read from the installed distributions, not from whatever this process happened to import.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO

import pytest

from pytest_nobreak.config import NobreakConfig
from pytest_nobreak.gate.baseline import (
    UPDATE_OPTION,
    Baseline,
    Comparison,
    compare,
    updated,
    write_baseline,
)
from pytest_nobreak.models.families import model_families
from pytest_nobreak.models.items import model_notes
from pytest_nobreak.report import github
from pytest_nobreak.report.html_report import render_html, write_html
from pytest_nobreak.report.json_report import TestRecord, build_report, write_document
from pytest_nobreak.report.versions import sim_version, torch_version
from pytest_nobreak.watch.events import (
    EXPORT_FIGURES,
    OWN,
    REQUIRED_ASIC_FIGURES,
    REQUIRED_CORE_FIGURES,
    Figures,
)
from pytest_nobreak.watch.render import event_line, percent, short_path

#: pytest's exit status for "some gate failed" (the same as failed tests).
GATE_FAILED = pytest.ExitCode.TESTS_FAILED

# Command-line options that change which tests are watched or what their figures are: the
# command that re-records the baseline must repeat them, or it records other numbers.
_FIGURE_OPTIONS = (
    ("--asic-backend", "asic_backend"),
    ("--asic-device", "asic_device"),
    ("--nobreak-backend", "nobreak_backend"),
    ("--nobreak-all", "nobreak_all"),
    ("--nobreak-unmarked", "nobreak_unmarked"),  # "fail" implies --nobreak-all
)


def update_command(config: pytest.Config, settings: NobreakConfig) -> str:
    """The command that accepts this run's figures into the baseline.

    ``pytest --nobreak-update-baseline`` when the ini names the file; otherwise the command must
    name it (and repeat the options that change the figures), or it is a usage error.
    """
    parts = ["pytest"]
    if config.getoption("nobreak_baseline", None) is not None and settings.baseline_path:
        parts += ["--nobreak-baseline", shlex.quote(display_path(settings.baseline_path))]
    for flag, dest in _FIGURE_OPTIONS:
        value = config.getoption(dest, None)
        if value is True:
            parts.append(flag)
        elif isinstance(value, str):
            parts += [flag, shlex.quote(value)]
    parts.append(UPDATE_OPTION)
    return " ".join(parts)


def display_path(path: os.PathLike[str] | str) -> str:
    """``path`` as the user should read it: relative to the working directory when below it.

    Files are opened by their absolute path (a test may change directory), but an ini path is
    resolved against the rootdir and would otherwise be printed in full.
    """
    return short_path(os.fspath(path)) or os.fspath(path)


class SessionReporter:
    def __init__(
        self,
        config: pytest.Config,
        settings: NobreakConfig,
        records: Mapping[str, TestRecord],
        baseline: Baseline | None,
        *,
        complete: Iterable[str] | None = None,
        roofs: Mapping[str, Mapping[str, Any]] | None = None,
        kernel_choices: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.settings = settings
        self.records = dict(sorted(records.items()))
        #: The tests whose body ran to its end; a test that broke off has partial figures.
        self.complete = set(self.records if complete is None else complete)
        self.baseline = baseline
        #: The roofs of the devices the tests' DUT GEMMs ran on (read where they ran).
        self.roofs = dict(roofs or {})
        #: The host GEMM kernels the ASIC backend chose by timing, by shape.
        self.kernel_choices = dict(kernel_choices or {})
        self.comparison: Comparison | None = None
        self.command = update_command(config, settings)
        self.lines: list[tuple[str, str | None]] = []
        self.errors: list[str] = []

    # ------------------------------------------------------------------ session end

    def finish(self) -> int:
        """Write files and judge the run; return a non-zero exit status if a gate failed.

        Each step runs even if an earlier one failed (a full disk must not also lose the
        GitHub annotations), and none raises: an unexpected error is one line and status 1.
        """
        steps: list[tuple[Callable[[], int], str]] = [
            (self._gate_unmarked, "check the unmarked tests"),
            (self._gate_baseline, "check the baseline"),
            (self._write_json, "write the JSON report"),
            (self._write_html, "write the HTML report"),
            (self._github, "write the GitHub Actions output"),
        ]
        status = 0
        for step, what in steps:
            try:
                status |= step()
            except Exception as exc:  # a reporting hook must never end in a traceback
                self.errors.append(f"nobreak: could not {what}: {type(exc).__name__}: {exc}")
                status |= int(GATE_FAILED)
        return status

    def broken_unmarked(self) -> list[str]:
        """The unmarked tests with breaks the reports name, when those fail the run. Host syncs
        count as a marked test's do: on the ASIC, not under another backend."""
        if not self.settings.fail_unmarked:
            return []
        syncs_fail = self.settings.host_syncs_fail
        return [
            r.nodeid
            for r in self.records.values()
            if not r.marked
            and any(
                (e.kind != "host_sync" or syncs_fail) and (r.scope == "all" or e.own)
                for e in r.reported_breaks
            )
        ]

    def _gate_unmarked(self) -> int:
        """``--nobreak-unmarked fail``: the run fails; the tests keep their own outcomes."""
        broken = self.broken_unmarked()
        if not broken:
            return 0
        self.lines.append(
            (
                f"nobreak: {_plural(len(broken), 'unmarked test')} with breaks "
                "(--nobreak-unmarked fail: the run fails)",
                "red",
            )
        )
        return int(GATE_FAILED)

    def _gate_baseline(self) -> int:
        path = self.settings.baseline_path
        if path is None:
            return 0
        shown = display_path(path)
        if not self.records:
            if self.settings.update_baseline:
                self.lines.append((f"nobreak: no watched test ran; {shown} was not written", None))
            return 0
        # Only tests that ran to the end: the figures of a test that raised half-way are partial
        # and would show up as improvements (or be recorded as the new baseline).
        results = {n: r.figures for n, r in self.records.items() if n in self.complete}
        torch, sim = torch_version(), sim_version()
        self.comparison = compare(
            self.baseline, results, strict=self.settings.strict, torch=torch, asic_sim=sim
        )
        if self.settings.update_baseline:
            try:
                write_baseline(path, updated(self.baseline, results, torch, sim))
            except (OSError, UnicodeError) as exc:
                self.errors.append(f"nobreak: cannot write baseline {shown}: {_reason(exc)}")
                return int(GATE_FAILED)
            self.lines.extend(self.comparison.render_lines(updating=True, command=self.command))
            return 0
        if self.baseline is None and results:
            # No file yet: one line, not one "missing" line per test of the suite.
            strict = self.settings.strict
            why = " (strict: the run fails)" if strict else ""
            self.lines.append(
                (
                    f"nobreak: no baseline file {shown} yet{why}; record it with {self.command}",
                    "red" if strict else "yellow",
                )
            )
        else:
            self.lines.extend(self.comparison.render_lines(command=self.command))
        return int(GATE_FAILED) if self.comparison.failed else 0

    def _github(self) -> int:
        # While updating, nothing about the baseline fails or needs doing: "not in the baseline,
        # record it" would be wrong about tests this very run is recording.
        comparison = None if self.settings.update_baseline else self.comparison
        problems = github.emit(
            list(self.records.values()),
            comparison,
            os.environ,
            stream=sys.stderr,
            rootdir=str(self.config.rootpath),
            update_command=self.command,
            fail_unmarked=self.settings.fail_unmarked,
        )
        self.lines.extend((f"nobreak: {p}", "yellow") for p in problems)
        return 0

    def _device(self) -> str:
        if not self.settings.asic:
            return ""
        return self.settings.asic_config().key

    def _host_kernels(self) -> tuple[str, str] | tuple[None, None]:
        """The host GEMM kernel's and the host passes' descriptions, under the ASIC backend."""
        if not self.settings.asic:
            return None, None
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from asic_backend.sim import host_gemm, host_passes

        return host_gemm.describe(), host_passes.describe()

    @functools.cached_property
    def document(self) -> dict[str, Any]:
        """This run's report document: what ``--nobreak-json`` writes and the HTML page shows
        (built once for both)."""
        host_gemm, host_passes = self._host_kernels()
        return build_report(
            torch_version(),
            self.settings.fixture_backend,
            self._device(),
            self.records.values(),
            asic_sim=sim_version(),
            host_gemm=host_gemm,
            host_passes=host_passes,
            complete=self.complete,
            roofs=self.roofs,
            kernel_choices=self.kernel_choices,
            models=model_notes(self.config),
            families=model_families(self.config),
        )

    def _write_json(self) -> int:
        """This run's report, replacing the file; also when no test was watched (an empty
        ``tests``), so a CI step can upload it unconditionally. The path was checked at start."""

        path = self.settings.json_path
        if path is None:
            return 0
        shown = display_path(path)
        try:
            write_document(path, self.document)
        except (OSError, UnicodeError) as exc:
            self.errors.append(f"nobreak: cannot write JSON report {shown}: {_reason(exc)}")
            return int(GATE_FAILED)
        self.lines.append((f"nobreak: JSON report written to {shown}", None))
        return 0

    def _write_html(self) -> int:
        """The page of this run (also with no watched test). The path was checked at start."""

        path = self.settings.html_path
        if path is None:
            return 0
        shown = display_path(path)
        baseline = self.settings.baseline_path
        page = render_html(
            self.document,
            comparison=self.comparison,
            baseline=display_path(baseline) if baseline is not None else None,
        )
        try:
            write_html(path, page)
        except (OSError, UnicodeError) as exc:
            self.errors.append(f"nobreak: cannot write HTML report {shown}: {_reason(exc)}")
            return int(GATE_FAILED)
        self.lines.append((f"nobreak: HTML report written to {shown}", None))
        return 0

    def failure_words(self) -> list[str]:
        """What failed the run besides its tests, as parts of pytest's last line
        (``2 baseline regressions``, ``1 report error``); empty when nothing did."""
        words: list[str] = []
        broken = self.broken_unmarked()
        if broken:
            words.append(f"{_plural(len(broken), 'unmarked test')} with breaks")
        comparison = self.comparison
        if comparison is not None and comparison.failed and not self.settings.update_baseline:
            if comparison.regressions and comparison.version_mismatch is None:
                words.append(_plural(len(comparison.regressions), "baseline regression"))
            if comparison.missing and comparison.strict:
                words.append(f"{len(comparison.missing)} missing from the baseline")
        if self.errors:
            words.append(_plural(len(self.errors), "report error"))
        return words

    # ------------------------------------------------------------------ terminal

    def _known(self, record: TestRecord) -> bool:
        """Whether the baseline already holds exactly this test's figures (nothing new)."""
        if self.baseline is None or self.comparison is None:
            return False
        entry = self.baseline.entries.get(record.nodeid)
        if entry is None:
            return False
        known = entry.as_dict()
        # A figure added after the entry was recorded (host_syncs, host_macs, syncs) is news,
        # not a difference.
        now = {
            name: value
            for name, value in record.figures.as_dict().items()
            if name in known or name in REQUIRED_CORE_FIGURES + REQUIRED_ASIC_FIGURES
        }
        return known == now

    def terminal_summary(self, terminalreporter: Any) -> None:
        """A section only when there is something to say.

        Rows: every watched test with ``-v``; otherwise the tests whose breaks no failure message
        showed (unmarked under ``--nobreak-all``, tolerated, or expected failures), unless the
        baseline already records exactly their figures. Then the baseline verdict, the files
        written and any error.
        """
        verbose = self.config.get_verbosity() > 0
        failing = set(self.broken_unmarked())
        rows = [
            r
            for r in self.records.values()
            if verbose or r.nodeid in failing or (_unshown_breaks(r) and not self._known(r))
        ]
        if not (rows or self.lines or self.errors or owner_lines(self.records.values())):
            return
        terminalreporter.write_sep("-", "nobreak compile report")
        table = figures_table(rows, width=_table_width(terminalreporter), failing=failing)
        for text, style in table:
            terminalreporter.write_line(text, **({style: True} if style else {}))
        for text, style in owner_lines(self.records.values()):
            terminalreporter.write_line(text, **({style: True} if style else {}))
        for text, style in self.lines:
            terminalreporter.write_line(text, **({style: True} if style else {}))
        for text in self.errors:
            terminalreporter.write_line(text, red=True, bold=True)
        words = self.failure_words()
        if words:
            _add_to_summary_line(terminalreporter, words)

    def print_errors(self, stream: TextIO) -> None:
        """The error lines, for a run without pytest's terminal reporter."""
        for text in self.errors:
            stream.write(text + "\n")


def owner_lines(records: Iterable[TestRecord]) -> list[tuple[str, str | None]]:
    """``nobreak: 12 problems: 3 in your code, 7 in transformers, 2 in torch``: the problems
    the reports name, by owner (the user's first, then by count); nothing when every one is the
    user's, which the table already says."""
    owners: dict[str, int] = {}
    for record in records:
        for event in record.reported_breaks:
            owners[event.owned_by] = owners.get(event.owned_by, 0) + 1
    if set(owners) <= {OWN}:
        return []
    ordered = sorted(owners.items(), key=lambda item: (item[0] != OWN, -item[1], item[0]))
    parts = [f"{n} in {'your code' if owner == OWN else owner}" for owner, n in ordered]
    total = sum(owners.values())
    return [(f"nobreak: {_plural(total, 'problem')}: {', '.join(parts)}", None)]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _add_to_summary_line(terminalreporter: Any, words: list[str]) -> None:
    """Add ``words`` to pytest's last line and make it red: ``1 passed, 2 baseline regressions``.

    The run exits 1, and a green "1 passed" as its last word would say the opposite. pytest has
    no hook for that line; it is built by ``build_summary_stats_line``, wrapped here on this one
    reporter, once the tests ran. Another terminal plugin without it keeps its own line (the
    red lines of the report section above still say why).
    """
    build = getattr(terminalreporter, "build_summary_stats_line", None)
    if build is None:
        return

    def build_with_gate() -> tuple[list[tuple[str, dict[str, bool]]], str]:
        parts, _color = build()
        return [*parts, *((word, {"red": True, "bold": True}) for word in words)], "red"

    terminalreporter.build_summary_stats_line = build_with_gate


def _reason(exc: BaseException) -> str:
    # "[Errno 21] Is a directory: '/abs/path/.b.json.1a2b.tmp'" names our temporary file, which
    # the user never asked for; the error's own words are enough next to the path we print.
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


#: ``(figure, title)`` of the table's columns; ``dut%`` is derived, the share of the MACs that
#: ran on the DUT (not stored anywhere: ``macs`` and ``host_macs`` are). ``syncs`` are the host
#: syncs the test's compiled graphs ran (``host_syncs``), shown when a test ran one.
_COLUMNS = (
    ("graphs", "graphs"),
    ("graph_breaks", "breaks"),
    ("eager_frames", "eager"),
    ("recompiles", "recomp"),
    ("host_syncs", "syncs"),
    ("foreign_breaks", "foreign"),
    ("export_problems", "export"),
    ("specialized_dims", "static"),
    ("dut_ops", "dut_ops"),
    ("host_fallbacks", "host"),
    ("dut%", "dut%"),
    ("cycles", "cycles"),
)
_ASIC_COLUMNS = ("dut_ops", "host_fallbacks", "dut%", "cycles")


#: The narrowest a node id is shortened to, however narrow the terminal: the figures after it
#: are what the table is for, and they stay (the line wraps instead).
_MIN_ID_WIDTH = 20
_ELLIPSIS = "..."


def _unshown_breaks(record: TestRecord) -> bool:
    return bool(record.reported_breaks) and (
        not record.marked or record.outcome in ("xfailed", "passed")
    )


def _table_width(terminalreporter: Any) -> int | None:
    """The width to fit the table in: the terminal's, when the report goes to one. ``None`` for
    a file, a pipe or a CI log, where a whole node id is worth more than a short line (and a
    script may split the rows on whitespace)."""
    if not getattr(terminalreporter, "isatty", False):
        return None
    width = getattr(getattr(terminalreporter, "_tw", None), "fullwidth", None)
    return width if isinstance(width, int) else None


def figures_table(
    records: list[TestRecord], *, width: int | None = None, failing: Iterable[str] = ()
) -> list[tuple[str, str | None]]:
    """One row per test with its figures and outcome, then its breaks and host syncs (one line
    each); no lines at all without a test.

    ``width``: fit every line in it. A node id too long for what the figures leave is
    shortened from the left (its end names the test), never the figures; a break line is cut
    at the right. ``failing``: node ids whose breaks fail the run (shown red). The ``syncs``
    column is there when a test ran a host sync, ``foreign`` when a library's code broke,
    ``export`` and ``static`` when a test exported a model (a
    column of zeros would only take the width the node ids need; a test that did not measure
    them, from an older report, shows ``-``). A test judged with ``scope="own"`` lists the
    breaks in other code under "not yours (reported, not failed)".
    """
    if not records:
        return []
    failing = set(failing)
    asic = any(r.figures.dut_ops is not None for r in records)
    # A column of zeros would only take the width the node ids need.
    shown = {
        name
        for name in ("host_syncs", "foreign_breaks")
        if any(getattr(r.figures, name) for r in records)
    }
    # The export figures wherever a test exported: there a zero is the verdict.
    shown |= {
        name
        for name in EXPORT_FIGURES
        if any(getattr(r.figures, name) is not None for r in records)
    }
    columns = [
        c
        for c in _COLUMNS
        if (asic or c[0] not in _ASIC_COLUMNS)
        and (c[0] not in ("host_syncs", "foreign_breaks", *EXPORT_FIGURES) or c[0] in shown)
    ]
    rows = [[_cell(r.figures, name) for name, _ in columns] for r in records]
    # As wide as the widest value (cycles of a big model run to 8 digits), so columns line up.
    widths = [
        max(len(title), 6, *(len(row[i]) for row in rows)) for i, (_, title) in enumerate(columns)
    ]
    id_width = max(len("test"), *(len(r.nodeid) for r in records))
    if width is not None:
        outcome = max(len("outcome"), *(len(r.outcome) for r in records))
        figures = sum(2 + w for w in widths) + 2 + outcome
        id_width = max(min(id_width, width - figures), _MIN_ID_WIDTH)
    header = "  ".join(
        ["test".ljust(id_width), *(t.rjust(w) for (_, t), w in zip(columns, widths, strict=True))]
    )
    out: list[tuple[str, str | None]] = [(header + "  outcome", None)]
    for record, row in zip(records, rows, strict=True):
        cells = [value.rjust(w) for value, w in zip(row, widths, strict=True)]
        style = "yellow" if record.reported_breaks else None
        if record.outcome == "failed" or record.nodeid in failing:
            style = "red"
        nodeid = _shorten_left(record.nodeid, id_width).ljust(id_width)
        out.append(("  ".join([nodeid, *cells, record.outcome]), style))
        judged, theirs = record.split_by_scope(record.reported_breaks)
        for event in judged:
            out.append((_cut_right("    " + event_line(event), width), None))
        if theirs:
            out.append(("    not yours (reported, not failed):", None))
            out.extend((_cut_right("      " + event_line(e), width), None) for e in theirs)
    return out


def _shorten_left(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return _ELLIPSIS + text[len(text) - (width - len(_ELLIPSIS)) :]


def _cut_right(text: str, width: int | None) -> str:
    if width is None or len(text) <= width:
        return text
    return text[: width - len(_ELLIPSIS)] + _ELLIPSIS


def _cell(figures: Figures, name: str) -> str:
    if name == "dut%":
        share = figures.dut_share
        return "-" if share is None else percent(share)
    value = figures.as_dict().get(name)
    return "-" if value is None else str(value)
