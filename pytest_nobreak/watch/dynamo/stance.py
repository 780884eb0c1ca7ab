"""The tap on Dynamo's stance callback: compiled regions that run eagerly with no other trace
(set_stance, config.disable, a frame Dynamo gave up on)."""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch._dynamo.eval_frame as _eval_frame
from torch._dynamo import config as _dynamo_config

from pytest_nobreak.watch.dynamo.records import (
    RawEagerRun,
    RawSilentEager,
    _dispatch,
    _given_up,
    _sinks,
)
from pytest_nobreak.watch.dynamo.stacks import _describe_callable, _stack_above_dynamo

_SILENT_STANCES = ("force_eager", "eager_on_recompile")


def _install_stance_tap() -> None:
    """Tap the stance callback: a compiled region entered and run eagerly (a stance, the
    disable switch, or a frame Dynamo gave up on)."""
    original_stance = _eval_frame._callback_from_stance

    @functools.wraps(original_stance)
    def callback_from_stance(callback: Any) -> Any:
        __tracebackhide__ = True  # a tap: not in the user's tracebacks
        if _sinks and callback not in (None, False):
            cause = _silent_eager_cause()
            if cause is not None:
                _dispatch("on_silent_eager", _silent_eager_event(cause))
            elif _given_up:
                _replay_given_up()
        return original_stance(callback)

    _eval_frame._callback_from_stance = callback_from_stance


def _silent_eager_cause() -> str | None:
    stance = getattr(_eval_frame._stance, "stance", "default")
    if stance in _SILENT_STANCES:
        return f'torch.compiler.set_stance("{stance}") is active'
    if _dynamo_config.disable:
        return "torch._dynamo.config.disable is set (or TORCH_COMPILE_DISABLE=1)"
    return None


def _replay_given_up() -> None:
    """Tell the sinks if the region being entered is a frame Dynamo gave up on."""
    # As for a silent eager run: the compiled function is in the locals of Dynamo's wrapper.
    described = _describe_callable(sys._getframe(2).f_locals.get("fn"))
    definition = described[1] if described is not None else None
    if described is None or definition is None:
        return
    record = _given_up.get((definition.file or "", definition.line or 0, described[0]))
    if record is not None:
        _dispatch("on_eager_run", RawEagerRun(record, tuple(_stack_above_dynamo(2))))


def _silent_eager_event(cause: str) -> RawSilentEager:
    # The compiled function is a closure variable of Dynamo's wrapper one frame up; its callers
    # further up are where the user entered the region.
    described = _describe_callable(sys._getframe(2).f_locals.get("fn"))
    return RawSilentEager(cause, described[0] if described else None, tuple(_stack_above_dynamo(2)))


def silent_eager_now() -> str | None:
    """Why compiled regions would run eagerly right now, or None."""
    return _silent_eager_cause()
