"""Per-test watching and the session's verdicts: the hooks of one pytest session.

A ``NobreakSession`` is registered as a plugin in ``pytest_configure``. Its runtest hooks
start a ``Monitor`` before the test's fixtures run and judge it after the call; every test's
``TestRecord`` travels on its call report (so xdist ships it to the controller), and only the
controller writes files and prints the summary.

A test is watched in one of two ways. A marked test, or one that asks for a fixture of the
plugin, opted in: it is isolated (Dynamo is reset before it, so nothing compiled earlier hides
a break) and a marked one is failed on its breaks. Any other test (``--nobreak-all``) is only
observed: nothing is reset, no log record is held back and no warning is raised in it, so its
outcome, warnings and logs are what they are without the plugin; its breaks are reported after
the run (terminal summary, JSON, JUnit, GitHub), and fail the run only if asked to
(``--nobreak-unmarked fail``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_nobreak.benchmark import roof_fields
from pytest_nobreak.config import NobreakConfig
from pytest_nobreak.gate.baseline import Baseline, BaselineError, load_baseline
from pytest_nobreak.keys import (
    CHOICES_OUTPUT,
    COMPLETE_ATTR,
    COMPLETE_KEY,
    MONITOR_KEY,
    OPTIONS_KEY,
    RECORD_KEY,
    REPORT_ATTR,
    ROOFS_ATTR,
    ROOFS_KEY,
    USAGE_ERRORS_OUTPUT,
)
from pytest_nobreak.markers import BACKEND_DEFAULT, MARKER, MarkerError, NoGraphBreakOptions
from pytest_nobreak.report.controller import SessionReporter, display_path, update_command
from pytest_nobreak.report.html_report import HtmlReportError, check_html_path
from pytest_nobreak.report.json_report import ReportError, TestRecord, check_report_path
from pytest_nobreak.report.junit import junit_properties
from pytest_nobreak.report.kernel_choices import local_choices, summary_line, united
from pytest_nobreak.watch.compile_report import CompileReport
from pytest_nobreak.watch.events import EXPORT_KINDS, BreakEvent
from pytest_nobreak.watch.export_report import EXPORT_TITLE
from pytest_nobreak.watch.monitor import Monitor
from pytest_nobreak.watch.render import short_path
from pytest_nobreak.watch.sites import source_context

if TYPE_CHECKING:
    from pytest_nobreak.report.controller import SessionReporter

#: Fixtures whose use makes a test watched even when it is not marked.
WATCH_FIXTURES = ("nobreak_report", "nobreak_compile", "nobreak_export", "asic", "asic_benchmark")
FAIL_TITLE = f"@pytest.mark.{MARKER}: torch.compile did not run as whole graphs"
EXPORT_FAIL_TITLE = f"@pytest.mark.{MARKER}: {EXPORT_TITLE}"
BOTH_FAIL_TITLE = (
    f"@pytest.mark.{MARKER}: torch.compile did not run as whole graphs, and torch.export did "
    "not produce a sound program"
)


def fail_title(problems: Sequence[BreakEvent]) -> str:
    """The failure's first words: what went wrong, compiling, exporting or both."""
    exported = {p.kind in EXPORT_KINDS for p in problems}
    if exported == {True}:
        return EXPORT_FAIL_TITLE
    return BOTH_FAIL_TITLE if True in exported else FAIL_TITLE


class NobreakWarning(UserWarning):
    """No longer issued: an unmarked test's breaks are reported after the run, never as a
    warning inside it (one would fail it under ``-W error``). Kept so that a
    ``filterwarnings`` entry naming it still loads."""


def device_roofs(keys: set[str]) -> dict[str, dict[str, Any]]:
    """The roofs of the simulated devices ``keys`` (imported already: a GEMM ran on each)."""
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from asic_backend.sim.device import get_device

    return {key: roof_fields(get_device(key).config) for key in sorted(keys)}


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


