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
    benchmark.pedantic(run_suite, args=(suite, *mode), rounds=5, warmup_rounds=1)
