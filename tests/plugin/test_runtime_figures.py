"""A test's figures count what it ran, not what it happened to compile first: the same suite
run serially, in reverse and under xdist (two ways) writes byte-identical baselines.

The suite is the shape of a real one: compiled models shared by several tests, a function
compiled and warmed up at import, a ``setUpClass`` warm-up, a frame Dynamo gives up on, a
break in a shared model, a host sync, marked tests among observed ones. Before runtime
counting, the second test to call a shared model reported ``graphs=0, graph_breaks=0``.
"""

from __future__ import annotations

import json

import pytest

SHARED = """
import torch


class Split(torch.nn.Module):  # one break: two graphs
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.a(x)
        print("between")  # BREAK
        return self.b(x)


def given_up(x):
    torch._dynamo.skip_frame()  # Dynamo runs this frame eagerly
    return x + 1


def reads(x):
    return x.new_zeros(int(x.sum().item()))  # a host sync: a data-dependent size


torch.manual_seed(0)
SPLIT = torch.compile(Split(), backend="eager")
GIVEN_UP = torch.compile(given_up, backend="eager")
torch._dynamo.config.capture_scalar_outputs = True
READS = torch.compile(reads, backend="aot_eager")
WARM = torch.compile(lambda x: x.cos() + 1, backend="eager")
WARM(torch.ones(2))  # compiled at import
"""

CONFTEST = """
import os


def pytest_collection_modifyitems(items):
    if os.environ.get("NB_REVERSE"):
        items.reverse()
"""

TEST_MODELS = """
import pytest
import torch

from shared import GIVEN_UP, READS, SPLIT, WARM


def test_split_first():
    SPLIT(torch.randn(2, 4))


def test_split_twice():
    SPLIT(torch.randn(2, 4))
    SPLIT(torch.randn(2, 4))


def test_split_other_shape():
    SPLIT(torch.randn(3, 4))


def test_given_up():
    GIVEN_UP(torch.ones(2))


def test_reads():
    READS(torch.ones(3))


def test_warm():
    WARM(torch.ones(2))


@pytest.mark.no_graph_break(allow=["print"])
def test_marked_split():
    SPLIT(torch.randn(2, 4))
"""

TEST_CLASS = """
import unittest

import torch

from shared import SPLIT


class TestWarm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        SPLIT(torch.randn(2, 4))  # for all the class's tests: counted in none

    def test_a(self):
        SPLIT(torch.randn(2, 4))

    def test_b(self):
        torch.ones(2) + 1  # runs nothing compiled
"""

#: name -> (pytest arguments, whether the conftest reverses the order)
ORDERS: dict[str, tuple[tuple[str, ...], bool]] = {
    "serial": ((), False),
    "reversed": ((), True),
    "xdist": (("-p", "xdist", "-n", "2"), False),
    "loadscope": (("-p", "xdist", "-n", "2", "--dist", "loadscope"), False),
}


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(
        shared=SHARED, conftest=CONFTEST, test_models=TEST_MODELS, test_class=TEST_CLASS
    )
    return pytester


def record(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str) -> str:
    """One fresh-process run recording a new baseline; its text."""
    args, reverse = ORDERS[name]
    monkeypatch.setenv("NB_REVERSE", "1" if reverse else "")
    path = pytester.path / f"{name}.json"
    result = pytester.runpytest_subprocess(
        "--nobreak-all",
        f"--nobreak-baseline={path}",
        "--nobreak-update-baseline",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        *args,
    )
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=9)
    return path.read_text()


def test_serial_reversed_and_xdist_runs_record_the_same_baseline(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = {name: record(suite, monkeypatch, name) for name in ORDERS}
    assert texts["reversed"] == texts["serial"]
    assert texts["xdist"] == texts["serial"]
    assert texts["loadscope"] == texts["serial"]

    # And the figures are what each test ran, whoever compiled it.
    tests = json.loads(texts["serial"])["tests"]

    def figures(name: str) -> tuple[int, int, int, int]:
        entry = tests[name]
        return entry["graphs"], entry["graph_breaks"], entry["eager_frames"], entry["host_syncs"]

    split = (2, 1, 0, 0)
    for name in ("test_split_first", "test_split_twice", "test_marked_split"):
        assert figures(f"test_models.py::{name}") == split, name
    # A new shape is a recompile (compile-time, of this test's or an earlier's code), but the
    # same two graphs and the same break.
    assert figures("test_models.py::test_split_other_shape") == split
    assert figures("test_models.py::test_given_up") == (0, 0, 1, 0)
    assert figures("test_models.py::test_reads") == (1, 0, 0, 1)
    assert figures("test_models.py::test_warm") == (1, 0, 0, 0)
    assert figures("test_class.py::TestWarm::test_a") == split
    assert figures("test_class.py::TestWarm::test_b") == (0, 0, 0, 0)


def test_a_test_reports_the_break_it_ran_through_after_another_compiled_it(
    suite: pytest.Pytester,
) -> None:
    """The issue's case: the second test to call a model with a `print` break names it, at the
    model's line and the second test's own call."""
    result = suite.runpytest(
        "--nobreak-all",
        "-p",
        "no:randomly",
        "-v",
        "test_models.py::test_split_first",
        "test_models.py::test_split_twice",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*test_models.py::test_split_first * 2 * 1 * 0 * 0 *passed*",
            "    graph break GB*shared.py:12*",
            "*test_models.py::test_split_twice * 2 * 1 * 0 * 0 *passed*",
            "    graph break GB*shared.py:12*",
        ]
    )
