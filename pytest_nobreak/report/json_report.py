"""The ``--nobreak-json`` report (schema version 1).

Pure logic: :class:`TestRecord` is what one test produced, as plain JSON both in the report and
on the way from an xdist worker to the controller; :func:`build_report` makes the document and
:func:`write_report` writes it atomically.

The report is a CI artifact of one run: it holds this run's tests only and replaces the file,
even when no test was watched (an empty ``tests``), so a CI step can upload it unconditionally
and never ships a stale entry as if it had just run. Combining the reports of several runs is
an explicit command, :func:`merge_files`::

    python -m pytest_nobreak.report.json_report merge all.json unit.json models.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

from pytest_nobreak.gate.atomic import write_atomic
from pytest_nobreak.report.roofline import Roof, is_positive_number
from pytest_nobreak.watch.events import (
    ASIC_FIGURES,
    BREAK_KINDS,
    CORE_FIGURES,
    REQUIRED_ASIC_FIGURES,
    REQUIRED_CORE_FIGURES,
    SCOPES,
    BreakEvent,
    BreakKind,
    CallSite,
    ChainLink,
    Figures,
    GemmRecord,
    OtherSite,
    Scope,
)

__all__ = [
    "VERSION",
    "ReportError",
    "TestRecord",
    "build_report",
    "check_report_path",
    "dump_report",
    "merge_files",
    "merge_report",
    "read_report",
    "write_document",
    "write_report",
]

#: The report's section of the devices' roofs (by device key), for the HTML roofline.
ROOFS_KEY = "roofs"
#: The report's section of each ``--nobreak-model`` check's skip or failure reason, and whether
#: its compiled calls had run (by nodeid).
MODELS_KEY = "models"
#: The report's section of each ``--nobreak-model`` model's family (LLM, vision, ...), by SPEC.
FAMILIES_KEY = "families"
#: The report's section of the host GEMM kernel the ASIC backend kept by timing, by shape
#: (``"1×2048×6144 1T linear": "int16"``: :mod:`pytest_nobreak.report.kernel_choices`).
CHOICES_KEY = "host_gemm_choices"

VERSION = 1


#: What to do about a report path that cannot be used, in a pytest run.
PATH_HINT = "delete it or pass another --nobreak-json path"
PATH_HINT_NEW = "pass another --nobreak-json path"


class ReportError(Exception):
    """A report file cannot be read, replaced or written. ``str()`` is one line."""

    def __init__(self, path: str | os.PathLike[str], problem: str, hint: str = PATH_HINT) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        self.hint = hint
        super().__init__(f"JSON report {self.path}: {problem}" + (f"; {hint}" if hint else ""))


@dataclasses.dataclass(frozen=True)
class TestRecord:
    """What one watched test produced: its outcome, its figures and its break events."""

    __test__: ClassVar[bool] = False  # a class named Test* must not be collected by pytest

    nodeid: str
    outcome: str  # pytest's word: "passed", "failed", "skipped", ...
    marked: bool  # whether the test carried no_graph_break (breaks fail it)
    figures: Figures
    breaks: tuple[BreakEvent, ...] = ()
    #: Why each recompile happened (the guard that failed), in order.
    recompile_reasons: tuple[str, ...] = ()
    #: The DUT GEMMs the test ran, by device, family and shape.
    gemms: tuple[GemmRecord, ...] = ()
    #: The verdict's scope (the marker's ``scope=``, else ``--nobreak-scope``): under
    #: ``"own"``, a library's problems are reported, not failed.
    scope: Scope = "all"

    @property
    def reported_breaks(self) -> tuple[BreakEvent, ...]:
        """The breaks the terminal summary, JUnit and GitHub report: every break of a marked
        test; an unmarked test's but its compile errors. An error raised to an unmarked test is
        the test's own business: if it handled it, the rejection was expected (``pytest.raises``
        around a ``fullgraph=True`` compile); if not, the test failed with it. The JSON report
        keeps every break, with its kind."""
        if self.marked:
            return self.breaks
        return tuple(event for event in self.breaks if event.kind != "compile_error")

    def split_by_scope(
        self, events: Sequence[BreakEvent]
    ) -> tuple[list[BreakEvent], list[BreakEvent]]:
        """``events`` as the verdict saw them: those it judged, and those a ``scope="own"``
        verdict only reported (a library's), each in order."""
        if self.scope != "own":
            return list(events), []
        return [e for e in events if e.own], [e for e in events if not e.own]

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
        if self.recompile_reasons:
            entry["recompile_reasons"] = list(self.recompile_reasons)
        if self.gemms:
            entry["gemms"] = [gemm.to_json() for gemm in self.gemms]
        if self.scope != "all":
            entry["scope"] = self.scope
        return entry

    @classmethod
    def from_json(cls, nodeid: str, data: Mapping[str, Any]) -> TestRecord:
        """Rebuild a record from :meth:`to_json` output. Raises ``ValueError`` if malformed."""
        where = f"record of {nodeid!r}"
        outcome = _field(data, "outcome", str, where)
        marked = _field(data, "marked", bool, where)
        # A figure added after the first release (host_syncs; host_macs and syncs of the ASIC)
        # may be absent: an older writer did not measure it, so it is None, never 0.
        figures = {
            name: _count(data, name, where)
            for name in CORE_FIGURES
            if name in REQUIRED_CORE_FIGURES or data.get(name) is not None
        }
        asic = data.get("asic")
        if asic is not None:
            if not isinstance(asic, Mapping):
                raise ValueError(f"{where}: 'asic' must be an object, not {asic!r}")
            for name in ASIC_FIGURES:
                if name in REQUIRED_ASIC_FIGURES or asic.get(name) is not None:
                    figures[name] = _count(asic, name, where)
        breaks = _field(data, "breaks", list, where)
        reasons = data.get("recompile_reasons") or []
        if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
            raise ValueError(f"{where}: 'recompile_reasons' must be a list of strings")
        gemms = data.get("gemms") or []
        if not isinstance(gemms, list):
            raise ValueError(f"{where}: 'gemms' must be a list, not {gemms!r}")
        scope = data.get("scope", "all")
        if scope not in SCOPES:
            raise ValueError(f"{where}: 'scope' must be one of {', '.join(SCOPES)}, not {scope!r}")
        return cls(
            nodeid=nodeid,
            outcome=outcome,
            marked=marked,
            figures=Figures(**figures),
            breaks=tuple(_event_from_json(event, where) for event in breaks),
            recompile_reasons=tuple(reasons),
            gemms=tuple(GemmRecord.from_json(gemm, where) for gemm in gemms),
            scope=scope,
        )


def build_report(
    torch_version: str,
    backend: str,
    device: str,
    records: Iterable[TestRecord],
    *,
    asic_sim: str | None = None,
    host_gemm: str | None = None,
    host_passes: str | None = None,
    complete: Iterable[str] | None = None,
    roofs: Mapping[str, Mapping[str, Any]] | None = None,
    kernel_choices: Mapping[str, str] | None = None,
    models: Mapping[str, Mapping[str, Any]] | None = None,
    families: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The report document for the tests of this run.

    ``asic_sim`` (the simulator's model version) goes in the header when known, and
    ``host_gemm`` (the host kernel that computed the DUT's products, with why: a fact about the
    run's speed, not its figures, so reports of different kernels merge) and ``host_passes``
    (the same for the quantization and rescale around them) when the run used the ASIC
    backend; a test not in
    ``complete`` (it broke off half-way, so its figures are partial) gets ``"complete": false``,
    which keeps it out of a baseline made from the report (``python -m pytest_nobreak merge``).
    ``roofs`` are the roofs (peak ops/s, DRAM bandwidth) of the devices the tests' GEMMs ran
    on, by device key, for the roofline of the HTML report; ``kernel_choices`` the host GEMM
    kernel the ASIC backend kept by timing, by shape
    (:func:`pytest_nobreak.report.kernel_choices.united`); ``models`` the skip or failure
    reason of each ``--nobreak-model`` check that did not pass, and whether its compiled calls
    had all run (``{"reason": ..., "finished": ...}``, and ``"built": false`` for a named model
    that could not be built, so failed), by nodeid, for the model-zoo table; ``families`` the
    family of each model (:data:`pytest_nobreak.models.families.FAMILIES`), by SPEC, for its
    counts per family.
    """
    finished = None if complete is None else set(complete)
    tests = {}
    for record in records:
        entry = record.to_json()
        if finished is not None and record.nodeid not in finished:
            entry["complete"] = False
        tests[record.nodeid] = entry
    report: dict[str, Any] = {
        "version": VERSION,
        "torch": torch_version,
        "backend": backend,
        "device": device,
    }
    if asic_sim is not None:
        report["asic_sim"] = asic_sim
    if host_gemm is not None:
        report["host_gemm"] = host_gemm
    if host_passes is not None:
        report["host_passes"] = host_passes
    if roofs:
        report[ROOFS_KEY] = {key: dict(value) for key, value in roofs.items()}
    if kernel_choices:
        report[CHOICES_KEY] = dict(sorted(kernel_choices.items()))
    if models:
        report[MODELS_KEY] = {key: dict(note) for key, note in sorted(models.items())}
    if families:
        report[FAMILIES_KEY] = dict(sorted(families.items()))
    report["tests"] = tests
    return report


def merge_report(existing: Mapping[str, Any] | None, report: Mapping[str, Any]) -> dict[str, Any]:
    """``report`` plus the entries of ``existing`` for the tests ``report`` does not have.

    Kept entries are copied as they are; the header is ``report``'s. A test's note (its skip
    or failure reason, in ``models``) goes with its entry: a test ``report`` has keeps only
    ``report``'s note, so a check that passes now does not keep an old run's reason.
    """
    tests = dict(existing["tests"]) if existing is not None else {}
    tests.update(report["tests"])
    if existing is not None and existing.get(MODELS_KEY):
        notes = existing[MODELS_KEY]
        kept = {key: note for key, note in notes.items() if key not in report["tests"]}
        existing = {**existing, MODELS_KEY: kept}
    return {**report, "tests": tests, **merge_sections(existing, report)}


#: The report's sections keyed like ``tests`` (by device key, by nodeid, by SPEC, by shape) that
#: merging several reports unites: the devices' roofs, the model checks' reasons, the models'
#: families, the host GEMM kernels chosen by timing (a later report's wins a shape both timed;
#: the shards of one run name both: :func:`~pytest_nobreak.report.kernel_choices.across_shards`).
KEYED_SECTIONS = (ROOFS_KEY, MODELS_KEY, FAMILIES_KEY, CHOICES_KEY)


def merge_sections(*documents: Mapping[str, Any] | None) -> dict[str, Any]:
    """The :data:`KEYED_SECTIONS` of several reports, each united by key (a later one wins a
    tie; reports of one configuration agree on the roofs), sorted; empty ones left out."""
    out: dict[str, Any] = {}
    for section in KEYED_SECTIONS:
        united: dict[str, Any] = {}
        for document in documents:
            if document is not None:
                united.update(document.get(section) or {})
        if united:
            out[section] = dict(sorted(united.items()))
    return out


def dump_report(report: Mapping[str, Any]) -> str:
    """The file's text: keys sorted, so the same report always gives the same bytes."""
    return json.dumps(report, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def read_report(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The report at ``path``; ``None`` if there is none. Raises :class:`ReportError`."""
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
    problem = _section_problem(document)
    if problem:
        raise ReportError(path, problem)
    return document


#: What each device of the ``roofs`` section holds: a :class:`~pytest_nobreak.report.roofline.Roof`
#: but its name, the device key (``pytest_nobreak.benchmark.roof_fields`` makes them).
ROOF_FIELDS = tuple(f.name for f in dataclasses.fields(Roof) if f.name != "name")


def _section_problem(document: Mapping[str, Any]) -> str | None:
    """What is wrong with the sections of a report besides ``tests`` (the roofs, the models'
    notes and families, the host kernels), or None."""
    roofs = document.get(ROOFS_KEY, {})
    if not isinstance(roofs, dict):
        return f'"{ROOFS_KEY}" must be an object of devices, not {roofs!r}'
    for key, roof in roofs.items():
        if not isinstance(roof, dict) or set(roof) != set(ROOF_FIELDS):
            return f'"{ROOFS_KEY}" of {key!r} must hold exactly {", ".join(ROOF_FIELDS)}'
        for name in ROOF_FIELDS:
            value = roof[name]
            text = name == "description"
            if isinstance(value, str) if text else is_positive_number(value):
                continue
            wanted = "a string" if text else "a number > 0"
            return f'"{ROOFS_KEY}" of {key!r}: {name} must be {wanted}, not {value!r}'
    models = document.get(MODELS_KEY, {})
    if not isinstance(models, dict) or not all(
        isinstance(note, dict)
        and {"reason", "finished"} <= set(note) <= {"reason", "finished", "built"}
        and isinstance(note["reason"], str)
        and isinstance(note["finished"], bool)
        and isinstance(note.get("built", False), bool)
        for note in models.values()
    ):
        return (
            f'"{MODELS_KEY}" must be an object of {{"reason": str, "finished": bool'
            '[, "built": bool]} by test id'
        )
    families = document.get(FAMILIES_KEY, {})
    if not isinstance(families, dict) or not all(
        isinstance(family, str) for family in families.values()
    ):
        return f'"{FAMILIES_KEY}" must be an object of family names by SPEC'
    choices = document.get(CHOICES_KEY, {})
    if not isinstance(choices, dict) or not all(
        isinstance(kernel, str) for kernel in choices.values()
    ):
        return f'"{CHOICES_KEY}" must be an object of host GEMM kernels by shape'
    for field in HOST_FIELDS:
        if not isinstance(document.get(field, ""), str):
            return f'"{field}" must be a string, not {document[field]!r}'
    return None


def check_report_path(path: str | os.PathLike[str]) -> None:
    """Raise :class:`ReportError` unless a report can be written at ``path``.

    Called before any test runs, so a typo in the path costs seconds, not the whole run. Only
    looks: the path must not be a directory, its nearest existing parent must be a directory
    this process may write in (missing ones are created at the end), and a file already there
    must be a report (it is replaced; anything else is never clobbered).
    """
    p = Path(path)
    if p.is_dir():
        raise ReportError(path, "is a directory", "pass the path of a file")
    if p.exists():
        read_report(p)
        return
    parent = next(d for d in p.parents if d.exists())  # the last one is "." or "/"
    if not parent.is_dir():
        raise ReportError(path, f"{_shown(parent)} is not a directory", PATH_HINT_NEW)
    if not os.access(parent, os.W_OK | os.X_OK):
        problem = f"cannot write in {_shown(parent)}: permission denied"
        raise ReportError(path, problem, PATH_HINT_NEW)


def _shown(path: Path) -> str:
    # Relative to the working directory when below it, as the user typed it.
    relative = os.path.relpath(path)
    return os.fspath(path) if relative.startswith("..") else relative


def write_report(
    path: str | os.PathLike[str],
    torch_version: str,
    backend: str,
    device: str,
    records: Iterable[TestRecord],
    *,
    asic_sim: str | None = None,
    complete: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Write this run's report to ``path`` atomically, replacing the file; return what was
    written. The entries of an earlier report are not kept (see the module docstring)."""
    report = build_report(
        torch_version, backend, device, records, asic_sim=asic_sim, complete=complete
    )
    write_document(path, report)
    return report


def write_document(path: str | os.PathLike[str], report: Mapping[str, Any]) -> None:
    """Write a report document (:func:`build_report`'s) to ``path`` atomically."""
    write_atomic(path, dump_report(report))


#: The header fields that must agree for reports to be merged.
CONFIGURATION = ("version", "torch", "asic_sim", "backend", "device")
#: The header fields that name how the host computed (a run's speed, not its figures): reports
#: that differ in them merge.
HOST_FIELDS = ("host_gemm", "host_passes")


def merge_files(output: str | os.PathLike[str], inputs: list[str | os.PathLike[str]]) -> int:
    """Merge the reports ``inputs`` into ``output`` (written atomically); return its test count.

    A test in several inputs keeps its entry from the last one. The inputs must come from one
    configuration (torch release, backend and device): figures of different configurations are
    not comparable, and one header could not describe them.
    """
    documents = [(path, read_input(path)) for path in inputs]
    first_path, first = documents[0]
    merged: dict[str, Any] = first
    for path, document in documents[1:]:
        differ = [key for key in CONFIGURATION if document.get(key) != first.get(key)]
        if differ:
            raise ReportError(
                path,
                f"is from {describe(document, differ)}, {os.fspath(first_path)} from "
                f"{describe(first, differ)}; merge reports of one configuration only",
                "",
            )
        merged = merge_report(merged, document)
    write_atomic(output, dump_report(merged))
    return len(merged["tests"])


def read_input(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A report given to a command (not written by this pytest run): it must exist. Raises
    :class:`ReportError` without the hint about ``--nobreak-json``."""
    try:
        document = read_report(path)
    except ReportError as exc:
        raise ReportError(path, exc.problem, "") from None
    if document is None:
        raise ReportError(path, "does not exist", "")
    return document


def describe(document: Mapping[str, Any], keys: Iterable[str]) -> str:
    """The header fields ``keys`` of a report, for a message: ``torch '2.13.0', device ''``."""
    return ", ".join(f"{key} {document.get(key)!r}" for key in keys)


def main(argv: list[str] | None = None) -> int:
    """``python -m pytest_nobreak.report.json_report merge OUTPUT REPORT...``"""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_nobreak.report.json_report",
        description="Work with pytest-nobreak JSON reports (--nobreak-json).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    merge = commands.add_parser(
        "merge",
        help="merge the reports of several runs into one; a test in several keeps its last entry",
    )
    merge.add_argument("output", help="the merged report to write (may be one of the inputs)")
    merge.add_argument("reports", nargs="+", help="reports to merge, in order")
    args = parser.parse_args(argv)
    try:
        count = merge_files(args.output, args.reports)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"merged {len(args.reports)} reports ({count} tests) into {args.output}")
    return 0


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
        chain=tuple(ChainLink.from_label(str(x)) for x in _list(data, "chain", where)),
        call_sites=tuple(_call_site(d, where) for d in _list(data, "call_sites", where)),
        library=_optional(data, "library", str, where),
        # Absent in a report written before owners: unknown, which counts as the user's.
        owner=_optional(data, "owner", str, where),
        fix=_optional(data, "fix", str, where),
        source=_optional(data, "source", str, where),
        hints=_strings(data, "hints", where),
        link=_optional(data, "link", str, where),
        detail=_optional(data, "detail", str, where),
        also_at=tuple(_other_site(d, where) for d in _list(data, "also_at", where)),
        **_context(data.get("context"), where),
    )


def _list(data: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = data.get(key) or []
    if not isinstance(value, list):
        raise ValueError(f"{where}: {key!r} must be a list, not {value!r}")
    return value


def _other_site(data: Any, where: str) -> OtherSite:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: a site must be an object, not {data!r}")
    return OtherSite(
        _optional(data, "file", str, where),
        _optional(data, "line", int, where),
        _count(data, "calls", where),
    )


def _strings(data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = data.get(key) or []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{where}: {key!r} must be a list of strings, not {value!r}")
    return tuple(value)


def _context(data: Any, where: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: 'context' must be an object, not {data!r}")
    return {
        "context_start": _count(data, "start", where),
        "context": _strings(data, "lines", where),
    }


def _call_site(data: Any, where: str) -> CallSite:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: a call site must be an object, not {data!r}")
    return CallSite(
        _field(data, "file", str, where),
        _optional(data, "line", int, where),
        _optional(data, "source", str, where),
    )


def _optional_count(data: Mapping[str, Any], key: str, where: str) -> int | None:
    return None if data.get(key) is None else _count(data, key, where)


if __name__ == "__main__":
    sys.exit(main())
