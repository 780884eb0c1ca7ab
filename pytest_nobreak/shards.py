"""A sharded run as one: merge the shards' ``--nobreak-json`` reports, and write the baseline
one unsharded ``--nobreak-update-baseline`` run would have written, byte for byte.

A suite split across CI jobs (a GitHub Actions matrix with pytest-split's ``--splits N
--group I``) gives one report per job. The last job combines them::

    python -m pytest_nobreak merge all.json shard-*.json
    python -m pytest_nobreak merge all.json shard-*.json --update-baseline nobreak-baseline.json

Shards of one run hold disjoint tests, so a test in two shards is a conflict unless both
entries are the same (a shard uploaded twice), and reports of different configurations (torch
release, simulator version, backend, device) are refused: their figures are not comparable.
Every problem is one line naming the files, and nothing is written then.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_nobreak.atomic import write_atomic
from pytest_nobreak.baseline import BaselineError, dump_baseline, load_baseline, updated
from pytest_nobreak.json_report import (
    CONFIGURATION,
    ReportError,
    TestRecord,
    describe,
    dump_report,
    read_input,
)

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
    assert merged is not None
    return merged


def baseline_of(report: Mapping[str, Any], baseline_path: str | os.PathLike[str]) -> str:
    """The text of the baseline at ``baseline_path`` updated with ``report``'s tests, as one
    ``--nobreak-update-baseline`` run of the whole suite writes it: the tests that ran to the
    end replace their entries, every other entry is kept."""
    try:
        baseline = load_baseline(baseline_path)
    except BaselineError as exc:
        raise MergeError(str(exc)) from None
    results = {}
    for nodeid, entry in report["tests"].items():
        if entry.get("complete", True):
            try:
                results[nodeid] = TestRecord.from_json(nodeid, entry).figures
            except ValueError as exc:
                raise MergeError(f"the merged report: {exc}") from None
    return dump_baseline(updated(baseline, results, report["torch"], report.get("asic_sim")))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pytest_nobreak merge OUTPUT SHARD... [--update-baseline PATH]``"""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_nobreak",
        description="Combine the results of a sharded pytest-nobreak run.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
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
    args = parser.parse_args(argv)
    try:
        report = merge_shards(args.shards)
        baseline = None
        # No test ran: an unsharded update writes nothing either (the header would change).
        if args.update_baseline is not None and report["tests"]:
            baseline = baseline_of(report, args.update_baseline)
        # Both are made before either is written; the baseline first, so a failed write never
        # leaves a new report beside an old baseline.
        if baseline is not None:
            write_atomic(args.update_baseline, baseline)
        write_atomic(args.output, dump_report(report))
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
    if baseline is not None:
        kept = sum(1 for e in report["tests"].values() if e.get("complete", True))
        print(f"baseline {Path(args.update_baseline)} updated with {kept} tests")
    elif args.update_baseline is not None:
        print(f"no test in the shards; baseline {Path(args.update_baseline)} was not written")
    return 0
