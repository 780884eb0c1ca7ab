"""``python -m pytest_nobreak zoo REPORT OUTPUT``: the model-zoo table, from a JSON report.

The report is that of a ``pytest --nobreak-model ... --nobreak-json REPORT`` run (a sweep such
as ``hf:*``). One row per model: whether it compiled whole (or the ids of its breaks),
recompiles, the host syncs of one call, the share of its MACs the DUT ran, the host ops left,
the cycles and utilization of one call on the run's device, and what ``torch.export`` made of
it. Each column comes from the check that measures it: breaks from ``compiles_whole`` (else
``on_dut``, the same compile under the ASIC), figures from ``on_dut``, recompiles from
``no_recompile`` when it ran, the export from ``exports``. The table is
only ever written by this command, so it always says what a run measured.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from asic_backend.sim.config import AsicConfig
from pytest_nobreak.gate.atomic import write_atomic
from pytest_nobreak.models.items import COLLECTOR_PREFIX
from pytest_nobreak.report.json_report import (
    FAMILIES_KEY,
    MODELS_KEY,
    ReportError,
    TestRecord,
    read_input,
)
from pytest_nobreak.report.zoo.families import family_table
from pytest_nobreak.watch.events import EXPORT_KINDS, HOST_FALLBACK_PREFIX
from pytest_nobreak.watch.export_report import MODES, NARROWED_WORDS, REJECTED_WORDS

__all__ = ["Row", "breakdown", "main", "render_zoo", "rows_of"]

#: The kinds of event that are not breaks: work left on the host, and host syncs inside a
#: compiled graph (the model still compiled whole).
_NOT_BREAKS = ("host_fallback", "host_sync")
_NODEID = re.compile(re.escape(COLLECTOR_PREFIX) + r"\[(?P<spec>.*)\]::(?P<check>\w+)$")
#: Reasons are grouped by their text with names, numbers and shapes blanked out.
_DETAIL = re.compile(r"'[^']*'|\"[^\"]*\"|\b\d[\w.]*|\[[^\]]*\]|\([^)]*\)")


class Row:
    """One model of the table, from its checks' entries in the report."""

    def __init__(
        self,
        spec: str,
        entries: Mapping[str, Mapping[str, Any]],
        notes: Mapping[str, str],
        finished: Mapping[str, bool] | None = None,
        unbuilt: bool = False,
    ):
        self.spec = spec
        self.entries = entries
        self.notes = notes
        #: Per check that did not pass: whether its compiled calls had all run.
        self.finished_checks = dict(finished or {})
        #: A named model that could not be built: its checks failed, but nothing was checked.
        self.unbuilt = unbuilt

    def _check(self, *checks: str) -> str | None:
        """The first of ``checks`` that ran (was not skipped)."""
        for check in checks:
            entry = self.entries.get(check)
            if entry is not None and entry.get("outcome") != "skipped":
                return check
        return None

    def _entry(self, *checks: str) -> Mapping[str, Any] | None:
        check = self._check(*checks)
        return None if check is None else self.entries[check]

    @property
    def skipped(self) -> str | None:
        """The reason the model could not be checked (it was not built), or ``None``."""
        if not self.unbuilt and self._entry(*self.entries) is not None:
            return None
        for check in self.entries:
            if check in self.notes:
                return _strip_spec(self.notes[check], self.spec)
        return "skipped"

    #: The checks whose entry holds the model's breaks, in order of preference.
    _COMPILE_CHECKS = ("compiles_whole", "on_dut", "no_recompile", "benchmark")

    @property
    def compile_entry(self) -> Mapping[str, Any] | None:
        return self._entry(*self._COMPILE_CHECKS)

    @property
    def break_ids(self) -> list[str]:
        """The gb ids (or kinds) of the breaks and eager fallbacks, host fallbacks and host
        syncs left out."""
        entry = self.compile_entry or {}
        ids = [
            event.get("gb_id") or event["kind"].replace("_", " ")
            for event in entry.get("breaks", ())
            if event["kind"] not in _NOT_BREAKS
        ]
        return list(dict.fromkeys(ids))

    @property
    def break_types(self) -> dict[str, str]:
        """The Dynamo type of each of :attr:`break_ids` ("Data-dependent branching")."""
        entry = self.compile_entry or {}
        return {
            event.get("gb_id") or event["kind"].replace("_", " "): event.get("gb_type", "")
            for event in entry.get("breaks", ())
            if event["kind"] not in _NOT_BREAKS
        }

    @property
    def finished(self) -> bool:
        """The compile check's compiled calls all ran (it was not cut off by the time limit or
        a crash): only then does an empty list of breaks mean the model compiled whole."""
        check = self._check(*self._COMPILE_CHECKS)
        return check is not None and self.finished_checks.get(check, True)

    @property
    def whole(self) -> bool:
        entry = self.compile_entry
        return (
            entry is not None
            and self.finished
            and not self.break_ids
            and not entry.get("eager_frames")
        )

    @property
    def failure(self) -> str | None:
        """Why a check failed when it was not for its breaks (a crash, numerics, the limit)."""
        for check in ("compiles_whole", "on_dut", "no_recompile"):
            entry = self.entries.get(check)
            if entry and entry.get("outcome") == "failed" and check in self.notes:
                note = _strip_spec(self.notes[check], self.spec)
                if not note.startswith("@pytest.mark"):
                    return note
        return None

    @property
    def recompiles(self) -> int | None:
        entry = self._entry("no_recompile", "compiles_whole", "on_dut")
        return None if entry is None else int(entry.get("recompiles", 0))

    #: The checks whose entry holds the figures of one call, in order of preference.
    _FIGURE_CHECKS = ("on_dut", "compiles_whole", "benchmark")

    @property
    def measured(self) -> bool:
        """A check with the figures of one call ran."""
        return self._entry(*self._FIGURE_CHECKS) is not None

    @property
    def host_syncs(self) -> int | None:
        """The host syncs of one call; ``None`` when not measured (a report from before them)."""
        entry = self._entry(*self._FIGURE_CHECKS)
        value = None if entry is None else entry.get("host_syncs")
        return None if value is None else int(value)

    @property
    def sync_ops(self) -> list[str]:
        """The ops that made the host wait (``Tensor.item``), as the user wrote them."""
        entry = self._entry("on_dut", "compiles_whole") or {}
        ops = [
            event["gb_type"] for event in entry.get("breaks", ()) if event["kind"] == "host_sync"
        ]
        return sorted(set(ops))

    @property
    def asic(self) -> Mapping[str, int] | None:
        entry = self._entry(*self._FIGURE_CHECKS)
        return None if entry is None else entry.get("asic")

    @property
    def dut_share(self) -> float | None:
        asic = self.asic
        if not asic or "host_macs" not in asic:
            return None
        total = asic["macs"] + asic["host_macs"]
        return asic["macs"] / total if total else None

    @property
    def host_ops(self) -> list[str]:
        entry = self._entry("on_dut", "compiles_whole") or {}
        ops = [
            event["gb_type"].removeprefix(HOST_FALLBACK_PREFIX)
            for event in entry.get("breaks", ())
            if event["kind"] == "host_fallback"
        ]
        return sorted(set(ops))

    @property
    def export_entry(self) -> Mapping[str, Any] | None:
        """The ``exports`` check's entry, when it ran."""
        return self._entry("exports")

    @property
    def export_finished(self) -> bool:
        return self.export_entry is not None and self.finished_checks.get("exports", True)

    @property
    def export_problems(self) -> list[str]:
        """The exported programs' problems, one label each (:func:`_export_problem`)."""
        return list(dict.fromkeys(label for _, label in self._export_problems))

    @property
    def export_classes(self) -> set[str]:
        """The classes of :attr:`export_problems`, for the breakdown."""
        return {cls for cls, _ in self._export_problems}

    @property
    def _export_problems(self) -> list[tuple[str, str]]:
        entry = self.export_entry or {}
        return [_export_problem(e) for e in entry.get("breaks", ()) if e["kind"] in EXPORT_KINDS]

    @property
    def exported_modes(self) -> tuple[str, ...]:
        """The modes that produced a program: those no ``export_error`` names."""
        entry = self.export_entry or {}
        failed = {
            mode
            for event in entry.get("breaks", ())
            if event["kind"] == "export_error"
            for mode in _modes(event)
        }
        return tuple(mode for mode in MODES if mode not in failed)

    @property
    def exports(self) -> bool:
        """The ``exports`` check passed: both modes exported a sound program that keeps the
        varied dimensions dynamic (a range narrowed by the model is allowed), on the DUT
        within the int8 bound under the ASIC."""
        entry = self.entries.get("exports")
        return entry is not None and entry.get("outcome") == "passed"

    @property
    def export_dut_macs(self) -> tuple[int, int] | None:
        """``(DUT MACs, all MACs)`` of the lowered program's run, when it ran on the DUT."""
        asic = (self.export_entry or {}).get("asic")
        if not asic or "host_macs" not in asic:
            return None
        return int(asic["macs"]), int(asic["macs"]) + int(asic["host_macs"])

    @property
    def on_dut(self) -> bool:
        """The ``on_dut`` check passed: whole, every MAC on the DUT, within the int8 bound."""
        entry = self.entries.get("on_dut")
        return entry is not None and entry.get("outcome") == "passed"


