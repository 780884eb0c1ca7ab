"""Every private torch API the plugin relies on, feature-detected, in one place.

Dynamo does not offer a public "tell me about every graph break" API in torch 2.13, so the
monitor taps a handful of internals. They live here, and only here, so a torch upgrade that
moves one of them breaks one module with one clear error naming the torch version, instead of
the plugin silently reporting zero breaks:

- ``InstructionTranslatorBase.log_graph_break``: called with the ``Unsupported`` of every handled
  graph break and frame skip (the only place that sees data-dependent jumps, which
  ``counters["graph_break"]`` misses). Its message chains the breaks Dynamo hit while handling
  an earlier one, root cause first; its ``real_stack`` starts at the compiled frame, and the
  Python stack above Dynamo's compiler holds the user's calls that led there.
- ``torch._dynamo.convert_frame.CatchErrorsWrapper.__call__``: Dynamo's entry point for every
  frame it has no compiled code for. An exception leaving it reaches the caller (a compile
  error, not an eager run); a call with cached entries is a recompile, whose compiled callable
  (a module's ``forward`` behind ``wrap_inline``) is in the frame's locals. What Dynamo adds to
  ``torch._dynamo.utils.counters`` during the call (graphs, frames, frames compiled) is the
  frame's: the taps count it there, so code that clears the counters or calls
  ``torch._dynamo.reset()`` (``torch._dynamo.test_case.TestCase.tearDown``) cannot zero it.
- ``CompilationMetrics.create``: called once per compile attempt with its record (failed
  compiles: backend fallbacks, the recompile limit; recompile reasons); tapped for the same
  reason, instead of reading torch's deque, which a reset clears and which keeps only 64.
- ``torch._dynamo.eval_frame._callback_from_stance``: called each time a compiled region is
  entered; the only way to see a region silently run eagerly under ``set_stance("force_eager")``,
  ``"eager_on_recompile"`` or ``torch._dynamo.config.disable``, which leave no other trace.
- ``OutputGraph.call_user_compiler``: where Dynamo hands each graph to the backend. The graph's
  host syncs (:mod:`asic_backend.lower.host_syncs`) are read there, and the compiled callable it
  returns is wrapped to count each call: a test counts the graphs it runs, the breaks of
  their compile (recorded with the compile, in ``FrameRecord``) and their syncs, whenever
  they were compiled. A frame Dynamo gave up on is seen again where its region is entered
  (the stance tap below). A backend that goes through
  AOTAutograd runs ``graph_compile._apply_tensorify_python_scalars`` first, which turns a float
  ``.item()`` used only in tensor math back into tensor ops: the syncs of such a graph are read
  from the graph that pass leaves (tapped too), which is what runs.
- The ``torch._dynamo.convert_frame`` WARNING record of a recompile-limit hit (its location).
- The graph-break registry (``gb_type`` -> ``GBxxxx`` id and documentation link).

This module imports torch; import it lazily (the plugin module must not import torch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch._dynamo
import torch._dynamo.convert_frame as _convert_frame
import torch._dynamo.eval_frame as _eval_frame
import torch._dynamo.output_graph as _output_graph
import torch._dynamo.utils as _dynamo_utils
from torch._dynamo import config as _dynamo_config
from torch._functorch import config as _functorch_config

from pytest_nobreak.watch.events import FRAME_SKIP_REASON
from pytest_nobreak.watch.sites import Frame

MIN_TORCH = (2, 12)
_TRACE_LOGGER = "torch.__trace"
_GB_LINK_RE = re.compile(r"/gb/gb(\d+)\.html")
_FIELD_RE = re.compile(r"^\s{0,4}(Explanation|Hint|Developer debug context):\s?(.*)$")
_LIMIT_LOCATION_RE = re.compile(r"^'(?P<name>.*)' \((?P<file>.*):(?P<line>\d+)\)$")
_SILENT_STANCES = ("force_eager", "eager_on_recompile")
#: Between two breaks of a chain in a Dynamo message (the first is the root cause).
_CHAIN_SEPARATOR = "*** While handling this graph break, another graph break occurred: ***"
#: A higher-order op (``torch.cond``, ...) whose subgraph broke: the inner break follows.
_HOP_SEPARATOR = "Got graph break/error:"
_HOP_NAME_RE = re.compile(r"^\s*Higher Order Operator: (\S+)", re.MULTILINE)
#: Dynamo calls the rest of a frame after a break through a function named after it.
_RESUME_RE = re.compile(r"^torch_dynamo_resume_in_(?P<name>\w+)_at_\d+$")


class TorchCompatError(RuntimeError):
    """This torch lacks an API pytest-nobreak needs to see graph breaks."""


def torch_version() -> str:
    """The running torch version without the local build tag (``2.13.0``, not ``2.13.0+cpu``)."""
    return str(torch.__version__).split("+", 1)[0]


def release() -> tuple[int, ...]:
    """The running torch's (major, minor): ``(2, 13)``."""
    return tuple(int(p) for p in re.findall(r"\d+", torch_version())[:2])


