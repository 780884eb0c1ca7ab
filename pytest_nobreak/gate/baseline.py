"""The baseline file: the per-test compile figures CI gates on.

Pure logic (no pytest, no torch): load and validate the file, compare a run against it, merge a
run into it, and write it back. The hooks in ``plugin.py`` only feed it figures and print what it
renders.

The file is JSON with sorted keys and integers only, so diffs are exactly the figures that moved::

    {"asic_sim": "1", "tests": {"tests/test_m.py::test_a": {"graph_breaks": 0, "graphs": 1, ...}},
     "torch": "2.13.0", "version": 1}

Decisions, in one place:

- Which way each figure should move is the table :data:`BETTER`. A move the wrong way is a
  regression, the other way an improvement; the one exception is ``cycles``, which may rise
  when more of the test's MACs moved onto the DUT.
- A test that ran but has no entry is *missing*: a warning, or a failure under strict mode.
- An entry whose test did not run is left alone: partial runs (``-k``, one file, a subset on
  each xdist worker) are normal and say nothing about the other tests.
- If the baseline was recorded with another torch release or simulator version, the figures are
  still compared and shown, but regressions are warnings, not failures: a torch upgrade legitimately
  moves graph counts, and failing every test on the upgrade PR would teach people to re-record
  blindly. The fix is to re-record on the new version. Local build tags (``+cpu``, ``+cu126``)
  do not count as a different version: Dynamo traces the same way, and the baseline is often
  recorded on a laptop and checked on CI.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pytest_nobreak.gate.atomic import write_atomic
from pytest_nobreak.watch.events import (
    ALL_FIGURES,
    ASIC_FIGURES,
    REQUIRED_ASIC_FIGURES,
    REQUIRED_CORE_FIGURES,
    Figures,
)

__all__ = [
    "BETTER",
    "VERSION",
    "Baseline",
    "BaselineError",
    "Change",
    "Comparison",
    "compare",
    "dump_baseline",
    "load_baseline",
    "updated",
    "write_baseline",
]

VERSION = 1
UPDATE_OPTION = "--nobreak-update-baseline"

Better = Literal["lower", "higher"]
Style = Literal["red", "green", "yellow"] | None

#: Which way each figure should move. The only place that decides what a regression is.
BETTER: Mapping[str, Better] = MappingProxyType(
    {
        "graphs": "lower",  # one more graph means the frame was split somewhere new
        "graph_breaks": "lower",
        "eager_frames": "lower",
        "recompiles": "lower",
        "host_syncs": "lower",  # one more device->host round trip the host waits for
        # A library's break that appears is a regression too, under scope="own" as well: an
        # upgrade that adds breaks shows in the gate even where it fails no test.
        "foreign_breaks": "lower",
        "export_problems": "lower",  # the exported program lost soundness or dynamism
        "specialized_dims": "lower",
        "dut_ops": "higher",  # fewer ops on the device: that work moved to the host
        "host_fallbacks": "lower",
        # DUT + host MACs are the model's own count (FlopCounterMode's), so MACs on the DUT only
        # fall when work moved to the host, and only rise when it moved back.
        "macs": "higher",
        "host_macs": "lower",  # work that moved off the DUT (or a host op grew)
        "cycles": "lower",  # the same work took longer (see _moved_onto_the_dut)
        "syncs": "lower",  # the DUT stalled for the host once more (each costs cycles too)
    }
)


class BaselineError(Exception):
    """The baseline file cannot be used. ``str()`` is one line naming the file and the problem."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(self.message())

    def message(self, command: str = f"pytest {UPDATE_OPTION}") -> str:
        """The one line, with ``command`` as the way to re-record (it must name the file when
        the ini does not)."""
        return (
            f"baseline file {self.path}: {self.problem}; fix or restore the file, "
            f"or delete it and re-record with {command}"
        )


@dataclasses.dataclass(frozen=True)
class Baseline:
    """A parsed baseline file: the versions it was recorded with and one entry per test."""

    torch: str
    asic_sim: str | None
    entries: Mapping[str, Figures]

    def __post_init__(self) -> None:
        # A read-only sorted copy: the caller's dict may keep changing, and floats or negative
        # numbers must never reach the file, whoever built the figures.
        for nodeid, figures in self.entries.items():
            for name in ALL_FIGURES:
                value = getattr(figures, name)  # raw: as_dict() would round 1.5 down quietly
                if value is not None and (type(value) is not int or value < 0):
                    raise ValueError(f"{nodeid}: figure {name} is {value!r}, not an integer >= 0")
        object.__setattr__(self, "entries", MappingProxyType(dict(sorted(self.entries.items()))))


