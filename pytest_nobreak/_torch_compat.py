"""Every private torch API the plugin relies on, feature-detected, in one place.

Dynamo does not offer a public "tell me about every graph break" API in torch 2.13, so the
monitor taps a handful of internals. They live here, and only here, so a torch upgrade that
moves one of them breaks one module with one clear error naming the torch version, instead of
the plugin silently reporting zero breaks:

- ``InstructionTranslatorBase.log_graph_break``: called with the ``Unsupported`` of every handled
  graph break and frame skip (the only place that sees data-dependent jumps, which
  ``counters["graph_break"]`` misses).
- ``torch._dynamo.utils.counters`` and the compilation metrics: graphs, eager frames, failed
  compiles (backend fallbacks, recompile limit) and recompile reasons.
- ``torch._dynamo.eval_frame._callback_from_stance``: called each time a compiled region is
  entered; the only way to see a region silently run eagerly under ``set_stance("force_eager")``,
  ``"eager_on_recompile"`` or ``torch._dynamo.config.disable``, which leave no other trace.
- The ``torch._dynamo.convert_frame`` WARNING record of a recompile-limit hit (its location).
- The graph-break registry (``gb_type`` -> ``GBxxxx`` id and documentation link).

This module imports torch; import it lazily (the plugin module must not import torch).
"""

from __future__ import annotations

import dataclasses
import functools
import linecache
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch._dynamo
import torch._dynamo.eval_frame as _eval_frame
import torch._dynamo.utils as _dynamo_utils
from torch._dynamo import config as _dynamo_config

MIN_TORCH = (2, 9)
#: Compile attempts kept per test (torch keeps 64; a test with many recompiles needs more).
_METRICS_LIMIT = 100_000
_TRACE_LOGGER = "torch.__trace"
_GB_LINK_RE = re.compile(r"/gb/gb(\d+)\.html")
_FIELD_RE = re.compile(r"^\s{0,4}(Explanation|Hint|Developer debug context):\s?(.*)$")
_LIMIT_LOCATION_RE = re.compile(r"^'(?P<name>.*)' \((?P<file>.*):(?P<line>\d+)\)$")
_SILENT_STANCES = ("force_eager", "eager_on_recompile")


class TorchCompatError(RuntimeError):
    """This torch lacks an API pytest-nobreak needs to see graph breaks."""


def torch_version() -> str:
    """The running torch version without the local build tag (``2.13.0``, not ``2.13.0+cpu``)."""
    return str(torch.__version__).split("+", 1)[0]


def _version_tuple() -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", torch_version())[:2])


@functools.cache
def check_torch() -> None:
    """Fail with one line if this torch cannot be watched, naming what is missing."""
    if _version_tuple() < MIN_TORCH:
        raise TorchCompatError(
            f"pytest-nobreak needs torch>={'.'.join(map(str, MIN_TORCH))}; "
            f"this is torch {torch.__version__}. Upgrade torch or run with -p no:nobreak."
        )
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    required: dict[str, object] = {
        "torch._dynamo.error_on_graph_break": getattr(torch._dynamo, "error_on_graph_break", None),
        "torch._dynamo.utils.counters": getattr(_dynamo_utils, "counters", None),
        "torch._dynamo.utils.get_compilation_metrics": getattr(
            _dynamo_utils, "get_compilation_metrics", None
        ),
        "InstructionTranslatorBase.log_graph_break": getattr(
            InstructionTranslatorBase, "log_graph_break", None
        ),
        "torch._dynamo.eval_frame._callback_from_stance": getattr(
            _eval_frame, "_callback_from_stance", None
        ),
        "torch._dynamo.eval_frame._stance": getattr(_eval_frame, "_stance", None),
    }
    missing = [name for name, value in required.items() if value is None]
    if missing:
        raise TorchCompatError(
            f"pytest-nobreak cannot watch torch.compile on torch {torch.__version__}: "
            f"missing {', '.join(missing)}. Supported: torch>=2.9 (tested on 2.13)."
        )


# --------------------------------------------------------------------------- Dynamo state


def reset_dynamo() -> None:
    """Start from a clean Dynamo: no cached code, zeroed counters, no old compile metrics.

    Without this, code compiled by an earlier test is reused (0 graphs) and compile ids depend
    on test order. ``reset()`` leaves ``counters`` alone, hence the explicit clear.
    """
    torch._dynamo.reset()
    _dynamo_utils.counters.clear()
    _dynamo_utils.clear_compilation_metrics()
    _dynamo_utils.set_compilation_metrics_limit(_METRICS_LIMIT)


@dataclasses.dataclass(frozen=True)
class CounterView:
    graphs: int
    frames_total: int
    frames_ok: int

    @property
    def eager_frames(self) -> int:
        return max(self.frames_total - self.frames_ok, 0)


