"""The suite's pytest runs keep long-lived objects out of the garbage collector's walks.

torch, Dynamo and sympy leave some 300,000 objects that the garbage collector tracks, and every
full collection walks all of them: 0.16 s each on a 2-core host. A run of the example suite does
about eight while its tests run, pytest two more at its end, and the interpreter more again while
it exits: 2.5 s of that run's 7.4 s, and the suite starts well over a hundred such runs.
:func:`gc.freeze` moves the objects tracked so far to a generation no collection walks.

- **Inner runs** (``-p tests.gc_freeze``, which ``tests/conftest.py`` puts in every run the tests
  start) freeze what survives each full collection: the imports' objects and the session's. A
  run lasts seconds, so what it drops after a collection it lived through is garbage it never
  needs back. The same run of the example suite takes 4.8 s.
- **The outer run** (:func:`freeze_collected`, from ``tests/conftest.py``) freezes only what its
  collection imported: its tests drop objects for minutes, and some check that a dropped object
  is collected.
- Both freeze everything once pytest's own last collection has run (the one that reports a
  finalizer's exception), so the interpreter's exit walks nothing.

An in-process ``pytester`` run shares its process with the outer run, and freezes nothing.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import pytest

#: The pid of the process whose session froze objects: a second session there is in-process.
OWNER = "NOBREAK_TESTS_GC_OWNER"


def _owns_process() -> bool:
    if os.environ.get(OWNER) == str(os.getpid()):
        return False
    os.environ[OWNER] = str(os.getpid())
    return True


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


#: hypothesis's ``register_random`` warns when ``gc.get_referrers`` finds nothing referring to a
#: generator, and it does not look among frozen objects: trio registers one held by a module,
#: and a module imported before a freeze and registered after it (when hypothesis is imported)
#: would warn in runs where no user's run does.
_BLIND_WARNING = "ignore:It looks like `register_random` was passed an object that could"


def _start(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", _BLIND_WARNING)
    # Cleanups run last-registered first: pytest's own (unraisableexception's final
    # collection) is registered after this one (``tryfirst``) and runs before it.
    config.add_cleanup(gc.freeze)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _owns_process():
        return
    _start(config)
    gc.callbacks.append(_freeze_survivors)
    config.add_cleanup(lambda: gc.callbacks.remove(_freeze_survivors))


class _OuterRun:
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        gc.freeze()


def freeze_collected(config: pytest.Config) -> None:
    """The outer run's freezing: call from its ``pytest_configure`` (``tryfirst``)."""
    if _owns_process():
        _start(config)
        config.pluginmanager.register(_OuterRun(), "gc-freeze-outer")