@dataclasses.dataclass(frozen=True)
class Change:
    """One figure of one test that differs from the baseline.

    ``before``/``after`` are ``None`` when the figure was not measured on that side (ASIC figures
    of a run without the ASIC backend).
    """

    nodeid: str
    figure: str
    before: int | None
    after: int | None

    @property
    def is_regression(self) -> bool:
        # Not measured counts as zero: a test that stopped reaching the ASIC has 0 ops on it.
        delta = (self.after or 0) - (self.before or 0)
        return delta > 0 if BETTER[self.figure] == "lower" else delta < 0

    def describe(self) -> str:
        """``graph_breaks 0 -> 2``."""
        return f"{self.figure} {_show_figure(self.before)} -> {_show_figure(self.after)}"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The outcome of comparing one run with the baseline. Sorted by nodeid, then figure."""

    regressions: tuple[Change, ...] = ()
    improvements: tuple[Change, ...] = ()
    missing: tuple[str, ...] = ()  # tests that ran but have no baseline entry
    strict: bool = False
    version_mismatch: str | None = None  # e.g. "torch 2.12.0 (this run: 2.13.0)"
    ran: int = 0  # how many tests were compared

    @property
    def failed(self) -> bool:
        """Whether the run must fail: see the module docstring for the rules."""
        return bool(self.regressions and self.version_mismatch is None) or bool(
            self.missing and self.strict
        )

    @property
    def changed(self) -> bool:
        """Whether there is anything to report."""
        return bool(self.regressions or self.improvements or self.missing or self.version_mismatch)

    def by_test(self) -> dict[str, tuple[Change, ...]]:
        """Every change, grouped per test (regressions and improvements together)."""
        grouped: dict[str, list[Change]] = {}
        for change in sorted(self.regressions + self.improvements, key=_change_order):
            grouped.setdefault(change.nodeid, []).append(change)
        return {nodeid: tuple(changes) for nodeid, changes in grouped.items()}

    def render_lines(
        self, *, updating: bool = False, command: str = f"pytest {UPDATE_OPTION}"
    ) -> list[tuple[str, Style]]:
        """The terminal summary as ``(text, style)`` pairs; empty when there is nothing to say.

        ``updating``: the run is rewriting the baseline (``--nobreak-update-baseline``), so the
        changes are listed as accepted and nothing is red. ``command`` is the command line the
        hints tell the user to run: it must name the baseline file when the ini does not.
        """
        if updating:
            return self._render_update()
        if not self.changed:
            return []
        lines: list[tuple[str, Style]] = []
        style: Style
        if self.version_mismatch is not None:
            lines.append(
                (
                    f"baseline was recorded with {self.version_mismatch}: regressions are "
                    f"warnings until it is re-recorded with {command}",
                    "yellow",
                )
            )
        failing = self.version_mismatch is None
        label, style = ("REGRESSION", "red") if failing else ("regression", "yellow")
        for change in self.regressions:
            lines.append((_line(label, change.nodeid, change.describe()), style))
        for nodeid in self.missing:
            if self.strict:
                lines.append((_line("MISSING", nodeid, "not in the baseline (strict)"), "red"))
            else:
                lines.append((_line("missing", nodeid, "not in the baseline"), "yellow"))
        for change in self.improvements:
            lines.append((_line("improved", change.nodeid, change.describe()), "green"))
        if self.regressions or self.missing:
            hint = f"if this is intended, run {command} to accept"
        elif self.improvements:
            hint = f"run {command} to ratchet the baseline down"
        else:
            return lines
        lines.append((f"{hint} (rewrites only the tests that ran)", None))
        return lines

    def _render_update(self) -> list[tuple[str, Style]]:
        lines: list[tuple[str, Style]] = []
        for change in self.regressions:
            lines.append((_line("accepted", change.nodeid, change.describe()), "yellow"))
        for nodeid in self.missing:
            lines.append((_line("recorded", nodeid, "new entry"), None))
        for change in self.improvements:
            lines.append((_line("improved", change.nodeid, change.describe()), "green"))
        tests = "test" if self.ran == 1 else "tests"
        lines.append(
            (f"baseline updated: rewrote the {self.ran} {tests} that ran, kept the others", None)
        )
        return lines


def compare(
    baseline: Baseline | None,
    results: Mapping[str, Figures],
    *,
    strict: bool,
    torch: str,
    asic_sim: str | None,
) -> Comparison:
    """Compare the figures of the tests that ran with their baseline entries.

    ``results`` should hold only tests whose figures are complete (the plugin passes the tests
    that ran to the end). ``torch``/``asic_sim`` are this run's versions; ``baseline`` is
    ``None`` when there is no file yet, which makes every test missing.
    """
    entries: Mapping[str, Figures] = baseline.entries if baseline is not None else {}
    regressions: list[Change] = []
    improvements: list[Change] = []
    missing: list[str] = []
    for nodeid in sorted(results):
        if nodeid not in entries:
            missing.append(nodeid)
            continue
        changes = list(_changes(nodeid, entries[nodeid], results[nodeid]))
        moved_on = _moved_onto_the_dut(changes)
        for change in changes:
            regressed = change.is_regression and not (moved_on and change.figure == "cycles")
            (regressions if regressed else improvements).append(change)
    return Comparison(
        regressions=tuple(regressions),
        improvements=tuple(improvements),
        missing=tuple(missing),
        strict=strict,
        version_mismatch=_version_mismatch(baseline, torch, asic_sim),
        ran=len(results),
    )


def updated(
    baseline: Baseline | None, results: Mapping[str, Figures], torch: str, asic_sim: str | None
) -> Baseline:
    """The baseline with the entries of the tests that ran replaced and all others kept."""
    entries = dict(baseline.entries) if baseline is not None else {}
    entries.update(results)
    return Baseline(torch=torch, asic_sim=asic_sim, entries=entries)


def dump_baseline(baseline: Baseline) -> str:
    """The file's text: the same baseline always gives the same bytes."""
    document = {
        "version": VERSION,
        "torch": baseline.torch,
        "asic_sim": baseline.asic_sim,
        "tests": {nodeid: figures.as_dict() for nodeid, figures in baseline.entries.items()},
    }
    return json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def write_baseline(path: str | os.PathLike[str], baseline: Baseline) -> None:
    """Write the baseline atomically: an interrupted write leaves the old file as it was."""
    write_atomic(path, dump_baseline(baseline))