class NobreakSession:
    def __init__(self, config: pytest.Config, settings: NobreakConfig) -> None:
        self.config = config
        self.settings = settings
        self.records: dict[str, TestRecord] = {}
        #: Tests whose body ran to the end: only their figures are compared with the baseline.
        self.complete: set[str] = set()
        #: The roofs of the devices the tests' DUT GEMMs ran on, by device key.
        self.roofs: dict[str, dict[str, Any]] = {}
        self.reporter: SessionReporter | None = None
        self.usage_errors: list[str] = []
        #: The host GEMM kernels xdist workers chose by timing (:mod:`.report.kernel_choices`).
        self.worker_choices: list[tuple[Any, ...]] = []
        #: The monitor of the test being run, from its setup to its teardown.
        self._watching: Monitor | None = None
        self.baseline = self._load_baseline()
        self._check_json_path()
        self._check_html_path()

    def _load_baseline(self) -> Baseline | None:
        """Read the baseline before any test runs: a broken file stops the run at once (exit 4,
        one line) instead of after an hour of tests, and is never rewritten."""
        path = self.settings.baseline_path
        if path is None or is_xdist_worker(self.config):
            return None

        try:
            return load_baseline(path)
        except BaselineError as exc:
            shown = BaselineError(display_path(path), exc.problem)
            raise pytest.UsageError(
                shown.message(update_command(self.config, self.settings))
            ) from None

    def _check_json_path(self) -> None:
        """A report path that cannot be written stops the run before any test (exit 4, one
        line), not after it. Only the controller writes, so only it checks."""
        path = self.settings.json_path
        if path is None or is_xdist_worker(self.config):
            return

        self._check_distinct("JSON report", path, ("--nobreak-baseline",))
        try:
            check_report_path(path)
        except ReportError as exc:
            shown = ReportError(display_path(path), exc.problem, exc.hint)
            raise pytest.UsageError(str(shown)) from None

    def _check_html_path(self) -> None:
        path = self.settings.html_path
        if path is None or is_xdist_worker(self.config):
            return

        self._check_distinct("HTML report", path, ("--nobreak-json", "--nobreak-baseline"))
        try:
            check_html_path(path)
        except HtmlReportError as exc:
            shown = HtmlReportError(display_path(path), exc.problem)
            raise pytest.UsageError(str(shown)) from None

    def _check_distinct(self, what: str, path: os.PathLike[str], flags: tuple[str, ...]) -> None:
        """One file given for two of the run's outputs would be written twice, the last one
        winning: a usage error before any test."""

        others = {
            "--nobreak-json": self.settings.json_path,
            "--nobreak-baseline": self.settings.baseline_path,
        }
        for flag in flags:
            other = others[flag]
            if other is not None and os.path.realpath(other) == os.path.realpath(path):
                raise pytest.UsageError(
                    f"{what} {display_path(path)}: is also the {flag} file; pass another path"
                )

    # ------------------------------------------------------------------ collection

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        """Under ``--nobreak-all``, tap Dynamo before the test modules are imported: a graph
        compiled at import (a warm-up at module level) then counts in each test that runs it."""
        if not self.settings.watch_all:
            return
        try:
            # Lazy: keeps torch out of the plugin's import until a test needs it.
            from pytest_nobreak.watch import dynamo

            dynamo.install_taps()
        except (ImportError, RuntimeError):
            pass  # no torch to watch, or one it cannot: the first watched test says so

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Validate every marker before any test runs: each bad one is a usage error naming its
        test, all of them in one go (fixing them one run at a time would take many runs)."""
        errors: list[str] = []
        for item in items:
            mark = item.get_closest_marker(MARKER)
            if mark is None:
                continue
            try:
                item.stash[OPTIONS_KEY] = NoGraphBreakOptions.from_kwargs(
                    mark.kwargs, args=mark.args, where=item.nodeid
                )
            except MarkerError as exc:
                errors.append(str(exc))
        if not errors:
            return
        if not is_xdist_worker(self.config):
            raise pytest.UsageError(*errors)
        # A worker cannot stop the session (xdist turns that into an INTERNALERROR). It runs
        # nothing and sends the errors to the controller, which prints each once and exits 4.
        # Every worker collects the same items, so all of them agree on running nothing.
        self.usage_errors.extend(errors)
        items[:] = []

    # ------------------------------------------------------------------ per test

    def _opted_in(self, item: pytest.Item) -> bool:
        """Marked, or asking for a fixture of the plugin: isolated from the tests before it."""
        if OPTIONS_KEY in item.stash:
            return True
        names = getattr(item, "fixturenames", ())
        return any(name in names for name in WATCH_FIXTURES)

    # trylast: run inside pytest's logging wrapper, after it attached its handlers.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        opted_in = self._opted_in(item)
        if opted_in or self.settings.watch_all:
            # A marked test reports its breaks in its failure, so Dynamo's WARNINGs and the ASIC
            # backend's once-per-process warning stay unsaid there; any other is only reported
            # after the run, and an observed one is not even reset.
            monitor = Monitor(
                reset=opted_in,
                reports=OPTIONS_KEY in item.stash,
                root=str(self.config.rootpath),
                first_party=self.settings.first_party,
            )
            item.stash[MONITOR_KEY] = monitor
            self._watching = monitor
            try:
                # Lazy: keeps torch out of the plugin's import until a test needs it.
                from pytest_nobreak.watch.dynamo import TorchCompatError

                monitor.start()
            except (ImportError, TorchCompatError) as exc:
                # One line for the whole run, not a traceback per test.
                message = (
                    str(exc) if isinstance(exc, TorchCompatError) else f"pytest-nobreak: {exc}"
                )
                pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)
        _quiet_trace_logger()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, Any]:
        """A fixture set up once for many tests (``setUpClass`` included) counts for none of
        them: which test it lands in depends on the order. Each counts what it runs itself."""
        monitor = self._watching
        if monitor is None or fixturedef.scope == "function":
            return (yield)
        with monitor.apart():
            return (yield)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        _quiet_trace_logger()
        monitor = item.stash.get(MONITOR_KEY, None)
        if monitor is None:
            return (yield)
        item.stash[COMPLETE_KEY] = False
        try:
            result = yield
        except BaseException:
            report = monitor.stop()
            self._judge(item, report, test_failed=True)
            raise
        # The body ran to its end, so its figures are whole and may go into the baseline (the
        # pytest.fail() that _judge may raise below is a verdict on them, not an interruption).
        item.stash[COMPLETE_KEY] = True
        report = monitor.stop()
        self._judge(item, report, test_failed=False)
        return result

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        _quiet_trace_logger()
        monitor = item.stash.get(MONITOR_KEY, None)
        self._watching = None
        if monitor is not None:
            monitor.stop()  # setup failed before the call: never leave the taps installed
        return (yield)

    def _judge(self, item: pytest.Item, report: CompileReport, *, test_failed: bool) -> None:
        options = item.stash.get(OPTIONS_KEY, None)
        marked = options is not None
        scope = (options.scope if options else None) or self.settings.scope
        record = TestRecord(
            nodeid=item.nodeid,
            outcome="pending",
            marked=marked,
            figures=report.figures(),
            breaks=tuple(self._shown(event) for event in report.breaks),
            recompile_reasons=tuple(report.recompile_reasons),
            gemms=report.gemms(),
            scope=scope,
        )
        item.stash[RECORD_KEY] = record
        if record.gemms:
            item.stash[ROOFS_KEY] = device_roofs({gemm.device for gemm in record.gemms})
        item.user_properties.extend(junit_properties(record))
        if options is None:
            return  # reported after the run, never inside the test (see the module docstring)
        gates: dict[str, Any] = {
            "allow": options.allow,
            "max_recompiles": options.max_recompiles,
            "allow_host_fallback": options.allow_host_fallback,
            "max_host_syncs": self._max_host_syncs(options, record),
        }
        problems = report.problems(**gates, scope=scope)
        if not problems:
            return
        theirs = report.theirs(**gates) if scope == "own" else {}
        message = report.render(problems, title=fail_title(problems), theirs=theirs)
        if test_failed:
            # The test's own error wins; the breaks go in a section next to it.
            item.add_report_section("call", "nobreak", message)
            return
        pytest.fail(message, pytrace=False)

    def _max_host_syncs(self, options: NoGraphBreakOptions, record: TestRecord) -> int | None:
        """The marker's ``max_host_syncs``; without it, none on the simulated ASIC (which
        cannot run them: each one stops the device, as in the seed) and no limit elsewhere."""
        if options.max_host_syncs != BACKEND_DEFAULT:
            return options.max_host_syncs
        # A graph compiled for the ASIC without the flag stalled the device all the same.
        return 0 if self.settings.host_syncs_fail or record.figures.syncs else None

    def _shown(self, event: BreakEvent) -> BreakEvent:
        """The event as reports show it: its path relative to the rootdir, and the source lines
        around its line read now, while the file is at hand (a merged report is rendered on
        another machine)."""
        root = str(self.config.rootpath)
        start, lines = source_context(event.file, event.line, root)
        return dataclasses.replace(
            event, file=short_path(event.file, root), context=lines, context_start=start
        )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        record = item.stash.get(RECORD_KEY, None)
        if record is not None and report.when == "call":
            setattr(report, REPORT_ATTR, record.to_json())
            setattr(report, COMPLETE_ATTR, item.stash.get(COMPLETE_KEY, False))
            roofs = item.stash.get(ROOFS_KEY, None)
            if roofs:
                setattr(report, ROOFS_ATTR, roofs)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect records on the controller (or in a serial run) from the call reports."""
        data = getattr(report, REPORT_ATTR, None)
        if data is None or report.when != "call":
            return
        record = TestRecord.from_json(report.nodeid, data)
        outcome: str = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        self.records[report.nodeid] = dataclasses.replace(record, outcome=outcome)
        self.roofs.update(getattr(report, ROOFS_ATTR, None) or {})
        if getattr(report, COMPLETE_ATTR, False):
            self.complete.add(report.nodeid)
        else:  # a rerun that broke off: its earlier, complete figures are not this run's
            self.complete.discard(report.nodeid)

    # ------------------------------------------------------------------ session end

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if is_xdist_worker(self.config):
            workeroutput = getattr(self.config, "workeroutput", {})
            workeroutput[USAGE_ERRORS_OUTPUT] = self.usage_errors
            workeroutput[CHOICES_OUTPUT] = [list(choice) for choice in local_choices()]
            return
        if self.usage_errors:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
            if self.config.pluginmanager.get_plugin("terminalreporter") is None:
                for message in self._unique_usage_errors():
                    sys.stderr.write(f"ERROR: {message}\n")
        if session.exitstatus == pytest.ExitCode.USAGE_ERROR:
            return  # no test ran: no report or baseline says anything about this run

        self.reporter = SessionReporter(
            self.config,
            self.settings,
            self.records,
            self.baseline,
            complete=self.complete,
            roofs=self.roofs,
            kernel_choices=self._kernel_choices,
        )
        status = self.reporter.finish()
        # Keep a worse status pytest already has (failed tests 1, interrupted 2, ...).
        if status and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = status
        if self.config.pluginmanager.get_plugin("terminalreporter") is None:
            self.reporter.print_errors(sys.stderr)  # -p no:terminal: the errors still show

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: collect the marker errors a worker found, and the host GEMM
        kernels it chose by timing."""
        output = getattr(node, "workeroutput", None) or {}
        self.usage_errors.extend(output.get(USAGE_ERRORS_OUTPUT, ()))
        self.worker_choices.extend(tuple(choice) for choice in output.get(CHOICES_OUTPUT, ()))

    def _unique_usage_errors(self) -> list[str]:
        return list(dict.fromkeys(self.usage_errors))  # each worker reports every item

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for message in self._unique_usage_errors():
            terminalreporter.write_line(f"ERROR: {message}", red=True, bold=True)
        if self.reporter is not None:
            self.reporter.terminal_summary(terminalreporter)
        line = summary_line(self._kernel_choices)
        if line is not None:
            terminalreporter.write_line(line)

    @functools.cached_property
    def _kernel_choices(self) -> dict[str, str]:
        """The host GEMM kernels chosen by timing: the workers' and this process's own, united
        once, at the session's end (the reports, then the summary line)."""
        return united([*self.worker_choices, *local_choices()])


def _quiet_trace_logger() -> None:
    if "torch._logging._internal" in sys.modules:
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.watch.dynamo import detach_foreign_trace_handlers

        detach_foreign_trace_handlers()
