"""The suite's pytest runs keep long-lived objects out of the garbage collector's walks.

torch, Dynamo and sympy leave some 300,000 objects that the garbage collector tracks, and every
full collection walks all of them: 0.16 s each on a 2-core host. A run of the example suite does
about eight while its tests run, pytest two more at its end, and the interpreter more again while
it exits: 2.5 s of that run's 7.4 s, and the suite starts some 80 such runs.
:func:`gc.freeze` moves the objects tracked so far to a generation no collection walks.

Every run of the suite freezes what survives each full collection: the imports' objects, the
session's, and whatever a test holds at that moment. What such an object leaves when it is
dropped later is freed as usual, unless it is a reference cycle, which stays: a Dynamo cache
that is reset, say (45 MB over ``tests/backend``). Once pytest's own last collection has run
(the one that reports a finalizer's exception), everything is frozen, so the interpreter's exit
walks nothing. The outer run loads it from ``tests/conftest.py`` (:func:`start`), and every
run the tests start with ``-p tests.gc_freeze`` (``tests/conftest.py``'s ``INNER_PLUGINS``).

A test that checks that a dropped object is collected runs under :func:`paused`. An in-process
``pytester`` run shares its process with the run that started it, and changes nothing.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest

#: The pid of the process whose session froze objects: a second session there is in-process.
OWNER = "NOBREAK_TESTS_GC_OWNER"

#: hypothesis's ``register_random`` warns when ``gc.get_referrers`` finds nothing referring to a
#: generator, and it does not look among frozen objects: trio registers one held by a module,
#: and a module imported before a freeze and registered after it (when hypothesis is imported)
#: would warn in runs where no user's run does.
_BLIND_WARNING = "ignore:It looks like `register_random` was passed an object that could"


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


def start(config: pytest.Config) -> None:
    """Freeze from now on in this process, unless a session of it already does: call from a
    ``tryfirst`` ``pytest_configure``."""
    if os.environ.get(OWNER) == str(os.getpid()):
        return
    os.environ[OWNER] = str(os.getpid())
    config.addinivalue_line("filterwarnings", _BLIND_WARNING)
    gc.callbacks.append(_freeze_survivors)
    config.add_cleanup(lambda: gc.callbacks.remove(_freeze_survivors))
    # Cleanups run last-registered first: pytest's own (unraisableexception's final
    # collection) is registered after this one and runs before it.
    config.add_cleanup(gc.freeze)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    start(config)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No freezing inside (a decorator too): objects made here stay collectable, cycles too.

    >>> with paused():
    ...     pass
    """
    frozen = _freeze_survivors in gc.callbacks
    if frozen:
        gc.callbacks.remove(_freeze_survivors)
    try:
        yield
    finally:
        if frozen:
            gc.callbacks.append(_freeze_survivors)
