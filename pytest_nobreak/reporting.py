"""What the controller does once the tests ran: files, baseline verdict, terminal summary.

Runs only on the xdist controller (or in a serial run), from ``pytest_sessionfinish``. Nothing
here raises into pytest: a problem with a file is one error line and a non-zero exit status.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import pytest

from pytest_nobreak.baseline import Baseline, Comparison, compare, updated, write_baseline
from pytest_nobreak.config import NobreakConfig
from pytest_nobreak.json_report import TestRecord
from pytest_nobreak.render import KIND_LABELS, short_path

#: pytest's exit status for "some gate failed" (the same as failed tests).
GATE_FAILED = pytest.ExitCode.TESTS_FAILED
USAGE_ERROR = pytest.ExitCode.USAGE_ERROR


class SessionReporter:
    def __init__(
        self,
        config: pytest.Config,
        settings: NobreakConfig,
        records: Mapping[str, TestRecord],
        baseline: Baseline | None,
    ) -> None:
        self.config = config
        self.settings = settings
        self.records = dict(sorted(records.items()))
        self.baseline = baseline
        self.comparison: Comparison | None = None
        self.lines: list[tuple[str, str | None]] = []
        self.errors: list[str] = []

    # ------------------------------------------------------------------ session end

    def finish(self) -> int:
        """Write files and judge the run; return a non-zero exit status if a gate failed."""
        status = 0
        if self.settings.baseline_path is not None and self.records:
            status |= self._gate_baseline()
        if self.settings.json_path is not None and self.records:
            status |= self._write_json()
        status |= self._github()
        return status

    def _asic_sim(self) -> str | None:
        if "asic_backend" not in sys.modules:
            return None
        from asic_backend import SIM_VERSION

        return SIM_VERSION

    def _gate_baseline(self) -> int:
        path = self.settings.baseline_path
        assert path is not None
        results = {nodeid: r.figures for nodeid, r in self.records.items()}
        torch, sim = self._torch_version(), self._asic_sim()
        self.comparison = compare(
            self.baseline, results, strict=self.settings.strict, torch=torch, asic_sim=sim
        )
        if self.settings.update_baseline:
            try:
                write_baseline(path, updated(self.baseline, results, torch, sim))
            except OSError as exc:
                self.errors.append(f"nobreak: cannot write baseline {path}: {exc}")
                return int(GATE_FAILED)
            self.lines.extend(self.comparison.render_lines(updating=True))
            return 0
        self.lines.extend(self.comparison.render_lines())
        return int(GATE_FAILED) if self.comparison.failed else 0

    def _github(self) -> int:
        from pytest_nobreak.github import emit

        problems = emit(
            list(self.records.values()),
            self.comparison,
            os.environ,
            stream=sys.stderr,
            rootdir=str(self.config.rootpath),
        )
        self.lines.extend((f"nobreak: {p}", "yellow") for p in problems)
        return 0

    def _torch_version(self) -> str:
        if "torch" not in sys.modules:
            return "unknown"
        from pytest_nobreak._torch_compat import torch_version

        return torch_version()

    def _device(self) -> str:
        if not self.settings.asic:
            return ""
        from asic_backend.config import AsicConfig

        spec = self.settings.asic_device
        return (AsicConfig.load(spec) if spec else AsicConfig.from_env()).key

    def _write_json(self) -> int:
        from pytest_nobreak.json_report import ReportError, write_report

        path = self.settings.json_path
        assert path is not None
        try:
            write_report(
                path,
                self._torch_version(),
                self.settings.fixture_backend,
                self._device(),
                self.records.values(),
            )
        except (ReportError, OSError) as exc:
            self.errors.append(f"nobreak: {exc}")
            return int(GATE_FAILED)
        self.lines.append((f"nobreak: JSON report written to {path}", None))
        return 0

    # ------------------------------------------------------------------ terminal

    def terminal_summary(self, terminalreporter: Any) -> None:
        """A section only when there is something to say.

        Rows: every watched test with ``-v``; otherwise the tests whose breaks no failure message
        showed (unmarked under ``--nobreak-all``, or expected failures). Then the baseline verdict
        and the files written.
        """
        verbose = self.config.get_verbosity() > 0
        rows = [r for r in self.records.values() if verbose or _unshown_breaks(r)]
        if not (rows or self.lines or self.errors):
            return
        terminalreporter.write_sep("-", "nobreak compile report")
        if rows:
            for text, style in figures_table(rows):
                terminalreporter.write_line(text, **({style: True} if style else {}))
        for text, style in self.lines:
            terminalreporter.write_line(text, **({style: True} if style else {}))
        for text in self.errors:
            terminalreporter.write_line(text, red=True, bold=True)


_COLUMNS = (
    ("graphs", "graphs"),
    ("graph_breaks", "breaks"),
    ("eager_frames", "eager"),
    ("recompiles", "recomp"),
    ("dut_ops", "dut_ops"),
    ("host_fallbacks", "host"),
    ("cycles", "cycles"),
)


def _unshown_breaks(record: TestRecord) -> bool:
    return bool(record.breaks) and (not record.marked or record.outcome in ("xfailed", "passed"))


def figures_table(records: list[TestRecord]) -> list[tuple[str, str | None]]:
    """One row per test with its figures and outcome, then its breaks (one line each)."""
    asic = any(r.figures.dut_ops is not None for r in records)
    columns = [c for c in _COLUMNS if asic or c[0] not in ("dut_ops", "host_fallbacks", "cycles")]
    width = max(len("test"), *(len(r.nodeid) for r in records))
    widths = [max(len(title), 6) for _, title in columns]
    header = "  ".join(
        ["test".ljust(width), *(t.rjust(w) for (_, t), w in zip(columns, widths, strict=True))]
    )
    out: list[tuple[str, str | None]] = [(header + "  outcome", None)]
    for record in records:
        values = record.figures.as_dict()
        cells = [
            str(values.get(name, "-")).rjust(w)
            for (name, _), w in zip(columns, widths, strict=True)
        ]
        style = "yellow" if record.breaks else None
        if record.outcome == "failed":
            style = "red"
        out.append(("  ".join([record.nodeid.ljust(width), *cells, record.outcome]), style))
        for event in record.breaks:
            where = short_path(event.file) or "<unknown>"
            if event.line is not None:
                where += f":{event.line}"
            gb = f" {event.gb_id}" if event.gb_id else ""
            label = KIND_LABELS.get(event.kind, event.kind)
            out.append((f"    {label}{gb} at {where}: {event.gb_type}", None))
    return out


def rel(path: str) -> str:
    return short_path(path, os.getcwd()) or path
