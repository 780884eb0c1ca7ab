"""A sharded run as one: merge the shards' ``--nobreak-json`` reports, and write the baseline
one unsharded ``--nobreak-update-baseline`` run would have written, byte for byte.

A suite split across CI jobs (a GitHub Actions matrix with pytest-split's ``--splits N
--group I``) gives one report per job. The last job combines them::

    python -m pytest_nobreak merge all.json shard-*.json
    python -m pytest_nobreak merge all.json shard-*.json --update-baseline nobreak-baseline.json
    python -m pytest_nobreak merge all.json shard-*.json --html report.html

The page is the one ``--nobreak-html`` draws for the whole run (the same bytes, for the same
tests and baseline).

Shards of one run hold disjoint tests, so a test in two shards is a conflict unless both
entries are the same (a shard uploaded twice), and reports of different configurations (torch
release, simulator version, backend, device) are refused: their figures are not comparable.
Every problem is one line naming the files, and nothing is written then. Shards may have run on
hosts that computed otherwise (same figures, another speed): where their host GEMM kernels or
host passes differ, the merged header names each shard's (``by shard: s1.json: int_mm (…) |
s2.json: int16 (…)``), and the kernels the shards' trials kept unite shape by shape, naming
every kernel where shards differed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_nobreak.gate.atomic import write_atomic
from pytest_nobreak.gate.baseline import (
    Baseline,
    BaselineError,
    compare,
    dump_baseline,
    load_baseline,
    updated,
)
from pytest_nobreak.report.html_report import HtmlReportError, check_html_path, render_html
from pytest_nobreak.report.json_report import (
    CHOICES_KEY,
    CONFIGURATION,
    HOST_FIELDS,
    ReportError,
    TestRecord,
    describe,
    dump_report,
    merge_sections,
    read_input,
)
from pytest_nobreak.report.kernel_choices import across_shards
from pytest_nobreak.watch.events import Figures

__all__ = ["MergeError", "baseline_of", "main", "merge_shards"]


class MergeError(Exception):
    """The shard reports cannot be merged. ``str()`` is one line."""


def merge_shards(paths: Sequence[str | os.PathLike[str]]) -> dict[str, Any]:
    """The report of the whole run, from its shards' reports (see the module docstring)."""
    if not paths:
        raise MergeError("no shard reports given")
    merged: dict[str, Any] | None = None
    first_path = ""
    owner: dict[str, str] = {}  # nodeid -> the shard it came from
    choices: list[dict[str, str]] = []  # each shard's host_gemm_choices
    hosts: dict[str, list[tuple[str, Any]]] = {field: [] for field in HOST_FIELDS}
    for path in paths:
        shown = os.fspath(path)
        try:
            document = read_input(path)
        except ReportError as exc:
            raise MergeError(f"{shown} {exc.problem}") from None
        if merged is None:
            merged, first_path = {**document, "tests": {}}, shown
        differ = [key for key in CONFIGURATION if document.get(key) != merged.get(key)]
        if differ:
            raise MergeError(
                f"{shown} is from {describe(document, differ)} but {first_path} from "
                f"{describe(merged, differ)}: merge the shards of one run only"
            )
        for nodeid, entry in document["tests"].items():
            known = merged["tests"].get(nodeid)
            if known is not None and known != entry:
                raise MergeError(
                    f"{nodeid} is in {owner[nodeid]} and in {shown} with different figures: "
                    "shards of one run hold disjoint tests (were two runs mixed?)"
                )
            merged["tests"][nodeid] = entry
            owner.setdefault(nodeid, shown)
        merged.update(merge_sections(merged, document))
        choices.append(document.get(CHOICES_KEY) or {})
        for field, seen in hosts.items():
            if (shown, document.get(field)) not in seen:  # not a shard uploaded twice
                seen.append((shown, document.get(field)))
    assert merged is not None
    # Each shard is its own processes, maybe on another machine: the host kernels and the
    # choices of one must not hide another's.
    if any(choices):
        merged[CHOICES_KEY] = across_shards(choices)
    for field, seen in hosts.items():
        if len({value for _, value in seen}) > 1:
            merged[field] = "by shard: " + " | ".join(
                f"{shard}: {'(none)' if value is None else value}" for shard, value in seen
            )
    return merged


def _baseline(path: str | os.PathLike[str]) -> Baseline | None:
    try:
        return load_baseline(path)
    except BaselineError as exc:
        raise MergeError(str(exc)) from None


def _complete_figures(report: Mapping[str, Any]) -> dict[str, Figures]:
    """The figures of the merged report's tests that ran to their end (a baseline's and a
    comparison's input, as in an unsharded run)."""
    try:
        return {
            nodeid: TestRecord.from_json(nodeid, entry).figures
            for nodeid, entry in report["tests"].items()
            if entry.get("complete", True)
        }
    except ValueError as exc:
        raise MergeError(f"the merged report: {exc}") from None


