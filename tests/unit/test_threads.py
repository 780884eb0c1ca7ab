"""Each xdist worker's share of the CPUs for torch's threads (tests/threads.py)."""

from __future__ import annotations

import os

import pytest
from xdist import plugin as xdist_plugin

from tests import threads

# An inner suite that shares the CPUs as ours does, and whose test says what torch got.
_CONFTEST = """
from tests import threads


def pytest_configure(config):
    threads.share(config)
"""
_TEST = """
import os

import torch


def test_threads():
    assert torch.get_num_threads() == int(os.environ["EXPECTED_THREADS"])
"""


@pytest.mark.parametrize(("cpus", "workers", "expected"), [(2, 2, 1), (8, 2, 4), (1, 2, 1)])
def test_the_workers_share_the_cpus(cpus: int, workers: int, expected: int) -> None:
    assert threads.per_worker(cpus, workers) == expected


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``os.environ`` as a copy this test may change, without the variable."""
    copy = {k: v for k, v in os.environ.items() if k != threads.VARIABLE}
    monkeypatch.setattr(os, "environ", copy)
    return copy


def _config(pytester: pytest.Pytester, *args: str) -> pytest.Config:
    """A controller's config once xdist has read its options (its ``pytest_cmdline_main``,
    which runs before ``pytest_configure``: ``-n auto`` and ``--maxprocesses`` resolved)."""
    config = pytester.parseconfig(*args)
    xdist_plugin.pytest_cmdline_main(config)
    return config


def test_a_serial_run_and_a_users_value_are_left_alone(
    pytester: pytest.Pytester, environ: dict[str, str]
) -> None:
    threads.share(_config(pytester))
    threads.share(_config(pytester, "-n", "0"))
    assert threads.VARIABLE not in environ
    environ[threads.VARIABLE] = "3"
    threads.share(_config(pytester, "-n", "2"))
    assert environ[threads.VARIABLE] == "3"


@pytest.mark.parametrize(
    ("args", "workers"),
    [(("-n", "4"), 4), (("-n", "4", "--maxprocesses", "1"), 1), (("-n", "auto"), 3)],
)
def test_an_xdist_controller_shares_the_cpus_among_the_workers_it_starts(
    pytester: pytest.Pytester, environ: dict[str, str], args: tuple[str, ...], workers: int
) -> None:
    environ["PYTEST_XDIST_AUTO_NUM_WORKERS"] = "3"  # what -n auto starts
    threads.share(_config(pytester, *args))
    assert environ[threads.VARIABLE] == str(threads.per_worker(threads.cpus(), workers))


def test_each_workers_torch_gets_its_share(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(threads.VARIABLE, raising=False)  # the outer run's own share
    expected = threads.per_worker(threads.cpus(), 2)
    monkeypatch.setenv("EXPECTED_THREADS", str(expected))
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(test_a=_TEST, test_b=_TEST)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