def read_counters() -> CounterView:
    counters = _dynamo_utils.counters
    return CounterView(
        graphs=int(counters["stats"]["unique_graphs"]),
        frames_total=int(counters["frames"]["total"]),
        frames_ok=int(counters["frames"]["ok"]),
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


def compilation_metrics() -> list[MetricRecord]:
    out = []
    for m in _dynamo_utils.get_compilation_metrics():
        out.append(
            MetricRecord(
                compile_id=getattr(m, "compile_id", None),
                fail_type=getattr(m, "fail_type", None),
                fail_reason=getattr(m, "fail_reason", None),
                file=getattr(m, "fail_user_frame_filename", None)
                or getattr(m, "co_filename", None),
                line=getattr(m, "fail_user_frame_lineno", None)
                or getattr(m, "co_firstlineno", None),
                co_name=getattr(m, "co_name", None),
                recompile_reason=getattr(m, "recompile_reason", None),
            )
        )
    return out


def current_compile_id() -> str | None:
    cid = torch._guards.CompileContext.current_compile_id()
    return str(cid) if cid is not None else None


# --------------------------------------------------------------------------- graph-break text


@dataclasses.dataclass(frozen=True)
class ParsedMessage:
    """A ``format_graph_break_message()`` text split into its fields."""

    gb_type: str
    explanation: str
    hints: tuple[str, ...]
    gb_id: str | None


def parse_graph_break_message(msg: str) -> ParsedMessage:
    lines = msg.splitlines()
    gb_type = lines[0].strip() if lines else ""
    explanation: list[str] = []
    hints: list[str] = []
    field = None
    for raw in lines[1:]:
        if raw.startswith("*** While handling this graph break") or raw.startswith(
            " For more details"
        ):
            break
        m = _FIELD_RE.match(raw)
        if m:
            field, value = m.groups()
            if field == "Explanation":
                explanation.append(value.strip())
            elif field == "Hint":
                hints.append(value.strip())
        # Continuation lines (graph dumps, "While executing %node ...") are left out: the
        # message names the user's line instead.
    link = _GB_LINK_RE.search(msg)
    return ParsedMessage(
        gb_type=gb_type,
        explanation=explanation[0] if explanation else "",
        hints=tuple(h for h in hints if h),
        gb_id=f"GB{link.group(1)}" if link else None,
    )


def gb_link(gb_type: str | None) -> str | None:
    """The graph-break documentation page for a ``gb_type``, if torch's registry knows it."""
    if not gb_type:
        return None
    getter = getattr(torch._dynamo.exc, "get_gbid_documentation_link", None)
    if getter is None:
        return None
    try:
        link = getter(gb_type)
    except Exception:  # the registry is data shipped with torch; a bad file must not crash tests
        return None
    return link if link and _GB_LINK_RE.search(link) else None


def gb_id_of_link(link: str | None) -> str | None:
    m = _GB_LINK_RE.search(link or "")
    return f"GB{m.group(1)}" if m else None


def source_line(file: str | None, line: int | None) -> str | None:
    if not file or not line:
        return None
    text = linecache.getline(file, line).strip()
    return text or None


# --------------------------------------------------------------------------- event taps


@dataclasses.dataclass(frozen=True)
class RawGraphBreak:
    """What ``log_graph_break`` saw: the exception's fields and the innermost user frame."""

    reason: str
    gb_type: str
    msg: str
    file: str | None
    line: int | None
    compile_id: str | None


@dataclasses.dataclass(frozen=True)
class RawSilentEager:
    """A compiled region entered while Dynamo was told to run it eagerly."""

    cause: str
    function: str | None
    file: str | None
    line: int | None


@dataclasses.dataclass(frozen=True)
class RawLimitHit:
    limit: str
    value: str
    function: str | None
    file: str | None
    line: int | None
    last_reason: str


class Sink(Protocol):
    """Receives raw events while registered (the monitor)."""

    def on_graph_break(self, event: RawGraphBreak) -> None: ...

    def on_silent_eager(self, event: RawSilentEager) -> None: ...

    def on_limit_hit(self, event: RawLimitHit) -> None: ...


_sinks: list[Sink] = []
_install_lock = threading.Lock()
_installed = False


def _dispatch(method: str, event: object) -> None:
    for sink in list(_sinks):
        getattr(sink, method)(event)


def _user_frame(stack: Any) -> tuple[str | None, int | None]:
    try:
        frame = stack[-1]
    except (IndexError, TypeError):
        return None, None
    return getattr(frame, "filename", None), getattr(frame, "lineno", None)


def _install_taps() -> None:
    """Patch the three Dynamo entry points once per process; they forward to registered sinks.

    Installed once (not per test) because patching and unpatching around every test would
    fight with other tools doing the same; with no sink registered the patches cost one list
    check.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        from torch._dynamo.symbolic_convert import InstructionTranslatorBase

        original_log = InstructionTranslatorBase.log_graph_break

        @functools.wraps(original_log)
        def log_graph_break(self: Any, code_options: Any, reason: str, exc: Any) -> None:
            if _sinks and not getattr(exc, "logged", False):
                file, line = _user_frame(getattr(exc, "real_stack", None))
                if file is None:
                    file, line = self.f_code.co_filename, getattr(self, "lineno", None)
                msg = getattr(exc, "msg", None) or str(exc)
                _dispatch(
                    "on_graph_break",
                    RawGraphBreak(
                        reason=reason,
                        gb_type=getattr(exc, "gb_type", None) or msg.splitlines()[0],
                        msg=msg,
                        file=file,
                        line=line,
                        compile_id=current_compile_id(),
                    ),
                )
            original_log(self, code_options, reason, exc)

        InstructionTranslatorBase.log_graph_break = log_graph_break  # type: ignore[method-assign]

        original_stance = _eval_frame._callback_from_stance

        @functools.wraps(original_stance)
        def callback_from_stance(callback: Any) -> Any:
            if _sinks and callback not in (None, False):
                cause = _silent_eager_cause()
                if cause is not None:
                    _dispatch("on_silent_eager", _silent_eager_event(cause))
            return original_stance(callback)

        _eval_frame._callback_from_stance = callback_from_stance

        noise_filter = _DynamoWarningFilter()
        for name in _NOISY_LOGGERS:
            logging.getLogger(name).addFilter(noise_filter)
        _installed = True


def _silent_eager_cause() -> str | None:
    stance = getattr(_eval_frame._stance, "stance", "default")
    if stance in _SILENT_STANCES:
        return f'torch.compiler.set_stance("{stance}") is active'
    if _dynamo_config.disable:
        return "torch._dynamo.config.disable is set (or TORCH_COMPILE_DISABLE=1)"
    return None


def _silent_eager_event(cause: str) -> RawSilentEager:
    # The compiled function is a closure variable of Dynamo's wrapper one frame up; the user's
    # call site is the first frame outside torch further up.
    frame = sys._getframe(2)
    fn = frame.f_locals.get("fn")
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        name: str | None = f"{type(owner).__name__}.forward"
    else:
        name = getattr(fn, "__qualname__", None) or getattr(code, "co_name", None)
    torch_dir = os.path.dirname(torch.__file__)
    caller = frame
    while caller is not None and caller.f_code.co_filename.startswith(torch_dir):
        caller = caller.f_back  # type: ignore[assignment]
    if caller is not None:
        return RawSilentEager(cause, name, caller.f_code.co_filename, caller.f_lineno)
    return RawSilentEager(cause, name, getattr(code, "co_filename", None), None)


class _DynamoWarningFilter(logging.Filter):
    """Swallows Dynamo's multi-line graph-break WARNINGs while a monitor is listening.

    The monitor renders the same facts in a few lines at the user's own code; letting the
    originals through would put 40-line dumps in every failure's captured output. The
    recompile-limit WARNING is also where its location comes from, so it is forwarded first.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not _sinks or record.levelno < logging.WARNING:
            return True
        message = str(record.msg)
        if message.startswith("torch._dynamo hit config."):
            self._forward_limit_hit(record)
            return False
        return not message.startswith(_NOISY_PREFIXES)

    @staticmethod
    def _forward_limit_hit(record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) < 4:
            return
        m = _LIMIT_LOCATION_RE.match(str(args[2]))
        _dispatch(
            "on_limit_hit",
            RawLimitHit(
                limit=str(args[0]),
                value=str(args[1]),
                function=m.group("name") if m else None,
                file=m.group("file") if m else None,
                line=int(m.group("line")) if m else None,
                last_reason=str(args[3]),
            ),
        )


# The WARNINGs Dynamo prints for what the monitor reports itself, by logger.
_NOISY_LOGGERS = (
    "torch._dynamo.exc",  # "Backend compiler exception" (gb0219) and other fallbacks
    "torch._dynamo.convert_frame",  # recompile limit, "WON'T CONVERT"
    "torch._dynamo.variables.tensor",  # "Graph break from `Tensor.item()`"
)
_NOISY_PREFIXES = (
    "Backend compiler exception",
    "WON'T CONVERT",
    "Graph break from `Tensor.item()`",
    "torch._dynamo hit config.",
)


@contextmanager
def tapped(sink: Sink) -> Iterator[None]:
    """Deliver Dynamo's events to ``sink`` while the block runs."""
    check_torch()
    _install_taps()
    _sinks.append(sink)
    try:
        yield
    finally:
        _sinks.remove(sink)


def silent_eager_now() -> str | None:
    """Why compiled regions would run eagerly right now, or None."""
    return _silent_eager_cause()


# --------------------------------------------------------------------------- logging noise


def detach_foreign_trace_handlers(owner_prefix: str = "_pytest.") -> None:
    """Remove pytest's capture handlers from torch's structured-trace logger.

    pytest attaches its handlers to every non-propagating logger, ``torch.__trace`` included;
    torch then thinks tracing is on, does the work, and failures show dozens of empty
    ``DEBUG torch.__trace`` lines. Handlers installed by torch itself (``TORCH_TRACE``) stay.
    """
    logger = logging.getLogger(_TRACE_LOGGER)
    for handler in list(logger.handlers):
        if type(handler).__module__.startswith(owner_prefix):
            logger.removeHandler(handler)