def baseline_of(report: Mapping[str, Any], baseline_path: str | os.PathLike[str]) -> str:
    """The text of the baseline at ``baseline_path`` updated with ``report``'s tests, as one
    ``--nobreak-update-baseline`` run of the whole suite writes it: the tests that ran to the
    end replace their entries, every other entry is kept."""
    baseline = _baseline(baseline_path)
    results = _complete_figures(report)
    return dump_baseline(updated(baseline, results, report["torch"], report.get("asic_sim")))


def html_of(report: Mapping[str, Any], baseline_path: str | os.PathLike[str] | None) -> str:
    """The HTML page of the merged report, its tests compared with the baseline at
    ``baseline_path`` if given (a missing file: every test is new), as the unsharded run's
    ``--nobreak-html`` page shows them."""

    comparison = None
    if baseline_path is not None:
        comparison = compare(
            _baseline(baseline_path),
            _complete_figures(report),
            strict=False,
            torch=report["torch"],
            asic_sim=report.get("asic_sim"),
        )
    try:
        return render_html(
            report,
            comparison=comparison,
            baseline=os.fspath(baseline_path) if baseline_path is not None else None,
        )
    except ValueError as exc:
        raise MergeError(f"the merged report: {exc}") from None


def _check_paths(args: argparse.Namespace) -> None:
    """Refuse, before anything is read or written, a file given for two roles (the page written
    over the merged report or a shard, the baseline over a report), an HTML path that is not
    one of our pages, and ``--baseline`` without ``--html``."""
    if args.baseline is not None and args.html is None:
        raise MergeError("--baseline only sets what the HTML report compares with; add --html PATH")
    written = {
        "the merged report": args.output,
        "--html": args.html,
        "--update-baseline": args.update_baseline,
    }
    seen: dict[str, str] = {
        os.path.realpath(shard): f"the shard report {shard}" for shard in args.shards
    }
    if args.baseline is not None:
        seen.setdefault(os.path.realpath(args.baseline), "--baseline")
    for role, path in written.items():
        if path is None:
            continue
        real = os.path.realpath(path)
        other = seen.get(real)
        # Allowed: the merged report over a shard (merge in place), and updating the baseline
        # the page is compared with (the default); nothing else may share a path.
        allowed = (role == "the merged report" and str(other).startswith("the shard")) or (
            role == "--update-baseline" and other == "--baseline"
        )
        if other is not None and not allowed:
            raise MergeError(f"{path} is given as {role} and as {other}: pass another path")
        seen[real] = role
    if args.html is not None:
        try:
            check_html_path(args.html)
        except HtmlReportError as exc:
            raise MergeError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_nobreak merge OUTPUT SHARD... [--update-baseline PATH] [--html PATH]``"""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_nobreak",
        description="Combine the results of a sharded pytest-nobreak run.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("zoo", help="write the model-zoo table from a --nobreak-model report")
    merge = commands.add_parser(
        "merge",
        help="merge the --nobreak-json reports of a run's shards into one",
        description="Merge the --nobreak-json reports of one run's shards into one report; "
        "optionally update a baseline exactly as one unsharded --nobreak-update-baseline run "
        "would.",
    )
    merge.add_argument("output", help="the merged report to write")
    merge.add_argument("shards", nargs="+", help="the shards' reports")
    merge.add_argument(
        "--update-baseline",
        metavar="PATH",
        help="the baseline file to update with the merged tests (created if missing)",
    )
    merge.add_argument(
        "--html",
        metavar="PATH",
        help="also write the run's HTML report (as --nobreak-html draws it) to PATH",
    )
    merge.add_argument(
        "--baseline",
        metavar="PATH",
        help="compare the HTML report's tests with this baseline (default: the one "
        "--update-baseline updates, as it was before)",
    )
    args = parser.parse_args(argv)
    try:
        _check_paths(args)
        report = merge_shards(args.shards)
        baseline = None
        # No test ran: an unsharded update writes nothing either (the header would change).
        if args.update_baseline is not None and report["tests"]:
            baseline = baseline_of(report, args.update_baseline)
        page = None
        if args.html is not None:
            page = html_of(report, args.baseline or args.update_baseline)
        # All are made before any is written; the baseline first, so a failed write never
        # leaves a new report beside an old baseline.
        if baseline is not None:
            write_atomic(args.update_baseline, baseline)
        write_atomic(args.output, dump_report(report))
        if page is not None:
            write_atomic(args.html, page)
    except MergeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(
            f"error: cannot write {exc.filename or args.output}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    tests = len(report["tests"])
    print(f"merged {len(args.shards)} shard reports ({tests} tests) into {args.output}")
    if page is not None:
        print(f"HTML report written to {args.html}")
    if baseline is not None:
        kept = sum(1 for e in report["tests"].values() if e.get("complete", True))
        print(f"baseline {Path(args.update_baseline)} updated with {kept} tests")
    elif args.update_baseline is not None:
        print(f"no test in the shards; baseline {Path(args.update_baseline)} was not written")
    return 0
