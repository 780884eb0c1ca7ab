"""Overhead of watching: a suite of small compile tests, ``--nobreak-all`` vs ``-p no:nobreak``.

Run: ``pytest benchmarks/test_plugin_overhead.py --benchmark-only``. Both modes run the same
generated suite in a fresh pytest subprocess (what a user's CI pays, torch import included);
compare the two rows' means. Target: watched <= 1.10x unwatched.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

N_TESTS = 24

# One small model per test, as in a real suite: each test compiles its own code. (A suite that
# compiles the *same* function in many tests pays a recompile per test when watched: that is
# the price of isolation, since a graph cached by an earlier test would hide this test's breaks.)
TEST = """
W{i} = torch.randn(8, 8)


def test_model_{i}():
    def forward(x):
        return torch.relu(x @ W{i}) * {i} + x.sum(-1, keepdim=True)

    fn = torch.compile(forward, backend="{backend}")
    for batch in (2, 3):
        fn(torch.randn(batch, 8))
"""


def suite_source(n: int) -> str:
    tests = (TEST.format(i=i, backend="eager" if i % 2 else "aot_eager") for i in range(n))
    return "import torch\n" + "".join(tests)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("overhead")
    (root / "test_suite.py").write_text(suite_source(N_TESTS))
    (root / "pytest.ini").write_text("[pytest]\n")
    return root


def run_suite(root: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark"]
    proc = subprocess.run([*cmd, *args], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]


MODES = [
    pytest.param(("-p", "no:nobreak"), id="unwatched"),
    pytest.param(("--nobreak-all",), id="nobreak-all"),
]


@pytest.mark.benchmark(group="plugin-overhead")
@pytest.mark.parametrize("mode", MODES)
def test_suite_wall_time(benchmark, suite: Path, mode: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    # A plain (benchmark-disabled) run checks that the suite runs in both modes: two of its tests.
    smoke = ("-k", "test_model_0 or test_model_1") if benchmark.disabled else ()
    benchmark.pedantic(run_suite, args=(suite, *mode, *smoke), rounds=5, warmup_rounds=1)


# Counting what runs: every compiled graph is called through a wrapper that counts each call
# (the graphs a test ran, the breaks it crossed, a graph's host syncs), whenever it was
# compiled. Per call, in a fresh process per mode (once the taps are installed they stay, so
# "off" must be a process where the plugin never watched): a graph with one `int()` read, and
# a clean one.
PER_CALL = """
import sys, time, torch
torch._dynamo.config.capture_scalar_outputs = True
mode, graph, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])

def sync(h):
    return h * int(h.sum())

def clean(h):
    return h * h.sum()

def per_call():
    fn = torch.compile(sync if graph == "sync" else clean, backend="eager")
    x = torch.randn(8)
    fn(x)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn(x)
        best = min(best, (time.perf_counter() - start) / calls)
    return best

if mode == "watched":
    import pytest_nobreak
    with pytest_nobreak.watch() as report:
        seconds = per_call()
    print(report.host_syncs, seconds)
else:
    print(-1, per_call())
"""


def time_per_call(mode: str, graph: str, calls: int) -> float:
    """Seconds per call, the best of 5 rounds of ``calls`` calls, in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-c", PER_CALL, mode, graph, str(calls)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    syncs, seconds = proc.stdout.split()[-2:]
    if mode == "watched":  # what is timed is the counting: every call of the graph counted
        assert int(syncs) == (1 + 5 * calls if graph == "sync" else 0)
    return float(seconds)


@pytest.mark.benchmark(group="host-sync-counting")
@pytest.mark.parametrize("graph", ["sync", "clean"])
def test_host_sync_counting_per_call(benchmark, graph: str) -> None:  # type: ignore[no-untyped-def]
    """``extra_info``: seconds per call unwatched and watched, and their ratio, measured in
    alternating processes (the process start is what the benchmark's own timing shows)."""
    times: dict[str, list[float]] = {"unwatched": [], "watched": []}

    calls = 50 if benchmark.disabled else 5000  # a plain run checks the counting, not its cost

    def both() -> None:
        for mode in times:
            times[mode].append(time_per_call(mode, graph, calls))

    benchmark.pedantic(both, rounds=2, warmup_rounds=0)
    unwatched, watched = min(times["unwatched"]), min(times["watched"])
    benchmark.extra_info.update(
        unwatched_s=unwatched, watched_s=watched, watched_over_unwatched=watched / unwatched
    )