def rows_of(report: Mapping[str, Any]) -> list[Row]:
    """The models of ``report`` (entries named ``nobreak-model[<spec>]::<check>``), by SPEC."""
    grouped: dict[str, dict[str, Mapping[str, Any]]] = collections.defaultdict(dict)
    notes: dict[str, dict[str, str]] = collections.defaultdict(dict)
    for nodeid, entry in report["tests"].items():
        match = _NODEID.match(nodeid)
        if match:
            try:  # the rows read the raw entries: each must be a well-formed test entry
                TestRecord.from_json(nodeid, entry)
            except ValueError as exc:
                raise ReportError("", f"holds a malformed entry: {exc}", "") from None
            grouped[match["spec"]][match["check"]] = entry
    finished: dict[str, dict[str, bool]] = collections.defaultdict(dict)
    unbuilt: set[str] = set()
    for nodeid, note in report.get(MODELS_KEY, {}).items():
        match = _NODEID.match(nodeid)
        if match:
            notes[match["spec"]][match["check"]] = note["reason"]
            finished[match["spec"]][match["check"]] = note["finished"]
            if note.get("built") is False:
                unbuilt.add(match["spec"])
    return [
        Row(spec, grouped[spec], notes[spec], finished[spec], spec in unbuilt)
        for spec in sorted(grouped)
    ]


