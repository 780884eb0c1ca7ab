"""``python -m pytest_nobreak merge``: a run split into shards, merged, gives the report and the
baseline bytes of the same run unsharded; conflicting shards are refused.

The shards are two complementary ``-k`` selections (an expression and its negation), so every
merge test runs with pytest alone; :func:`test_pytest_split_groups_merge_to_the_whole_run` runs
the suite in the two ``--splits 2 --group`` groups of pytest-split, as docs/ci.md's workflow
does. pytest-split is in the ``test`` extra: without it that one test skips, and a CI run fails
on the skip (tests/conftest.py, ``ALLOWED_CI_SKIPS``)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests import zygote

SUITE = """
import pytest
import torch


def branchy(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


@pytest.mark.no_graph_break
@pytest.mark.parametrize("n", [1, 2, 3])
def test_clean(n):
    torch.compile(lambda x: x * n, backend="eager")(torch.ones(2))


@pytest.mark.no_graph_break
def test_breaks():
    torch.compile(branchy, backend="eager")(torch.ones(2))


@pytest.mark.no_graph_break
def test_syncs():
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        f = torch.compile(lambda x: x * x.sum().item(), backend="eager")
        f(torch.ones(2))
        f(torch.ones(2))


@pytest.mark.no_graph_break
def test_stops_half_way():
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    raise RuntimeError("stopped before the end")
"""
#: A baseline entry of a test this suite does not have: every update must keep it (as it is:
#: recorded before host syncs were counted, it has no ``host_syncs``).
ELSEWHERE = {
    "other.py::test_kept": {"graphs": 1, "graph_breaks": 0, "eager_frames": 0, "recompiles": 0}
}


#: The two shards of the suite: a ``-k`` expression and its negation select every test exactly
#: once between them, whatever the expression matches.
SELECTED = "clean or syncs"
SHARDS = {"1": SELECTED, "2": f"not ({SELECTED})"}


def pytest_run(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "no:xdist", "-q", *args],
        cwd=path, timeout=600,
    )  # fmt: skip


def side_by_side(path: Path, *runs: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Independent inner runs, two at a time (each is mostly the start-up of torch)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda args: pytest_run(path, *args), runs))


def merge(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_nobreak", "merge", *args],
        cwd=path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite run whole (updating one copy of a baseline), in two ``-k`` shards and, with
    pytest-split installed, in its two groups (run here, beside the others, to save a round)."""
    path = tmp_path_factory.mktemp("shards")
    (path / "test_suite.py").write_text(SUITE)
    shard_runs = [
        ["-k", expression, "--nobreak-json", f"s{g}.json"] for g, expression in SHARDS.items()
    ]
    if importlib.util.find_spec("pytest_split") is not None:
        shard_runs += [
            ["--splits", "2", "--group", g, "--nobreak-json", f"g{g}.json"] for g in "12"
        ]
    first, *shards = side_by_side(
        path, ["--nobreak-baseline", "b0.json", "--nobreak-update-baseline"], *shard_runs
    )
    for shard in shards:
        assert shard.returncode in (0, 1), shard.stdout[-2000:]
    # A baseline recorded by this suite's own first run (so it has the real headers).
    assert (path / "b0.json").exists(), first.stdout[-2000:]
    start = json.loads((path / "b0.json").read_text())
    start["tests"].update(ELSEWHERE)
    for name in ("start.json", "whole.json", "sharded.json"):
        (path / name).write_text(json.dumps(start, indent=2, sort_keys=True) + "\n")
    whole = pytest_run(
        path, "--nobreak-json", "full.json", "--nobreak-html", "full.html",
        "--nobreak-baseline", "whole.json", "--nobreak-update-baseline",
    )  # fmt: skip
    assert whole.returncode == 1, whole.stdout[-2000:]  # two tests fail; the update is written
    return path


def test_the_shards_hold_the_suite_between_them(runs: Path) -> None:
    shards = [json.loads((runs / f"s{g}.json").read_text())["tests"] for g in SHARDS]
    assert sorted(shards[0]) == [
        "test_suite.py::test_clean[1]",
        "test_suite.py::test_clean[2]",
        "test_suite.py::test_clean[3]",
        "test_suite.py::test_syncs",
    ]
    assert not set(shards[0]) & set(shards[1])
    whole = json.loads((runs / "full.json").read_text())["tests"]
    assert set(shards[0]) | set(shards[1]) == set(whole)


def test_pytest_split_groups_merge_to_the_whole_run(runs: Path) -> None:
    """docs/ci.md's sharded workflow as written: pytest-split's groups (``runs`` ran them),
    merged."""
    pytest.importorskip("pytest_split", reason="pytest-split is in the test extra")
    shards = [json.loads((runs / f"g{g}.json").read_text())["tests"] for g in "12"]
    assert all(shards)
    assert not set(shards[0]) & set(shards[1])
    (runs / "split.json").write_bytes((runs / "start.json").read_bytes())
    done = merge(runs, "split-all.json", "g1.json", "g2.json", "--update-baseline", "split.json")
    assert done.returncode == 0, done.stderr
    assert json.loads((runs / "split-all.json").read_text()) == json.loads(
        (runs / "full.json").read_text()
    )
    assert (runs / "split.json").read_bytes() == (runs / "whole.json").read_bytes()


def test_merge_gives_the_unsharded_report_and_baseline_bytes(runs: Path) -> None:
    done = merge(
        runs, "all.json", "s1.json", "s2.json", "--update-baseline", "sharded.json",
        "--html", "all.html",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "merged 2 shard reports (6 tests) into all.json",
        "HTML report written to all.html",
        "baseline sharded.json updated with 5 tests",
    ]
    # The page the unsharded run drew, compared with the baseline as it was before the update
    # (a copy of it, under another name).
    page = (runs / "all.html").read_text().replace("sharded.json", "whole.json")
    assert page == (runs / "full.html").read_text()
    assert "test_suite.py::test_breaks" in page
    merged, whole = (json.loads((runs / n).read_text()) for n in ("all.json", "full.json"))
    assert merged == whole
    # The test that raised half-way is in the report, marked incomplete, and not in a baseline.
    stopped = "test_suite.py::test_stops_half_way"
    assert whole["tests"][stopped]["complete"] is False
    assert (runs / "sharded.json").read_bytes() == (runs / "whole.json").read_bytes()
    baseline = json.loads((runs / "sharded.json").read_text())["tests"]
    assert stopped not in baseline
    assert baseline["other.py::test_kept"] == ELSEWHERE["other.py::test_kept"]
    assert baseline["test_suite.py::test_breaks"]["graph_breaks"] == 1
    assert baseline["test_suite.py::test_syncs"]["host_syncs"] == 2
    assert baseline["test_suite.py::test_breaks"]["host_syncs"] == 0


def test_a_shard_uploaded_twice_is_no_conflict(runs: Path) -> None:
    done = merge(runs, "twice.json", "s1.json", "s2.json", "s1.json")
    assert done.returncode == 0, done.stderr
    assert json.loads((runs / "twice.json").read_text()) == json.loads(
        (runs / "full.json").read_text()
    )


def test_shards_whose_trials_kept_different_kernels_name_both(runs: Path) -> None:
    """Each shard is its own processes, whose trials may keep different kernels for a shape:
    the merge names both there, whatever the order of the shards, and the page shows it."""
    for g, choices in {
        "1": {"1×8×8 1T gemm": "int16", "2×8×8 1T gemm": "int_mm"},
        "2": {"2×8×8 1T gemm": "int16", "3×8×8 1T linear": "int16 or int_mm (by worker)"},
    }.items():
        shard = json.loads((runs / f"s{g}.json").read_text())
        (runs / f"timed{g}.json").write_text(json.dumps(shard | {"host_gemm_choices": choices}))
    expected = {
        "1×8×8 1T gemm": "int16",
        "2×8×8 1T gemm": "int16 or int_mm (by shard)",
        "3×8×8 1T linear": "int16 or int_mm (by worker)",
    }
    for order in (["timed1.json", "timed2.json"], ["timed2.json", "timed1.json"]):
        done = merge(runs, "timed.json", *order, "--html", "timed.html")
        assert done.returncode == 0, done.stderr
        assert json.loads((runs / "timed.json").read_text())["host_gemm_choices"] == expected
        assert (
            "1×8×8 1T gemm int16; 2×8×8 1T gemm int16 or int_mm (by shard); 3×8×8 1T linear"
            in (runs / "timed.html").read_text()
        )


def test_shards_of_hosts_that_computed_otherwise_merge_and_name_each_way(runs: Path) -> None:
    """The host kernel is a run's speed, not its figures: shards of two kinds of host merge,
    and the header names each shard's, in the order of the shards (one uploaded twice once;
    one that names none, as none)."""
    shard = json.loads((runs / "s1.json").read_text())
    shard.pop("host_gemm", None)
    (runs / "way0.json").write_text(json.dumps(shard | {"host_passes": "native"}))
    kernels = {"1": "int_mm (auto: an int8 unit)", "2": "int16 (auto: no int8 unit)"}
    for g, kernel in kernels.items():
        shard = json.loads((runs / f"s{g}.json").read_text())
        way = {"host_gemm": kernel, "host_passes": "native"}
        (runs / f"way{g}.json").write_text(json.dumps(shard | way))
    done = merge(runs, "ways.json", "way1.json", "way2.json", "way1.json", "--html", "ways.html")
    assert done.returncode == 0, done.stderr
    merged = json.loads((runs / "ways.json").read_text())
    assert merged["host_gemm"] == (
        "by shard: way1.json: int_mm (auto: an int8 unit) | way2.json: int16 (auto: no int8 unit)"
    )
    assert merged["host_passes"] == "native"
    assert merged["host_gemm"] in (runs / "ways.html").read_text()
    done = merge(runs, "ways.json", "way0.json", "way2.json")
    assert done.returncode == 0, done.stderr
    merged = json.loads((runs / "ways.json").read_text())
    assert merged["host_gemm"] == (
        "by shard: way0.json: (none) | way2.json: int16 (auto: no int8 unit)"
    )


def test_a_shard_whose_host_kernel_is_not_a_string_is_named(runs: Path) -> None:
    shard = json.loads((runs / "s2.json").read_text())
    (runs / "odd.json").write_text(json.dumps(shard | {"host_gemm": None}))
    done = merge(runs, "bad.json", "s1.json", "odd.json")
    assert done.returncode == 1
    assert done.stderr.strip() == 'error: odd.json "host_gemm" must be a string, not None'
    assert not (runs / "bad.json").exists()


def test_conflicting_shards_are_refused_and_nothing_is_written(runs: Path) -> None:
    shard = json.loads((runs / "s1.json").read_text())
    nodeid = next(iter(shard["tests"]))
    shard["tests"][nodeid]["graphs"] += 1
    (runs / "other_run.json").write_text(json.dumps(shard))
    done = merge(runs, "bad.json", "s1.json", "other_run.json", "--update-baseline", "b.json")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"error: {nodeid} is in s1.json and in other_run.json with different figures: shards of "
        "one run hold disjoint tests (were two runs mixed?)"
    ]
    assert not (runs / "bad.json").exists()
    assert not (runs / "b.json").exists()


