"""The ``--nobreak-json`` report (schema version 1, DESIGN.md "Reports").

Pure logic: :class:`TestRecord` is what one test produced, as plain JSON both in the report and
on the way from an xdist worker to the controller; :func:`build_report` and
:func:`merge_report` make the document; :func:`write_report` writes it atomically, keeping the
entries of tests that did not run, as the baseline does.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, cast

from pytest_nobreak.atomic import write_atomic
from pytest_nobreak.events import (
    ASIC_FIGURES,
    BREAK_KINDS,
    CORE_FIGURES,
    REQUIRED_ASIC_FIGURES,
    BreakEvent,
    BreakKind,
    Figures,
)

__all__ = [
    "VERSION",
    "ReportError",
    "TestRecord",
    "build_report",
    "dump_report",
    "merge_report",
    "read_report",
    "write_report",
]

VERSION = 1


class ReportError(Exception):
    """An existing report file cannot be merged into. ``str()`` is one line."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(
            f"JSON report {self.path}: {problem}; delete it or pass another --nobreak-json path"
        )


@dataclasses.dataclass(frozen=True)
class TestRecord:
    """What one watched test produced: its outcome, its figures and its break events."""

    __test__: ClassVar[bool] = False  # a class named Test* must not be collected by pytest

    nodeid: str
    outcome: str  # pytest's word: "passed", "failed", "skipped", ...
    marked: bool  # whether the test carried no_graph_break (breaks fail it)
    figures: Figures
    breaks: tuple[BreakEvent, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The test's entry under ``tests`` in the report (the nodeid is the key, not a field).

        Break events keep the fields of :meth:`BreakEvent.to_json`; the source line, hints,
        link, shapes and other sites are for the failure message and are not carried.
        """
        entry: dict[str, Any] = {"outcome": self.outcome, "marked": self.marked}
        entry.update(self.figures.core())
        entry["breaks"] = [event.to_json() for event in self.breaks]
        asic = self.figures.asic()
        if asic is not None:
            entry["asic"] = asic
        return entry

    @classmethod
    def from_json(cls, nodeid: str, data: Mapping[str, Any]) -> TestRecord:
        """Rebuild a record from :meth:`to_json` output. Raises ``ValueError`` if malformed."""
        where = f"record of {nodeid!r}"
        outcome = _field(data, "outcome", str, where)
        marked = _field(data, "marked", bool, where)
        figures = {name: _count(data, name, where) for name in CORE_FIGURES}
        asic = data.get("asic")
        if asic is not None:
            if not isinstance(asic, Mapping):
                raise ValueError(f"{where}: 'asic' must be an object, not {asic!r}")
            for name in ASIC_FIGURES:
                # A figure added after the first release (host_macs) may be absent: an older
                # writer did not measure it.
                if name in REQUIRED_ASIC_FIGURES or asic.get(name) is not None:
                    figures[name] = _count(asic, name, where)
        breaks = _field(data, "breaks", list, where)
        return cls(
            nodeid=nodeid,
            outcome=outcome,
            marked=marked,
            figures=Figures(**figures),
            breaks=tuple(_event_from_json(event, where) for event in breaks),
        )


def build_report(
    torch_version: str, backend: str, device: str, records: Iterable[TestRecord]
) -> dict[str, Any]:
    """The report document for the tests of this run."""
    return {
        "version": VERSION,
        "torch": torch_version,
        "backend": backend,
        "device": device,
        "tests": {record.nodeid: record.to_json() for record in records},
    }


def merge_report(existing: Mapping[str, Any] | None, report: Mapping[str, Any]) -> dict[str, Any]:
    """``report`` plus the entries of ``existing`` for tests that did not run this time.

    Kept entries are copied as they are; the header is this run's.
    """
    tests = dict(existing["tests"]) if existing is not None else {}
    tests.update(report["tests"])
    return {**report, "tests": tests}


def dump_report(report: Mapping[str, Any]) -> str:
    """The file's text: keys sorted, so the same report always gives the same bytes."""
    return json.dumps(report, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def read_report(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """An earlier report to merge into; ``None`` if there is none. Raises :class:`ReportError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:  # a directory, a path through a file, no permission
        raise ReportError(path, f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ReportError(path, f"cannot be read ({exc})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(
            path, f"is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    if not isinstance(document, dict) or document.get("version") != VERSION:
        raise ReportError(path, f"is not a version {VERSION} pytest-nobreak report")
    tests = document.get("tests")
    if not isinstance(tests, dict) or not all(isinstance(v, dict) for v in tests.values()):
        raise ReportError(path, '"tests" must be an object of per-test objects')
    return document


def write_report(
    path: str | os.PathLike[str],
    torch_version: str,
    backend: str,
    device: str,
    records: Iterable[TestRecord],
) -> dict[str, Any]:
    """Merge this run into the report at ``path`` and write it atomically; return what was written.

    An existing file that is not a valid report raises :class:`ReportError` and is not touched.
    """
    report = merge_report(read_report(path), build_report(torch_version, backend, device, records))
    write_atomic(path, dump_report(report))
    return report


def _field(data: Mapping[str, Any], key: str, kind: type[Any], where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise ValueError(f"{where}: {key!r} must be {kind.__name__}, not {value!r}")
    return value


def _count(data: Mapping[str, Any], key: str, where: str) -> int:
    value = data.get(key)
    if type(value) is not int or value < 0:
        raise ValueError(f"{where}: {key!r} must be an integer >= 0, not {value!r}")
    return value


def _optional(data: Mapping[str, Any], key: str, kind: type[Any], where: str) -> Any:
    return None if data.get(key) is None else _field(data, key, kind, where)


def _event_from_json(data: Any, where: str) -> BreakEvent:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: a break must be an object, not {data!r}")
    kind = _field(data, "kind", str, where)
    if kind not in BREAK_KINDS:
        raise ValueError(f"{where}: unknown break kind {kind!r}")
    return BreakEvent(
        kind=cast(BreakKind, kind),
        gb_type=_field(data, "gb_type", str, where),
        gb_id=_optional(data, "gb_id", str, where),
        file=_optional(data, "file", str, where),
        line=_optional(data, "line", int, where),
        reason=_field(data, "reason", str, where),
        calls=_optional_count(data, "calls", where),
        macs=_optional_count(data, "macs", where),
    )


def _optional_count(data: Mapping[str, Any], key: str, where: str) -> int | None:
    return None if data.get(key) is None else _count(data, key, where)
