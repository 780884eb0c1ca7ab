"""What the taps tell: the raw records of Dynamo's events, the sinks they are delivered to, and
the compiles in progress on this thread."""

from __future__ import annotations

import dataclasses
import threading
from typing import Protocol

from pytest_nobreak.watch.dynamo.stacks import _callers_of, _merge_resumed
from pytest_nobreak.watch.dynamo.state import CounterView, MetricRecord
from pytest_nobreak.watch.sites import Frame


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


#: How deep in Dynamo's entry point this thread is: only the outermost call counts what Dynamo
#: counted, so a compile nested in another (a backend calling a compiled function) is not
#: counted twice.
_entry = threading.local()


def _dispatch(method: str, event: object) -> None:
    for sink in list(_sinks):
        getattr(sink, method)(event)


def _frame_records() -> list[FrameRecord]:
    """The compiles this thread is in, innermost last."""
    records: list[FrameRecord] | None = getattr(_entry, "records", None)
    if records is None:
        records = _entry.records = []
    return records


def _compiling_frame() -> FrameRecord | None:
    records = getattr(_entry, "records", None)
    return records[-1] if records else None
