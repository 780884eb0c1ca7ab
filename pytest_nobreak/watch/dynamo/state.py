"""Dynamo's own state the monitor reads or resets: its counters, compile metrics, compile id."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch._dynamo
import torch._dynamo.utils as _dynamo_utils


def reset_dynamo() -> None:
    """Start from a clean Dynamo, as in a new process: no cached code, zeroed counters, no old
    compile metrics, ``warn_once`` warnings re-armed.

    Without this, code compiled by an earlier test is reused (0 graphs) and compile ids depend
    on test order. ``reset()`` leaves ``counters`` alone, hence the explicit clear.
    """
    torch._dynamo.reset()
    _dynamo_utils.counters.clear()
    _dynamo_utils.clear_compilation_metrics()


@dataclasses.dataclass(frozen=True)
class CounterView:
    """What Dynamo counted: frames it tried to compile, frames it compiled. (Graphs are counted
    where they run: :class:`RawGraph`.)"""

    frames_total: int = 0
    frames_ok: int = 0

    @property
    def eager_frames(self) -> int:
        return max(self.frames_total - self.frames_ok, 0)

    def __add__(self, other: CounterView) -> CounterView:
        return CounterView(self.frames_total + other.frames_total, self.frames_ok + other.frames_ok)

    def __sub__(self, other: CounterView) -> CounterView:
        return CounterView(self.frames_total - other.frames_total, self.frames_ok - other.frames_ok)


def _read_counters() -> CounterView:
    # ``get``, not ``[]``: the counters are a defaultdict, and reading a missing group through
    # ``[]`` would add it, a change a test iterating the counters could see.
    frames: Mapping[str, int] = _dynamo_utils.counters.get("frames", {})
    return CounterView(
        frames_total=int(frames.get("total", 0)),
        frames_ok=int(frames.get("ok", 0)),
    )


@dataclasses.dataclass(frozen=True)
class MetricRecord:
    """The fields of one ``CompilationMetrics`` entry that the monitor reads."""

    compile_id: str | None
    fail_type: str | None
    fail_reason: str | None
    file: str | None
    line: int | None
    co_name: str | None
    recompile_reason: str | None


def _metric_record(m: Any) -> MetricRecord:
    return MetricRecord(
        compile_id=getattr(m, "compile_id", None),
        fail_type=getattr(m, "fail_type", None),
        fail_reason=getattr(m, "fail_reason", None),
        file=getattr(m, "fail_user_frame_filename", None) or getattr(m, "co_filename", None),
        line=getattr(m, "fail_user_frame_lineno", None) or getattr(m, "co_firstlineno", None),
        co_name=getattr(m, "co_name", None),
        recompile_reason=getattr(m, "recompile_reason", None),
    )


def current_compile_id() -> str | None:
    cid = torch._guards.CompileContext.current_compile_id()
    return str(cid) if cid is not None else None