#: The torch releases the plugin is tested on (CI runs the oldest and the newest).
SUPPORTED = f">={'.'.join(map(str, MIN_TORCH))} (tested on 2.12 and 2.13)"

#: The parameters each tapped function must take, as the taps call it (``self`` and ``cls``
#: left out). A torch that renames or reorders them would break the user's compile through
#: the tap (torch 2.10's ``log_graph_break(code_options, reason="", user_stack=None)`` made
#: every graph break an ``InternalTorchDynamoError``), so it is refused instead.
_SIGNATURES: dict[str, tuple[str, ...]] = {
    "InstructionTranslatorBase.log_graph_break": ("code_options", "reason", "exc"),
    "torch._dynamo.eval_frame._callback_from_stance": ("callback",),
    "torch._dynamo.convert_frame.CatchErrorsWrapper.__call__": (
        "frame",
        "cache_entry",
        "frame_state",
    ),
    "torch._dynamo.utils.CompilationMetrics.create": ("metrics",),
    "torch._dynamo.output_graph.OutputGraph.call_user_compiler": ("gm", "example_inputs"),
}


@functools.cache
def check_torch() -> None:
    """Fail with one line if this torch cannot be watched, naming what is missing or what
    takes other arguments than the taps pass."""
    if release() < MIN_TORCH:
        raise TorchCompatError(
            f"pytest-nobreak needs torch{SUPPORTED}; this is torch {torch.__version__}. "
            "Upgrade torch or run with -p no:nobreak."
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
        # vars(), not getattr(): every class has a __call__ (type's).
        "torch._dynamo.convert_frame.CatchErrorsWrapper.__call__": vars(
            getattr(_convert_frame, "CatchErrorsWrapper", object)
        ).get("__call__"),
        "torch._dynamo.utils.CompilationMetrics.create": getattr(
            getattr(_dynamo_utils, "CompilationMetrics", None), "create", None
        ),
        "torch._dynamo.output_graph.OutputGraph.call_user_compiler": getattr(
            _output_graph.OutputGraph, "call_user_compiler", None
        ),
    }
    missing = [name for name, value in required.items() if value is None]
    if missing:
        raise TorchCompatError(
            f"pytest-nobreak cannot watch torch.compile on torch {torch.__version__}: "
            f"missing {', '.join(missing)}. Supported: torch{SUPPORTED}."
        )
    changed = [
        f"{name}({', '.join(found)}), not ({', '.join(expected)})"
        for name, expected in _SIGNATURES.items()
        if (found := _parameters(required[name])) is not None and found != expected
    ]
    if changed:
        raise TorchCompatError(
            f"pytest-nobreak cannot watch torch.compile on torch {torch.__version__}: "
            f"{'; '.join(changed)}. Supported: torch{SUPPORTED}."
        )


