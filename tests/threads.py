"""Under xdist, each worker of the suite gets its share of the CPUs for torch's threads.

torch starts an intra-op (OpenMP) thread per core in every process, and so does every pytest
run a test starts. Under ``pytest -n 2`` on a 2-core runner, two workers and their inner runs
each asked for both cores, and their threads waited on one another: the suite took 419 to 439 s
that way, and 362 s with one thread a worker (2-core AVX-512 host, cold Inductor cache).

The controller sets ``OMP_NUM_THREADS`` to the CPUs it may run on, divided among its workers,
before it starts them: the workers and every process they start read it when torch starts. A
value the user set stands. A test that needs more threads sets them (``torch.set_num_threads``).
"""

from __future__ import annotations

import os

import pytest

VARIABLE = "OMP_NUM_THREADS"


def per_worker(cpus: int, workers: int) -> int:
    """The intra-op threads of each of ``workers`` processes that share ``cpus``."""
    return max(1, cpus // workers)


def cpus() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):  # Linux
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def share(config: pytest.Config) -> None:
    """Set :data:`VARIABLE` for the workers of an xdist run: call from the controller's
    ``pytest_configure`` (xdist starts its workers at the session's start, after it)."""
    # The workers xdist will start: its pytest_cmdline_main has made -n (auto too) and
    # --maxprocesses into one gateway each.
    workers = len(config.getoption("tx", None) or [])
    if hasattr(config, "workerinput") or VARIABLE in os.environ or not workers:
        return
    os.environ[VARIABLE] = str(per_worker(cpus(), workers))
