"""The suite's freezing of long-lived objects (tests/gc_freeze.py)."""

from __future__ import annotations

import gc
import importlib.util
import weakref

import pytest

from tests import gc_freeze

# An inner run's tests: what lived through a full collection is frozen, and garbage made after
# it is still collected.
_INNER = """
import gc
import weakref


class Cycle:
    def __init__(self):
        self.me = self


def test_survivors_of_a_full_collection_are_frozen():
    kept = Cycle()
    gc.collect()
    assert gc.get_freeze_count() > 0
    assert not any(obj is kept for obj in gc.get_objects())  # frozen: no generation holds it


def test_garbage_made_after_it_is_collected():
    dropped = weakref.ref(Cycle())
    gc.collect()
    assert dropped() is None
"""

# What the interpreter's exit walks: the objects not frozen once pytest is done.
_AT_EXIT = """
import atexit

atexit.register(lambda: print(f"unfrozen at exit: {len(gc.get_objects())}"))
"""


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_an_inner_run_freezes_what_survives_a_full_collection(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(_INNER + _AT_EXIT)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    # Frozen once pytest's last collection ran: without, some 60,000 (pytest's own).
    unfrozen = int(result.outlines[-1].removeprefix("unfrozen at exit: "))
    assert unfrozen < 1000


def test_this_run_freezes_survivors_and_an_in_process_run_adds_nothing(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        "import gc\nfrom tests.gc_freeze import _freeze_survivors\n\n"
        "def test_one_freezer():\n    assert gc.callbacks.count(_freeze_survivors) == 1\n"
    )
    assert gc.callbacks.count(gc_freeze._freeze_survivors) == 1
    pytester.runpytest().assert_outcomes(passed=1)
    assert gc.callbacks.count(gc_freeze._freeze_survivors) == 1


def test_a_cycle_made_while_paused_is_collected_after_a_full_collection() -> None:
    with gc_freeze.paused():
        assert gc_freeze._freeze_survivors not in gc.callbacks
        cycle = _Cycle()
        gc.collect()
        dropped = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert dropped() is None
    assert gc_freeze._freeze_survivors in gc.callbacks


def test_a_run_with_hypothesiss_plugin_gets_no_warning_from_trios_hook(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trio's hypothesis hook checks its generator's referrers, which frozen objects hide."""
    assert importlib.util.find_spec("trio") is not None, "the case needs trio (selenium's)"
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p tests.gc_freeze")  # hypothesis's plugin on
    pytester.makepyfile("import gc\n\ndef test_a():\n    gc.collect()\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1, warnings=0)