def _strip_spec(note: str, spec: str) -> str:
    return note.removeprefix(f"{spec}: ").strip()


def _modes(event: Mapping[str, Any]) -> list[str]:
    """The export modes an event happened in, from its ``detail`` ("non-strict and strict")."""
    return [m for m in str(event.get("detail") or "").split(" and ") if m in MODES]


#: The breakdown's class of a dimension's problem, by the word its label starts with.
_DIM_CLASSES = {
    "narrowed": "dimension narrowed",
    "static": "dimension made static",
    "rejects sizes": "dimension kept dynamic but sizes in its range rejected",
}


def _export_problem(event: Mapping[str, Any]) -> tuple[str, str]:
    """A problem of an exported program as ``(class, label)``: the label is its cell (the gb
    id or exception of a failed mode, the finding, the dimension and whether it came out
    static, narrowed or rejecting sizes, the disagreement, the host sync's op, with the
    modes), the class the breakdown counts (the label without the dimension or op)."""
    kind, name = event["kind"], event.get("gb_type", "")
    modes = " and ".join(_modes(event))
    where = f" ({modes})" if modes else ""
    if kind == "export_error":
        label = f"{event.get('gb_id') or name}{where}"
        return label, label
    if kind == "specialized_dim":
        reason = event.get("reason", "")
        how = (
            "narrowed"
            if NARROWED_WORDS in reason
            else "rejects sizes"
            if REJECTED_WORDS in reason
            else "static"
        )
        return _DIM_CLASSES[how], f"{how}: {name}{where}"
    if kind == "export_sync":
        return "host sync", f"host sync: {name}{where}"
    return f"{name}{where}", f"{name}{where}"