def _parameters(fn: object) -> tuple[str, ...] | None:
    """The parameter names of ``fn`` past ``self``/``cls`` (``None`` if unreadable: a C
    function, which the taps only wrap with ``*args``)."""
    try:
        # The original's, not the tap's (a bound classmethod's wrapper would lose a parameter).
        params = list(inspect.signature(inspect.unwrap(fn)).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return tuple(p for p in params if p not in ("self", "cls"))


# --------------------------------------------------------------------------- Dynamo state


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


def parse_chain(msg: str, text: str = "") -> list[ParsedMessage]:
    """The breaks of a message, root cause first; one for a break that is not chained.

    ``text``: the exception's ``str()``, which alone names a higher-order op.
    """
    head, hop, inner = msg.partition(_HOP_SEPARATOR)
    if hop:
        name = _HOP_NAME_RE.search(text or msg)
        wrapper = ParsedMessage(
            gb_type=f"{name.group(1) if name else 'higher-order op'} not captured whole",
            explanation=head.strip(),
            hints=(),
            gb_id=None,
        )
        return [*parse_chain(inner.strip("\n"), text), wrapper]
    return [parse_graph_break_message(part.strip("\n")) for part in msg.split(_CHAIN_SEPARATOR)]


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


# --------------------------------------------------------------------------- event taps


@dataclasses.dataclass(frozen=True)
class RawGraphBreak:
    """What ``log_graph_break`` saw: the exception's fields and the stack, outermost first (the
    user's callers, then Dynamo's ``real_stack``)."""

    reason: str
    gb_type: str
    msg: str
    stack: tuple[Frame, ...]
    compile_id: str | None
    #: Dynamo's own part of ``stack``, from the compiled frame in: a later call of the frame's
    #: graph puts its own callers above it (:meth:`RawGraph.stack_of`).
    inner: tuple[Frame, ...] = ()
    #: The compile this break was logged in, when the entry tap saw it start.
    frame: FrameRecord | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass(eq=False)
class FrameRecord:
    """One compile of a frame by Dynamo: what it compiled (``site``: file, first line and
    name of the function, a module's ``forward`` rather than torch's wrapper around it) and
    the breaks it logged. Its graphs keep it for as long as Dynamo keeps them, so a graph
    called long after its compile (by a later test) still names the breaks around it."""

    site: tuple[str, int, str]
    #: The file and name of the frame's own code (torch's wrapper for a compiled module), as
    #: it runs when its compiled code is called.
    code: tuple[str, str]
    breaks: list[RawGraphBreak] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class RawCompileError:
    """An exception Dynamo raised to the code that called a compiled region."""

    exc_type: str
    msg: str
    text: str
    stack: tuple[Frame, ...]
    compile_id: str | None
    #: Whether Dynamo counted the frame in ``frames.total`` but not ``frames.ok``, as it does
    #: for a frame that runs eagerly.
    counted_as_eager: bool


@dataclasses.dataclass(frozen=True)
class RawSilentEager:
    """A compiled region entered while Dynamo was told to run it eagerly."""

    cause: str
    function: str | None
    stack: tuple[Frame, ...]


@dataclasses.dataclass(frozen=True)
class RawRecompile:
    """A compiled region entered with inputs its compiled code does not fit: Dynamo compiles
    it again. ``definition`` is where what the user compiled is defined (a module's
    ``forward``, not Dynamo's wrapper around it), ``stack`` its callers."""

    definition: Frame | None
    stack: tuple[Frame, ...]


@dataclasses.dataclass(frozen=True)
class RawLimitHit:
    limit: str
    value: str
    function: str | None
    file: str | None
    line: int | None
    last_reason: str


@dataclasses.dataclass(frozen=True, eq=False)
class SyncSite:
    """The host syncs of one compiled graph at one place: the op as the user wrote it, why it
    is a sync, how many of the graph's nodes it is, and the frames Dynamo traced to it,
    outermost first (the compiled function's first)."""

    op: str
    form: str
    fix: str
    count: int
    traced: tuple[Frame, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class RawGraphSyncs:
    """A compiled graph that has host syncs, sent on each of its calls (compared by identity:
    a monitor counts calls per graph). ``compiled_from``: the callers that entered the region
    when it was compiled, for a call whose own callers cannot be found (:func:`callers`)."""

    sites: tuple[SyncSite, ...]
    compiled_from: tuple[Frame, ...] = ()

    def callers(self) -> tuple[Frame, ...]:
        """The callers of the compiled function in this call, outermost first: the frames
        above the innermost running frame of the function the graph was traced from (a graph
        compiled in one test and called from another is that other test's), else
        ``compiled_from``. Walks the stack: call it once per graph and watched block."""
        root = next((site.traced[0] for site in self.sites if site.traced), None)
        found = None if root is None else _callers_of(root.file, root.function, 2)
        return self.compiled_from if found is None else found


@dataclasses.dataclass(frozen=True, eq=False)
class RawGraph:
    """A graph Dynamo compiled, sent on each of its calls (compared by identity: a monitor
    counts what ran per graph, whenever it was compiled).

    ``key``: the graph as the user reads it, the same for a recompile of the same code into
    the same ops (a dynamic-shape graph after a static one): the compiled function's site and
    the graph's ops, symbolic-size arithmetic left out. ``frame``: the compile it came from,
    with the breaks logged there, which each call of the graph crosses. ``syncs``: its host
    syncs, if any.
    """

    key: tuple[object, ...]
    frame: FrameRecord
    syncs: RawGraphSyncs | None = None

    def callers(self) -> tuple[Frame, ...] | None:
        """The callers of the compiled frame in this call, outermost first (``None`` if it is
        not on the stack). Walks the stack: call it once per graph and watched block."""
        file, name = self.frame.code
        return _callers_of(file, name, 2)

    def stack_of(self, raw: RawGraphBreak, callers: tuple[Frame, ...] | None) -> tuple[Frame, ...]:
        """The stack of one of the frame's breaks in this call: ``callers``, then Dynamo's part
        (what it was when the break was logged if the callers are not known)."""
        if callers is None or not raw.inner:
            return raw.stack
        return _merge_resumed([*callers, *raw.inner])


@dataclasses.dataclass(frozen=True, eq=False)
class RawEagerRun:
    """A compiled function entered again after Dynamo gave up on it (it runs eagerly, with no
    compile): ``frame`` is the compile that gave up, ``callers`` who entered it now."""

    frame: FrameRecord
    callers: tuple[Frame, ...]

    def stacks(self) -> list[tuple[RawGraphBreak, tuple[Frame, ...]]]:
        """Each break of the compile, with its stack in this call."""
        return [
            (b, _merge_resumed([*self.callers, *b.inner]) if b.inner else b.stack)
            for b in list(self.frame.breaks)
        ]


#: The compiles that gave up on a whole frame, by what was compiled (``FrameRecord.site``):
#: Dynamo runs such a frame eagerly from then on, and only an entry into it can tell.
_given_up: dict[tuple[str, int, str], FrameRecord] = {}


def gave_up_on(record: FrameRecord) -> bool:
    """Whether Dynamo still runs what ``record`` compiled eagerly (no compile since)."""
    return _given_up.get(record.site) is record


def _callers_of(file: str | None, function: str | None, depth: int) -> tuple[Frame, ...] | None:
    """The frames above the innermost running frame of ``function`` in ``file``, outermost
    first, or ``None`` when no such frame runs."""
    frame: Any = sys._getframe(depth)
    while frame is not None:
        code = frame.f_code
        if code.co_filename == file and code.co_name == function:
            return tuple(reversed(_frames_outward(frame.f_back)))
        frame = frame.f_back
    return None


def _frames_outward(frame: Any) -> list[Frame]:
    out = []
    while frame is not None:
        out.append(Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out


class Sink(Protocol):
    """Receives raw events while registered (the monitor).

    ``quiet``: the sink reports Dynamo's graph-break WARNINGs itself (a marked test's failure
    message), so while it is registered they are kept from the logging handlers. An observer
    is not quiet: every handler then sees exactly what it sees without pytest-nobreak.
    """

    @property
    def quiet(self) -> bool: ...

    def on_frame(self, counted: CounterView) -> None: ...

    def on_metric(self, record: MetricRecord) -> None: ...

    def on_graph_break(self, event: RawGraphBreak) -> None: ...

    def on_compile_error(self, event: RawCompileError) -> None: ...

    def on_silent_eager(self, event: RawSilentEager) -> None: ...

    def on_recompile(self, event: RawRecompile) -> None: ...

    def on_limit_hit(self, event: RawLimitHit) -> None: ...

    def on_graph_run(self, event: RawGraph) -> None: ...

    def on_eager_run(self, event: RawEagerRun) -> None: ...


_sinks: list[Sink] = []
_install_lock = threading.Lock()
_installed = False
#: How deep in Dynamo's entry point this thread is: only the outermost call counts what Dynamo
#: counted, so a compile nested in another (a backend calling a compiled function) is not
#: counted twice.
_entry = threading.local()


def _dispatch(method: str, event: object) -> None:
    for sink in list(_sinks):
        getattr(sink, method)(event)


def _frames(stack: Any) -> list[Frame]:
    """A ``StackSummary`` (Dynamo's ``real_stack``) as frames; empty if there is none."""
    try:
        return [Frame(f.filename, f.lineno, f.name) for f in stack or () if f.filename]
    except (AttributeError, TypeError):
        return []


def _stack_above_dynamo(depth: int) -> list[Frame]:
    """The Python stack outside Dynamo's compiler, outermost first, from ``depth`` frames up.

    Everything inside the outermost ``convert_frame`` frame (or this module's tap around it)
    is Dynamo at work, and a backend it called; outside it are the calls that entered the
    compiled region: the user's.
    """
    frames = []
    frame: Any = sys._getframe(depth + 1)
    while frame is not None:
        frames.append(Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    frames.reverse()
    compiler = (_convert_frame.__file__, __file__)
    for index, entry in enumerate(frames):
        if entry.file in compiler:
            return frames[:index]
    return frames


def _user_stack(real_stack: Any, compiled: Frame | None, depth: int) -> tuple[Frame, ...]:
    """The callers above Dynamo, then its ``real_stack`` (else the ``compiled`` frame, where
    Dynamo was when it gave up), outermost first (see :func:`_merge_resumed`)."""
    return _merge_resumed([*_stack_above_dynamo(depth + 1), *_inner(real_stack, compiled)])


def _inner(real_stack: Any, compiled: Frame | None) -> list[Frame]:
    return _frames(real_stack) or ([compiled] if compiled is not None else [])


def _merge_resumed(frames: list[Frame]) -> tuple[Frame, ...]:
    """After a break, Dynamo runs the rest of the frame as a ``torch_dynamo_resume_in_f_at_N``
    function called from ``f`` itself; that pair is one frame of the user's code, ``f`` at the
    resume function's line."""
    out: list[Frame] = []
    for frame in frames:
        resumed = _RESUME_RE.match(frame.function or "")
        if resumed and out and out[-1].function == resumed["name"]:
            out[-1] = Frame(frame.file, frame.line, resumed["name"])
        else:
            out.append(frame)
    return tuple(out)


def _install_taps() -> None:
    """Patch the Dynamo entry points once per process; they forward to registered sinks.

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
        _install_entry_tap()
        _install_metrics_tap()
        _install_compiler_tap()

        noise_filter = _DynamoWarningFilter()
        for name in _NOISY_LOGGERS:
            logging.getLogger(name).addFilter(noise_filter)
        _installed = True


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


def _frame_records() -> list[FrameRecord]:
    """The compiles this thread is in, innermost last."""
    records: list[FrameRecord] | None = getattr(_entry, "records", None)
    if records is None:
        records = _entry.records = []
    return records


def _compiling_frame() -> FrameRecord | None:
    records = getattr(_entry, "records", None)
    return records[-1] if records else None


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


#: The syncs AOTAutograd's graphs hold, for the Dynamo graph this thread compiles: a list once
#: AOTAutograd ran, ``None`` before; ``_NOT_COMPILING`` outside any compile (an AOTAutograd run
#: of its own, such as ``torch.export``'s, is none of ours). Restored on the way out.
_compiling = threading.local()
_NOT_COMPILING: Any = object()


def _install_compiler_tap() -> None:
    """Read each graph's host syncs where Dynamo hands it to the backend, and count its calls.

    Every graph is called through a wrapper that tells the sinks of each call (one list check
    when there are none): what a test runs is counted whether it compiled it itself, an
    earlier test did, or it was compiled before any test. The wrapper is installed whether a
    sink listens or not, for that reason.
    """
    from asic_backend.lower.host_syncs import find_host_syncs

    original = _output_graph.OutputGraph.call_user_compiler

    @functools.wraps(original)
    def call_user_compiler(self: Any, gm: Any, example_inputs: Any) -> Any:
        __tracebackhide__ = True  # a tap: not in the user's tracebacks
        if getattr(self, "export", False):
            return original(self, gm, example_inputs)
        traced = _analysed(find_host_syncs, gm)  # before the backend, which may rewrite it
        key = _graph_key(gm)
        # A float read may be turned back into tensor math by AOTAutograd, whose graph tells;
        # a hit in its cache skips that graph, and the count would depend on the cache.
        uncached = (
            _functorch_config.patch(enable_autograd_cache=False)
            if any(sync.float_read for sync in traced)
            else contextlib.nullcontext()
        )
        outer = getattr(_compiling, "aot", _NOT_COMPILING)
        _compiling.aot = None
        try:
            with uncached:
                compiled = original(self, gm, example_inputs)
            aot = _compiling.aot
        finally:
            _compiling.aot = outer
        syncs = traced if aot is None else _as_traced(aot, traced)
        frame = _compiling_frame() or _root_record(self)
        graph = RawGraph(
            key=(frame.site, key),
            frame=frame,
            syncs=_graph_syncs(syncs) if syncs else None,
        )
        compiled = _real_forward(compiled)

        def counted(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # a tap: not in the user's tracebacks
            if _sinks:
                _dispatch("on_graph_run", graph)
            return compiled(*args, **kwargs)

        return counted

    _output_graph.OutputGraph.call_user_compiler = call_user_compiler  # type: ignore[method-assign]
    _install_aot_tap(find_host_syncs)


def _graph_syncs(syncs: tuple[Any, ...]) -> RawGraphSyncs:
    return RawGraphSyncs(
        tuple(
            SyncSite(
                op=sync.op,
                form=sync.form,
                fix=sync.fix,
                count=sync.count,
                traced=tuple(Frame(f, line, fn) for f, line, fn in sync.frames),
            )
            for sync in syncs
        ),
        compiled_from=tuple(_stack_above_dynamo(2)),
    )


#: Graph nodes that only compute sizes: a dynamic-shape graph has them, its static twin not.
_SIZE_METHODS = frozenset({"size", "dim", "stride", "numel"})


def _graph_key(gm: Any) -> tuple[str, ...]:
    """The ops of a graph, in order, without the arithmetic on symbolic sizes."""
    try:
        out = []
        for node in gm.graph.nodes:
            if node.op == "call_method" and node.target not in _SIZE_METHODS:
                out.append(f"method:{node.target}")
            elif node.op == "call_module":
                out.append(f"module:{node.target}")
            elif node.op == "call_function":
                target = node.target
                module = getattr(target, "__module__", None) or ""
                name = getattr(target, "__name__", None) or str(target)
                if module in ("_operator", "operator", "math") or name.startswith("sym_"):
                    continue
                out.append(f"{module}.{name}")
        return tuple(out)
    except Exception:  # a graph the key cannot read is its own graph
        return (f"graph:{id(gm)}",)


def _root_record(output: Any) -> FrameRecord:
    """A compile the entry tap did not see start (a graph compiled some other way)."""
    code = getattr(getattr(output, "root_tx", None), "f_code", None)
    if code is None:
        return FrameRecord(site=("<unknown>", 0, "<graph>"), code=("<unknown>", "<graph>"))
    return FrameRecord(
        site=(code.co_filename, code.co_firstlineno, code.co_name),
        code=(code.co_filename, code.co_name),
    )


def _real_forward(compiled: Any) -> Any:
    """What Dynamo itself would call for a lazily recompiled graph module (``eager``'s
    ``gm.forward``): its real ``forward``, made now. Wrapped, Dynamo's own check for one no
    longer sees it, and each call would go through ``nn.Module.__call__`` instead."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    owner = getattr(compiled, "__self__", None)
    if isinstance(owner, _LazyGraphModule) and getattr(compiled, "__name__", "") == "_lazy_forward":
        _LazyGraphModule.force_recompile(owner)
        return owner.forward
    if isinstance(compiled, _LazyGraphModule):
        _LazyGraphModule.force_recompile(compiled)
    return compiled


def _install_aot_tap(find_host_syncs: Any) -> None:
    """Read the syncs of the graph AOTAutograd compiles, after the pass that may remove some."""
    try:
        from torch._functorch._aot_autograd import graph_compile
    except ImportError:  # an older layout: the Dynamo graph's syncs stand
        return
    original = getattr(graph_compile, "_apply_tensorify_python_scalars", None)
    if original is None:
        return

    @functools.wraps(original)
    def apply(module: Any) -> None:
        __tracebackhide__ = True  # a tap: not in the user's tracebacks
        original(module)
        found = getattr(_compiling, "aot", _NOT_COMPILING)
        if found is not _NOT_COMPILING:
            _compiling.aot = [*(found or ()), *_analysed(find_host_syncs, module)]

    graph_compile._apply_tensorify_python_scalars = apply


def _analysed(find: Any, gm: Any) -> tuple[Any, ...]:
    """``find(gm)``, or no syncs if the analysis fails: it must never fail a compile (the taps
    watch every compile of the process, watched test or not)."""
    try:
        return tuple(find(gm))
    except Exception:
        return ()


#: Aten ops that stand for the same read in Dynamo's graph and AOTAutograd's.
_SAME_READ = {"aten.item": "aten._local_scalar_dense"}


def _as_traced(aot: list[Any], traced: tuple[Any, ...]) -> tuple[Any, ...]:
    """AOTAutograd's syncs, named as the user wrote them: a sync at the same traced stack as
    one of the Dynamo graph, of the same aten op (``aten._local_scalar_dense`` is
    ``Tensor.item``), or the only one there, is that sync; any other keeps its aten name."""
    by_stack: dict[Any, list[Any]] = {}
    for sync in traced:
        by_stack.setdefault(sync.frames, []).append(sync)
    out = []
    for sync in aot:
        here = by_stack.get(sync.frames, [])
        same = [t for t in here if _SAME_READ.get(t.aten, t.aten) == sync.aten]
        known = same[0] if same else (here[0] if len(here) == 1 else None)
        out.append(
            sync if known is None else dataclasses.replace(sync, op=known.op, form=known.form)
        )
    return tuple(out)


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


def _compiled_callable(frame: Any) -> tuple[str | None, Frame | None]:
    """The name and definition of what the user compiled, for the frame Dynamo compiles.

    A compiled module (and any callable Dynamo cannot compile directly) runs inside torch's
    ``wrap_inline`` wrapper, a frame of torch's with the callable in its locals as ``fn``.
    """
    code = frame.f_code
    if code.co_filename.startswith(_torch_dir()):
        described = _describe_callable(frame.f_locals.get("fn"))
        if described is not None:
            return described
    name = getattr(code, "co_qualname", code.co_name)
    return name, Frame(code.co_filename, code.co_firstlineno, name)


def _describe_callable(fn: Any) -> tuple[str, Frame | None] | None:
    """``("MLP.forward", <its definition>)`` for a module, the qualified name of a function."""
    for _ in range(10):  # functools.wraps chains; bounded, a cycle must not hang a test
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            break
        fn = inner
    if getattr(fn, "__func__", None) in _MODULE_CALLS:
        fn = fn.__self__  # a module's __call__: what runs is its forward
    if fn is None:
        return None
    name: str | None
    if isinstance(fn, torch.nn.Module):
        name = f"{type(fn).__qualname__}.forward"
        code = getattr(type(fn).forward, "__code__", None)
    else:
        function = getattr(fn, "__func__", fn)
        code = getattr(function, "__code__", None)
        name = getattr(function, "__qualname__", None) or getattr(code, "co_name", None)
    if code is None or name is None:
        return None
    return name, Frame(code.co_filename, code.co_firstlineno, name)


_MODULE_CALLS = tuple(
    getattr(torch.nn.Module, name)
    for name in ("__call__", "_wrapped_call_impl", "_call_impl")
    if hasattr(torch.nn.Module, name)
)


@functools.cache
def _torch_dir() -> str:
    return os.path.dirname(torch.__file__) + os.sep


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


class _DynamoWarningFilter(logging.Filter):
    """Reads the recompile-limit WARNING (where its location comes from) while a monitor is
    listening, and swallows Dynamo's multi-line graph-break WARNINGs while a quiet one is.

    A marked test's failure renders the same facts in a few lines at the user's own code;
    letting the originals through would put 40-line dumps in its captured output. An observer
    (an unmarked test) filters nothing: ``caplog``, ``assertLogs`` and the user's handlers see
    the records they see without the plugin.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not _sinks or record.levelno < logging.WARNING:
            return True
        message = str(record.msg)
        if message.startswith("torch._dynamo hit config."):
            self._forward_limit_hit(record)
        if not any(sink.quiet for sink in list(_sinks)):
            return True
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


@contextmanager
def untapped() -> Iterator[None]:
    """Deliver nothing to the sinks while the block runs: its Dynamo work is reported another
    way (strict ``torch.export`` traces with Dynamo, and its errors are export problems, not
    compile errors of the test). Process-wide, like the taps: a compile in another thread
    during the block is not seen either."""
    saved = list(_sinks)
    _sinks.clear()
    try:
        yield
    finally:
        _sinks[:] = [*saved, *(sink for sink in _sinks if sink not in saved)]


def install_taps() -> None:
    """Tap Dynamo now, with no sink yet: graphs compiled from here on are counted wherever
    they run later. Raises ``TorchCompatError`` for a torch that cannot be watched."""
    check_torch()
    _install_taps()


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