def test_shards_of_another_torch_are_refused(runs: Path) -> None:
    shard = json.loads((runs / "s2.json").read_text())
    torch = shard["torch"]
    shard["torch"] = "2.99.0"
    (runs / "newer.json").write_text(json.dumps(shard))
    done = merge(runs, "bad.json", "s1.json", "newer.json")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"error: newer.json is from torch '2.99.0' but s1.json from torch {torch!r}: merge the "
        "shards of one run only"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "error: missing.json does not exist"),
        ("{", "error: missing.json is not valid JSON: Expecting property name enclosed in double"),
        ('{"version": 7}', "error: missing.json is not a version 1 pytest-nobreak report"),
    ],
)
def test_a_bad_shard_is_named(runs: Path, content: str | None, message: str) -> None:
    target = runs / "missing.json"
    if content is None:
        target.unlink(missing_ok=True)
    else:
        target.write_text(content)
    done = merge(runs, "bad.json", "s1.json", "missing.json")
    assert done.returncode == 1
    assert done.stderr.startswith(message)
    assert not (runs / "bad.json").exists()


def test_shards_without_tests_leave_the_baseline_alone(runs: Path) -> None:
    empty = json.loads((runs / "s1.json").read_text()) | {"tests": {}}
    (runs / "empty.json").write_text(json.dumps(empty))
    (runs / "kept.json").write_text("untouched")
    done = merge(runs, "none.json", "empty.json", "--update-baseline", "kept.json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "no test in the shards; baseline kept.json was not written"
    )
    assert (runs / "kept.json").read_text() == "untouched"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--html", "notes.txt"], "error: HTML report notes.txt: exists and is not a pytest-*"),
        (["--html", "out.json"], "error: out.json is given as --html and as the merged report*"),
        (["--html", "s1.json"], "error: s1.json is given as --html and as the shard report s1*"),
        (["--html", "adir"], "error: HTML report adir: is a directory; pass the path of a file"),
        (["--baseline", "b.json"], "error: --baseline only sets what the HTML report compares *"),
        (
            ["--update-baseline", "s2.json"],
            "error: s2.json is given as --update-baseline and as the shard report s2.json*",
        ),
    ],
    ids=["not-a-page", "the-report", "a-shard", "a-directory", "baseline-alone", "baseline-shard"],
)
def test_paths_that_would_clobber_a_file_are_refused_before_anything_is_written(
    runs: Path, args: list[str], message: str
) -> None:
    import fnmatch

    (runs / "notes.txt").write_text("my notes")
    (runs / "adir").mkdir(exist_ok=True)
    before = {name: (runs / name).read_bytes() for name in ("s1.json", "s2.json", "notes.txt")}
    done = merge(runs, "out.json", "s1.json", "s2.json", "--update-baseline", "nb.json", *args)
    assert done.returncode == 1
    assert fnmatch.fnmatch(done.stderr.strip(), message), done.stderr
    assert not (runs / "out.json").exists()
    assert not (runs / "nb.json").exists()
    for name, content in before.items():
        assert (runs / name).read_bytes() == content