def _reason_key(text: str) -> str:
    """The reason without its particulars, cut at a word under 80 characters."""
    key = _DETAIL.sub("…", text).strip()
    if len(key) <= 80:
        return key
    return key[:80].rsplit(" ", 1)[0].rstrip(":;,") + " …"


#: The breakdown's classes of "not built", by how the build's reason starts (the reasons
#: pytest_nobreak.models.build and .hf give), in the order the breakdown lists them.
_UNBUILT_CLASSES = (
    ("eager forward failed", "fail their eager forward on the inferred inputs"),
    ("its config cannot be shrunk", "have a config whose validation refuses the shrunk sizes"),
    ("still ", "are over the parameter limit after shrinking"),
    ("cannot infer its main input", "take a main input that could not be inferred"),
)
_UNBUILT_OTHER = "cannot be constructed from the shrunk config, or imported"


def _unbuilt_class(reason: str) -> str:
    for start, name in _UNBUILT_CLASSES:
        if reason.startswith(start):
            return name
    return _UNBUILT_OTHER


def breakdown(rows: Sequence[Row]) -> list[tuple[int, str, list[tuple[int, str]]]]:
    """Why the models that are not whole and on the DUT are not, as ``(count, class,
    [(count, subclass), ...])``: not built (by cause), not finished (the time limit or a
    crash), not whole (breaks), and whole but not on the DUT (the int8 bound, a vanishing
    output, host ops or syncs). Every such model counts once, in one subclass."""
    classes: dict[str, collections.Counter[str]] = {
        "are not built": collections.Counter(),
        "do not finish": collections.Counter(),
        "do not compile whole": collections.Counter(),
        "compile whole but are not all on the DUT": collections.Counter(),
    }
    for row in rows:
        skipped = row.skipped
        if skipped is not None:
            classes["are not built"][_unbuilt_class(skipped)] += 1
        elif not row.finished:
            failure = row.failure or ""
            timeout = "took more than" in failure
            classes["do not finish"]["hit the time limit" if timeout else "crashed"] += 1
        elif not row.whole:
            kind = "break the graph" if row.break_ids else "fall back to eager"
            classes["do not compile whole"][kind] += 1
        elif not row.on_dut:
            failure = row.failure or ""
            if "vanishes" in failure:
                why = "have a random-weight output that vanishes to ~0"
            elif failure.startswith("the DUT output is off"):
                why = "are off fp32 by more than the int8 bound"
            elif row.host_ops:
                why = "leave ops on the host"
            elif row.sync_ops:
                why = "make host syncs"
            else:
                why = "fail on_dut otherwise"
            classes["compile whole but are not all on the DUT"][why] += 1
    return [
        (sum(counts.values()), name, [(n, sub) for sub, n in _ranked(counts)])
        for name, counts in classes.items()
        if counts
    ]