def load_baseline(path: str | os.PathLike[str]) -> Baseline | None:
    """Read and validate a baseline file; ``None`` if it does not exist.

    Raises :class:`BaselineError` (one line) for anything else that is wrong with it. Only reads.
    """
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BaselineError(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        return _parse(raw)
    except _Invalid as exc:
        raise BaselineError(path, str(exc)) from None


class _Invalid(Exception):
    pass


_CONFLICT_MARKER = re.compile(r"^(<<<<<<<|>>>>>>>)( |$)", re.MULTILINE)


def _parse(raw: bytes) -> Baseline:
    try:
        text = raw.decode("utf-8-sig")  # tolerate the BOM some Windows editors add
    except UnicodeDecodeError as exc:
        raise _Invalid(f"is not UTF-8 text (bad byte at offset {exc.start})") from None
    if not text.strip():
        raise _Invalid("is empty")
    marker = _CONFLICT_MARKER.search(text)
    if marker is not None:
        line = text.count("\n", 0, marker.start()) + 1
        raise _Invalid(f"contains a git merge conflict marker at line {line}")
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise _Invalid(
            f"is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None

    if not isinstance(document, dict):
        raise _Invalid(f"must be a JSON object, not {_kind(document)}")
    if "version" not in document:
        raise _Invalid('has no "version" key')
    version = document["version"]
    if type(version) is not int:
        raise _Invalid(f'"version" must be the integer {VERSION}, not {_show(version)}')
    if version != VERSION:
        newer = "; upgrade pytest-nobreak" if version > VERSION else ""
        raise _Invalid(f"is version {version}, this pytest-nobreak reads version {VERSION}{newer}")
    for key in ("torch", "asic_sim", "tests"):
        if key not in document:
            raise _Invalid(f"has no {_show(key)} key")
    for key in document:
        if key not in ("version", "torch", "asic_sim", "tests"):
            raise _Invalid(f"has an unknown key {_show(key)}")
    torch, asic_sim, tests = document["torch"], document["asic_sim"], document["tests"]
    if not isinstance(torch, str) or not torch:
        raise _Invalid(f'"torch" must be a version string, not {_show(torch)}')
    if asic_sim is not None and (not isinstance(asic_sim, str) or not asic_sim):
        raise _Invalid(f'"asic_sim" must be a version string or null, not {_show(asic_sim)}')
    if not isinstance(tests, dict):
        raise _Invalid(f'"tests" must be an object keyed by test id, not {_kind(tests)}')
    entries = {nodeid: _parse_entry(nodeid, entry) for nodeid, entry in tests.items()}
    return Baseline(torch=torch, asic_sim=asic_sim, entries=entries)


def _parse_entry(nodeid: str, entry: Any) -> Figures:
    where = f"test {_show(nodeid)}"
    if not nodeid:
        raise _Invalid("has a test with an empty id")
    if not isinstance(entry, dict):
        raise _Invalid(f"{where} must map figure names to integers, not {_kind(entry)}")
    for name, value in entry.items():
        if name not in ALL_FIGURES:
            known = ", ".join(ALL_FIGURES)
            raise _Invalid(f"{where} has an unknown figure {_show(name)} (known: {known})")
        if type(value) is not int or value < 0:
            raise _Invalid(f"{where} figure {_show(name)} is {_show(value)}, not an integer >= 0")
    for name in REQUIRED_CORE_FIGURES:
        if name not in entry:
            raise _Invalid(f"{where} has no figure {_show(name)}")
    # host_syncs, host_macs and syncs came later: an entry recorded before them has the other
    # figures, and theirs are "not measured" (never compared) until the next update records them.
    asic = [name for name in ASIC_FIGURES if name in entry]
    if asic and not all(name in entry for name in REQUIRED_ASIC_FIGURES):
        absent = ", ".join(name for name in REQUIRED_ASIC_FIGURES if name not in entry)
        raise _Invalid(
            f"{where} has some ASIC figures but not {absent}: give all of "
            f"{', '.join(REQUIRED_ASIC_FIGURES)} or none"
        )
    return Figures.from_dict(entry)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads silently keeps the last of two equal keys; in a hand-merged baseline that hides
    # one side of the merge.
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise _Invalid(f"has the key {_show(key)} twice in one object")
        document[key] = value
    return document


def _moved_onto_the_dut(changes: list[Change]) -> bool:
    """Whether more of the test's MACs ran on the DUT: its cycles then rise with the work, which
    is the improvement, not a slower device."""
    return any(c.figure == "macs" and (c.after or 0) > (c.before or 0) for c in changes)


def _changes(nodeid: str, before: Figures, after: Figures) -> Iterator[Change]:
    old, new = before.as_dict(), after.as_dict()
    for figure in ALL_FIGURES:
        # When the ASIC figures were measured on one side only, only the device's op count has
        # a meaning across that gap (zero on the side that did not reach the device); cycles or
        # MACs of a run that never reached it are not comparable with anything.
        comparable = (figure in old and figure in new) or figure == "dut_ops"
        if comparable and old.get(figure, 0) != new.get(figure, 0):
            yield Change(nodeid, figure, old.get(figure), new.get(figure))


def _version_mismatch(baseline: Baseline | None, torch: str, asic_sim: str | None) -> str | None:
    if baseline is None:
        return None
    differences = []
    if _release(baseline.torch) != _release(torch):
        differences.append(f"torch {baseline.torch} (this run: {torch})")
    if baseline.asic_sim != asic_sim:
        differences.append(
            f"asic_sim {baseline.asic_sim or 'none'} (this run: {asic_sim or 'none'})"
        )
    return ", ".join(differences) or None


def _release(version: str) -> str:
    return version.split("+", 1)[0]


def _change_order(change: Change) -> tuple[str, int]:
    return change.nodeid, ALL_FIGURES.index(change.figure)


def _line(label: str, nodeid: str, detail: str) -> str:
    return f"{label:<10} {nodeid}  {detail}"


def _show_figure(value: int | None) -> str:
    return "-" if value is None else str(value)


def _show(value: object) -> str:
    # JSON spelling, escaped: a value with a newline in it must not break the one-line message.
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: object) -> str:
    if value is None:
        return "null"
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    return names.get(type(value), "a number")
