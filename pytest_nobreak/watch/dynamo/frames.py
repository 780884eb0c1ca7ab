"""The taps on Dynamo's frame entry and its errors: each frame compiled (its breaks, counters and
recompiles), each graph break logged, each compile attempt's metrics, each error raised."""

from __future__ import annotations

import functools
from typing import Any

import torch._dynamo.convert_frame as _convert_frame
import torch._dynamo.utils as _dynamo_utils
from torch._dynamo.symbolic_convert import InstructionTranslatorBase

from pytest_nobreak.watch.dynamo.records import (
    FrameRecord,
    RawCompileError,
    RawGraphBreak,
    RawRecompile,
    _compiling_frame,
    _dispatch,
    _entry,
    _frame_records,
    _given_up,
    _sinks,
)
from pytest_nobreak.watch.dynamo.stacks import (
    _compiled_callable,
    _inner,
    _stack_above_dynamo,
    _user_stack,
)
from pytest_nobreak.watch.dynamo.state import (
    CounterView,
    _metric_record,
    _read_counters,
    current_compile_id,
)
from pytest_nobreak.watch.events import FRAME_SKIP_REASON
from pytest_nobreak.watch.sites import Frame


def _install_log_tap() -> None:
    """Tap ``log_graph_break``: every handled graph break and frame skip, with its stack."""

    original_log = InstructionTranslatorBase.log_graph_break

    @functools.wraps(original_log)
    def log_graph_break(self: Any, code_options: Any, reason: str, exc: Any) -> None:
        __tracebackhide__ = True  # a tap: not in the user's tracebacks
        compiling = _compiling_frame()
        if (_sinks or compiling is not None) and not getattr(exc, "logged", False):
            msg = getattr(exc, "msg", None) or str(exc)
            code = self.f_code
            here = Frame(code.co_filename, getattr(self, "lineno", None), code.co_name)
            real_stack = getattr(exc, "real_stack", None)
            raw = RawGraphBreak(
                reason=reason,
                gb_type=getattr(exc, "gb_type", None) or msg.splitlines()[0],
                msg=msg,
                stack=_user_stack(real_stack, here, 1),
                compile_id=current_compile_id(),
                inner=tuple(_inner(real_stack, here)),
                frame=compiling,
            )
            if compiling is not None:
                compiling.breaks.append(raw)
                if reason.startswith(FRAME_SKIP_REASON):
                    _given_up[compiling.site] = compiling
            if _sinks:
                _dispatch("on_graph_break", raw)
        original_log(self, code_options, reason, exc)

    InstructionTranslatorBase.log_graph_break = log_graph_break  # type: ignore[method-assign]


def _install_entry_tap() -> None:
    """Tap Dynamo's per-frame entry point: what it counted for the frame, recompiles, and
    errors raised to the caller."""
    wrapper = _convert_frame.CatchErrorsWrapper
    original = wrapper.__call__

    @functools.wraps(original)
    def call(self: Any, frame: Any, cache_entry: Any, frame_state: Any) -> Any:
        __tracebackhide__ = True  # a tap: not in the user's tracebacks
        # Whether or not anyone listens: the graphs compiled here may run in a watched block
        # later, and then they name this compile's breaks.
        records = _frame_records()
        record = _frame_record(frame)
        records.append(record)
        try:
            return _entered(self, frame, cache_entry, frame_state)
        finally:
            records.pop()
            if _given_up.get(record.site, record) is not record:
                del _given_up[record.site]  # compiled again (after a reset): no longer given up

    def _entered(self: Any, frame: Any, cache_entry: Any, frame_state: Any) -> Any:
        __tracebackhide__ = True  # a tap: not in the user's tracebacks
        if not _sinks:
            return original(self, frame, cache_entry, frame_state)
        if cache_entry is not None:
            # Dynamo only calls in on a cache miss; with entries cached, that is a recompile.
            _, definition = _compiled_callable(frame)
            _dispatch("on_recompile", RawRecompile(definition, tuple(_stack_above_dynamo(1))))
        depth = getattr(_entry, "depth", 0)
        before = _read_counters()
        _entry.depth = depth + 1
        try:
            return original(self, frame, cache_entry, frame_state)
        except Exception as exc:
            _dispatch("on_compile_error", _compile_error_event(exc, frame, before))
            raise
        finally:
            _entry.depth = depth
            if depth == 0:
                _dispatch("on_frame", _read_counters() - before)

    wrapper.__call__ = call  # type: ignore[method-assign]


def _frame_record(frame: Any) -> FrameRecord:
    code = frame.f_code
    name, definition = _compiled_callable(frame)
    if definition is None or definition.file is None:
        site = (code.co_filename, code.co_firstlineno, code.co_name)
    else:
        site = (definition.file, definition.line or 0, name or code.co_name)
    return FrameRecord(site=site, code=(code.co_filename, code.co_name))


def _install_metrics_tap() -> None:
    """Tap the creation of each compile attempt's metrics record."""
    metrics = _dynamo_utils.CompilationMetrics
    original = metrics.create

    @functools.wraps(original)
    def create(cls: Any, values: Any) -> Any:
        __tracebackhide__ = True  # a tap: not in the user's tracebacks
        record = original.__func__(cls, values)  # type: ignore[attr-defined]
        if _sinks:
            _dispatch("on_metric", _metric_record(record))
        return record

    metrics.create = classmethod(create)  # type: ignore[method-assign, assignment]


def _compile_error_event(exc: Exception, frame: Any, before: CounterView) -> RawCompileError:
    now = _read_counters()
    compile_id = getattr(exc, "compile_id", None)
    cls = type(exc)
    # Without a stack from Dynamo (a backend's own error), the error is about the compiled
    # function as a whole: its definition.
    _, definition = _compiled_callable(frame)
    return RawCompileError(
        exc_type=f"{cls.__module__}.{cls.__qualname__}",
        msg=getattr(exc, "msg", None) or str(exc),
        text=str(exc),
        stack=_user_stack(getattr(exc, "real_stack", None), definition, 2),
        compile_id=str(compile_id) if compile_id is not None else None,
        counted_as_eager=now.frames_total > before.frames_total
        and now.frames_ok == before.frames_ok,
    )