def _ranked(counts: collections.Counter[str], top: int | None = None) -> list[tuple[str, int]]:
    """Most common first, ties by name: ``Counter.most_common`` keeps insertion order for ties,
    which follows set iteration and so the hash seed, and the page must not change per run."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:top]


def _peak(device: str) -> int | None:
    try:
        return AsicConfig.load(device).peak_macs_per_cycle
    except (ValueError, OSError):
        return None


def render_zoo(report: Mapping[str, Any]) -> str:
    """The ``docs/zoo.md`` text of ``report``."""
    rows = rows_of(report)
    if not rows:
        raise ReportError("", "holds no --nobreak-model check", "")
    peak = _peak(str(report.get("device", "default")))
    built = [row for row in rows if row.skipped is None]
    whole = [row for row in built if row.whole]
    on_dut = [row for row in built if row.on_dut]
    rest: collections.Counter[str] = collections.Counter()
    for row in rows:
        if row.skipped is not None:
            rest["not built: " + _reason_key(row.skipped)] += 1
        elif not row.finished:
            rest["not finished: " + _reason_key(row.failure or "the check stopped")] += 1
        elif not row.whole:
            # Each break counts on its own: a model with three is three reasons to fix.
            types = row.break_types
            for name in row.break_ids or ["eager frames"]:
                kind = types.get(name)
                rest[f"break {name}" + (f" ({kind})" if kind and kind != name else "")] += 1
        elif not row.on_dut and row.failure:
            rest["not on the DUT: " + _reason_key(row.failure)] += 1
        elif not row.on_dut and row.host_ops:
            rest["host ops: " + ", ".join(row.host_ops)] += 1
        elif not row.on_dut and row.sync_ops:
            rest["host syncs: " + ", ".join(row.sync_ops)] += 1
    lines = [
        "# Model zoo",
        "",
        "<!-- Generated by `python -m pytest_nobreak zoo REPORT docs/zoo.md` from a `pytest",
        "     --nobreak-model ... --asic-backend --nobreak-json REPORT` run. Do not edit. -->",
        "",
        f"torch {report.get('torch')}, backend `{report.get('backend')}`, device "
        f"`{report.get('device')}`.",
        "",
        f"- architectures: **{len(rows)}**, built and run eagerly: **{len(built)}**",
        f"- compile whole (no graph break, no eager fallback): **{len(whole)}**",
        f"- whole and 100% on the DUT, within the int8 bound of fp32: **{len(on_dut)}**",
        *_export_summary(built),
        "",
        *family_table(rows, report.get(FAMILIES_KEY) or {}),
        "",
    ]
    classes = breakdown(rows)
    if classes:
        lines += [f"Of the {len(rows) - len(on_dut)} that are not whole and on the DUT:", ""]
        for count, name, subs in classes:
            parts = "; ".join(f"{n} {sub}" for n, sub in subs)
            lines.append(f"- {count} {name}: {parts}")
        lines.append("")
    if rest:
        lines += ["Most common reasons for the rest:", ""]
        lines += [f"- {count} × {reason}" for reason, count in _ranked(rest, 12)]
        lines.append("")
    lines += [
        "`graph`: whole, or the gb ids of the breaks and eager fallbacks, then why a check failed "
        "otherwise; `recompiles`: in `no_recompile` when it ran (2x16, 3x24, 5x12), else in the "
        "one call of the check; `syncs`: the host syncs of one call (`-`: not measured); cycles "
        "and utilization of one call; `exports`: `sound` when both modes exported a program "
        "that keeps batch and sequence dynamic (and, lowered, ran within the int8 bound; host "
        "ops left are `on_dut`'s), else its problems.",
        "",
        "| model | graph | recompiles | syncs | DUT share of MACs | host ops left | cycles "
        "| utilization | exports |",
        "|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for row in rows:
        lines.append(_line(row, peak))
    return "\n".join(lines) + "\n"


def _line(row: Row, peak: int | None) -> str:
    skipped = row.skipped
    if skipped is not None:
        return f"| {_code(row.spec)} | not built: {_cell(skipped)} | | | | | | | |"
    if not row.finished:
        graph = "not finished"
    elif row.whole:
        graph = "whole"
    else:
        graph = "breaks: " + ", ".join(row.break_ids or ["eager frames"])
    failure = row.failure
    if failure:
        graph += f"; {_cell(failure)}"
    share = row.dut_share
    asic = row.asic or {}
    cycles = asic.get("cycles")
    util = asic["macs"] / (cycles * peak) if cycles and peak and "macs" in asic else None
    cells = [
        _code(row.spec),
        graph,
        "" if row.recompiles is None else str(row.recompiles),
        _syncs_cell(row),
        "" if share is None else f"{share:.1%}",
        ", ".join(row.host_ops) or ("none" if asic else ""),
        "" if cycles is None else f"{cycles:,}",
        "" if util is None else f"{util:.2%}",
        _export_cell(row),
    ]
    return "| " + " | ".join(cells) + " |"


def _export_cell(row: Row) -> str:
    if row.export_entry is None:
        return ""
    problems = row.export_problems
    if not row.export_finished:
        return _cell("; ".join(["not finished", *problems]))
    if row.exports:
        return _cell("; ".join(["sound", *problems]))  # the allowed ones: narrowed ranges
    return _cell("; ".join(problems) or "failed")


def _export_summary(built: Sequence[Row]) -> list[str]:
    """The export pass rates over the built models whose ``exports`` check ran, the DUT share
    of the lowered programs and the most common problems; nothing when none ran."""
    checked = [row for row in built if row.export_entry is not None]
    if not checked:
        return []
    sound = sum(row.exports for row in checked)
    finished = [row for row in checked if row.export_finished]
    per_mode = ", ".join(
        f"{mode}: **{sum(mode in row.exported_modes for row in finished)}**" for mode in MODES
    )
    lines = [
        f"- `torch.export` checked: **{len(checked)}**, sound in both modes (batch and "
        f"sequence kept dynamic): **{sound}**; a program exported ({per_mode})",
    ]
    lowered = [macs for row in checked if (macs := row.export_dut_macs) is not None]
    if lowered:
        dut, total = sum(m for m, _ in lowered), sum(t for _, t in lowered)
        whole = sum(m == t for m, t in lowered)
        share = f"{dut / total:.1%}" if total else "-"
        lines.append(
            f"- exported programs lowered and run on the DUT: **{len(lowered)}**, all MACs on "
            f"the DUT: **{whole}** ({share} of their MACs)"
        )
    kinds = collections.Counter(kind for row in checked for kind in row.export_classes)
    if kinds:
        lines += ["", "Most common export problems (models with each):", ""]
        lines += [f"- {count} × {kind}" for kind, count in _ranked(kinds, 8)]
    return lines


def _syncs_cell(row: Row) -> str:
    """Empty without a check that measured one call; ``-`` when that check's report is from
    before host syncs were counted (not measured is not 0)."""
    if not row.measured:
        return ""
    syncs = row.host_syncs
    return "-" if syncs is None else str(syncs)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:160]


def _code(text: str) -> str:
    """``text`` as inline code in a table cell (a backtick or a pipe cannot end it early)."""
    return "`" + text.replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_nobreak zoo REPORT OUTPUT``"""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_nobreak zoo",
        description="Write the model-zoo table (docs/zoo.md) from a --nobreak-json report of a "
        "--nobreak-model run.",
    )
    parser.add_argument("report", help="the --nobreak-json report")
    parser.add_argument("output", help="the Markdown file to write")
    args = parser.parse_args(argv)
    if os.path.realpath(args.report) == os.path.realpath(args.output):
        print(f"error: {args.output} is the report itself; write the table to another file",
              file=sys.stderr)  # fmt: skip
        return 1
    try:
        text = render_zoo(read_input(args.report))
        write_atomic(args.output, text)
    except ReportError as exc:
        print(f"error: {args.report} {exc.problem}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(
            f"error: cannot write {os.fspath(args.output)}: {exc.strerror or exc}", file=sys.stderr
        )
        return 1
    models = text.count("\n| `")
    print(f"zoo of {models} models written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
