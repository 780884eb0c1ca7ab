"""Watch torch.compile regions: the pytest-free core the plugin's hooks delegate to.

>>> import torch, pytest_nobreak
>>> with pytest_nobreak.watch() as report:
...     torch.compile(model, backend="eager")(x)
>>> report.graph_breaks, report.eager_frames
(0, 0)
>>> report.check()            # raises GraphBreakError listing every break, if any

Every compile region that runs inside the block is watched, whatever its backend. The report
is live: its figures can be read while the block runs, and are final once it exits. They come
from the monitor's own taps (what Dynamo and the simulated DUT counted while the block ran),
not from torch's global counters, so code in the block that calls ``torch._dynamo.reset()``
or clears ``torch._dynamo.utils.counters`` cannot zero them.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from asic_backend.notices import host_fallbacks_reported
from pytest_nobreak.watch.compile_report import CompileReport
from pytest_nobreak.watch.events import (
    FRAME_SKIP_REASON,
    HOST_FALLBACK_PREFIX,
    BreakEvent,
    BreakKind,
    ChainLink,
    OtherSite,
)
from pytest_nobreak.watch.sites import Frame, Location, display_path, is_user_file, locate

if TYPE_CHECKING:
    from asic_backend.sim.device import HostFallbackStats
    from pytest_nobreak.watch import dynamo as tc


# Dynamo's wording for a break that made it give up on the whole frame (FRAME_SKIP_REASON), and
# for one after which it compiled what came before and ran the rest of the frame eagerly. Any
# other break split the frame it was logged for, whatever its type (a `skip_frame()` in a nested
# call splits the caller; the nested frame's own skip is logged again when it runs).
_PARTIAL_SKIP_REASON = "Encountered graph break that we cannot resume"
_BACKEND_GB_TYPE = "Backend compiler exception"
_LIMIT_GB_TYPE = "Dynamo recompile limit exceeded"
_SILENT_GB_TYPE = "Silent eager"
#: A hint Dynamo adds to the later breaks of a chain; the chain itself says it.
_EARLIER_BREAK_HINT = "caused by an earlier graph break"


class Monitor:
    """Collects Dynamo's events into a ``CompileReport`` between ``start()`` and ``stop()``.

    ``reset``: start from a clean Dynamo (``torch._dynamo.reset()``, cleared counters and
    compile metrics) and zeroed simulated devices, so nothing compiled before can hide a break.
    Without it the monitor changes no state: the figures count what the block ran, whenever it
    was compiled (``recompiles`` only what it compiled itself).

    ``reports``: whoever started it reports what it sees (a marked test's failure,
    ``watch()``'s ``check()``). Dynamo's multi-line graph-break WARNINGs are then kept from the
    logging handlers (the report says the same in a few lines), and the ASIC backend's
    once-per-process warning about host fallbacks is not issued between ``start()`` and
    ``stop()``, nor spent there. An observer (an unmarked test) leaves both alone.

    ``root``: event paths are relative to it (pytest's rootdir; default: the working directory
    when the monitor starts). ``first_party``: top-level packages that are the user's code
    although installed (see :mod:`pytest_nobreak.watch.sites`).
    """

    def __init__(
        self,
        *,
        reset: bool = True,
        reports: bool = True,
        root: str | None = None,
        first_party: Sequence[str] = (),
    ) -> None:
        self.report = CompileReport()
        self._reset = reset
        self._reports = reports
        self._root = root
        self._first_party = frozenset(first_party)
        self._lock = threading.Lock()
        self._cm: Any = None
        self._notices: Any = None
        self._metrics: list[tc.MetricRecord] = []
        self._limit_hits: list[tuple[tc.RawLimitHit, Location | None]] = []
        self._last_recompile: Location | None = None
        self._skip_compile_ids: set[str | None] = set()
        #: The graphs (``RawGraph``) the block ran, by id.
        self._ran: set[int] = set()
        #: The compiles (``FrameRecord``) whose graphs ran in the block, by id.
        self._frames_ran: set[int] = set()
        #: The compiled functions the block ran eagerly because Dynamo gave up on them.
        self._eager_sites: set[tuple[str, int, str]] = set()
        #: ... and those entered after a compile before the block gave up on them, with the
        #: breaks that compile logged.
        self._eager_entered: dict[tuple[str, int, str], tuple[Any, list[BreakEvent]]] = {}
        #: (compiled function, break) pairs the block ran through.
        self._crossed: set[tuple[object, ...]] = set()
        #: Breaks logged in the block, kept until its end: those of a compile whose graph ran
        #: are counted from the run (with the caller of that run); the others from here.
        self._logged: list[tc.RawGraphBreak] = []

    @property
    def root(self) -> str:
        return self._root or os.getcwd()

    @property
    def quiet(self) -> bool:
        """Whether Dynamo's graph-break WARNINGs are kept from the logging handlers."""
        return self._reports

    def start(self) -> CompileReport:
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.watch import dynamo

        dynamo.check_torch()
        self._root = self.root
        if self._reset:
            dynamo.reset_dynamo()
        self.report._counted = dynamo.CounterView()
        self.report._sync_calls = {}
        self.report._asic.start(reset_devices=self._reset)
        self._cm = dynamo.tapped(self)
        self._cm.__enter__()
        cause = dynamo.silent_eager_now()
        if cause is not None:
            # Already set before the block: record it even if no region runs, since a
            # compile that would run later in the same process is silently disabled too.
            self._add_silent(cause, None, Location())
        if self._reports:
            # Last, so nothing after it can fail and leave it entered. The module is torch-free,
            # but it is imported here, not at the top: plugin.py imports this module.

            self._notices = host_fallbacks_reported()
            self._notices.__enter__()
        return self.report

    def stop(self) -> CompileReport:
        """Remove the taps and finish the report (its figures are final from then on).

        Idempotent: the plugin calls it again at teardown in case the call phase never ran.
        """
        self._exit_notices()
        if self._cm is None:
            return self.report
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.watch import dynamo

        self._cm.__exit__(None, None, None)
        self._cm = None
        report = self.report
        report._asic.stop()
        self._collect_metrics(dynamo)
        self._collect_deferred(dynamo)
        run = report._asic.total
        if run is not None:
            report.run_macs = run.macs + run.host_macs
        self._collect_host_fallbacks()
        self._collect_host_syncs()
        return report

    @contextmanager
    def apart(self) -> Iterator[None]:
        """Count nothing the block does: work done once for many tests (a class, module or
        session fixture, a ``setUpClass`` warm-up) is none of theirs. What it compiles still
        counts in each test that runs it."""
        if self._cm is None:
            yield
            return
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.watch import dynamo

        with dynamo.untapped(), self.report._asic.paused():
            yield

    def _exit_notices(self) -> None:
        notices, self._notices = self._notices, None
        if notices is not None:
            notices.__exit__(None, None, None)

    def _locate(self, stack: Sequence[Frame]) -> Location:
        return locate(stack, self.root, self._first_party)

    def _add(self, event: BreakEvent) -> None:
        # Events arrive from Dynamo (possibly from another thread); keep appends ordered.
        with self._lock:
            self.report.add(event)

    # ----------------------------------------------------------------- Dynamo's events

    def on_frame(self, counted: tc.CounterView) -> None:
        with self._lock:
            report = self.report
            report._counted = counted if report._counted is None else report._counted + counted
        # A compile with the ASIC backend imports the simulator: count from here on, before
        # the compiled graph runs on it.
        report._asic.poll()

    def on_metric(self, record: tc.MetricRecord) -> None:
        with self._lock:
            self._metrics.append(record)
            if record.recompile_reason:
                lines = record.recompile_reason.strip().splitlines()
                self.report.recompile_reasons.append(lines[-1].strip(" -") if lines else "")
                if self.report.recompile_site is None:
                    self.report.recompile_site = self._locate(_frame_of(record.file, record.line))

    def on_graph_break(self, raw: tc.RawGraphBreak) -> None:
        kind = self._break_kind(raw)
        if kind == "graph_break" and raw.frame is not None:
            with self._lock:
                self._logged.append(raw)  # counted where its graph runs (or at the end)
            return
        event = self._break_event(raw, raw.stack)
        with self._lock:
            if kind != "graph_break":
                self._skip_compile_ids.add(raw.compile_id)
            if raw.reason.startswith(FRAME_SKIP_REASON) and raw.frame is not None:
                self._eager_sites.add(raw.frame.site)
            if kind == "partial_fallback":
                self.report._eager_missed += 1
            self.report.add(event)

    def _break_kind(self, raw: tc.RawGraphBreak) -> BreakKind:
        if raw.gb_type == _BACKEND_GB_TYPE:
            return "backend_error"
        if raw.reason.startswith(FRAME_SKIP_REASON):
            return "eager_fallback"
        if raw.reason.startswith(_PARTIAL_SKIP_REASON):
            return "partial_fallback"
        return "graph_break"

    def _break_event(self, raw: tc.RawGraphBreak, stack: Sequence[Frame]) -> BreakEvent:
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.watch import dynamo as tc

        chain = tc.parse_chain(raw.msg)
        if len(chain) == 1:
            # Dynamo's own type, when the message's first line is not it (a StepUnsupported).
            chain = [dataclasses.replace(chain[0], gb_type=raw.gb_type)]
        return chained_event(self._break_kind(raw), chain, self._locate(stack))

    def _cross(self, site: tuple[object, ...], event: BreakEvent) -> None:
        """Count ``event`` once per compiled function it splits (lock held)."""
        key = (site, event.dedupe_key())
        if key not in self._crossed:
            self._crossed.add(key)
            self.report.add(event)

    def on_eager_run(self, raw: tc.RawEagerRun) -> None:
        """A compiled function Dynamo gave up on before this block was entered again: it runs
        eagerly, as that compile decided, whenever it was. Counted at the end, unless Dynamo
        compiled (and gave up on) it again in the block: after a reset, it does."""
        site = raw.frame.site
        if site in self._eager_sites or site in self._eager_entered:
            return
        events = [
            self._break_event(b, stack)
            for b, stack in raw.stacks()
            if b.reason.startswith(FRAME_SKIP_REASON)
        ]
        with self._lock:
            self._eager_entered.setdefault(site, (raw.frame, events))

    def on_graph_run(self, raw: tc.RawGraph) -> None:
        # On every call of every graph: kept cheap after the block's first call of a graph.
        if raw.syncs is not None:
            self._count_syncs(raw.syncs)
        if id(raw) in self._ran:
            return
        callers = raw.callers()
        splits = [
            self._break_event(b, raw.stack_of(b, callers))
            for b in list(raw.frame.breaks)
            if self._break_kind(b) == "graph_break"
        ]
        with self._lock:
            self._ran.add(id(raw))
            self._frames_ran.add(id(raw.frame))
            self.report._graph_keys.setdefault(raw.key, None)
            for event in splits:
                self._cross(raw.frame.site, event)

    def on_compile_error(self, raw: tc.RawCompileError) -> None:
        """An error Dynamo raised to the caller: nothing of the region ran, eagerly or not."""
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.watch import dynamo as tc

        with self._lock:
            self._skip_compile_ids.add(raw.compile_id)
            if raw.counted_as_eager:
                self.report._eager_not_run += 1
        location = self._locate(raw.stack)
        exc_name = raw.exc_type.rsplit(".", 1)[-1]
        chain = tc.parse_chain(raw.msg, raw.text)
        if chain[0].gb_id is None and tc.gb_link(chain[0].gb_type) is None:
            # Not one of Dynamo's graph-break messages (e.g. a backend's own exception).
            lines = [line.strip() for line in raw.text.splitlines() if line.strip()]
            event = BreakEvent(
                kind="compile_error",
                gb_type=exc_name,
                reason=" ".join(lines[:2]),
                **where_fields(location),
            )
        else:
            event = chained_event("compile_error", chain, location)
        self._add(dataclasses.replace(event, detail=raw.exc_type))

    def on_silent_eager(self, raw: tc.RawSilentEager) -> None:
        with self._lock:
            self.report._eager_missed += 1
        # The region is entered through torch's wrappers: the user's line is the one that
        # called it, not a frame of those wrappers.
        stack = list(raw.stack)
        while stack and not is_user_file(stack[-1].file, self._first_party):
            stack.pop()
        self._add_silent(raw.cause, raw.function, self._locate(stack))

    def on_recompile(self, raw: tc.RawRecompile) -> None:
        """Where the user reads a recompile: the definition of what they compiled (a module's
        ``forward``), or where they called it if that is a library's."""
        definition = [raw.definition] if raw.definition is not None else []
        site = self._locate([*raw.stack, *definition])
        with self._lock:
            self._last_recompile = site
            if self.report.recompile_site is None:
                self.report.recompile_site = site

    def _count_syncs(self, raw: tc.RawGraphSyncs) -> None:
        # On every call of a graph with syncs: kept cheap, the events are made at the end.
        calls = self.report._sync_calls
        if calls is None:
            return  # the block ended (another thread's late call)
        entry = calls.get(id(raw))
        if entry is None:
            # Where this call came from: the first call of the graph in this block names it.
            callers = raw.callers()
            with self._lock:
                entry = calls.setdefault(id(raw), [raw, 0, callers])
        with self._lock:
            entry[1] += 1

    def on_limit_hit(self, raw: tc.RawLimitHit) -> None:
        # Dynamo warns while compiling the recompile that hit the limit: the last one seen.
        with self._lock:
            self._limit_hits.append((raw, self._last_recompile))

    def _add_silent(self, cause: str, function: str | None, location: Location) -> None:
        what = f"`{function}`" if function else "compiled regions"
        self._add(
            BreakEvent(
                kind="eager_fallback",
                gb_type=_SILENT_GB_TYPE,
                reason=f"{what} ran eagerly: {cause}",
                hints=(
                    "Remove the stance/disable switch from the code under test, or scope it "
                    "outside the region this test checks.",
                ),
                **where_fields(location),
            )
        )

    # ----------------------------------------------------------------- at the end

    def _collect_metrics(self, tc: Any) -> None:
        """Failed compiles the other taps did not see: backend fallbacks raised while compiling
        the final graph, the recompile limit, errors suppressed into eager runs. At the end,
        since a compile error reaches the entry tap after its metrics record."""
        limit_hits = list(self._limit_hits)
        for m in self._metrics:
            if not m.fail_type or m.compile_id in self._skip_compile_ids:
                continue
            parsed = tc.parse_graph_break_message(m.fail_reason or "")
            location = self._locate(_frame_of(m.file, m.line))
            if parsed.gb_type == _LIMIT_GB_TYPE:
                kind: BreakKind = "recompile_limit"
                if limit_hits:
                    hit, site = limit_hits.pop(0)
                    if site is None and hit.file is not None:
                        site = self._locate(_frame_of(hit.file, hit.line))
                    location = site or location
                    reason = (
                        f"{hit.limit} ({hit.value}) hit; last recompile reason: "
                        f"{hit.last_reason.strip()}"
                    )
                else:
                    reason = parsed.explanation
            elif parsed.gb_type == _BACKEND_GB_TYPE:
                kind, reason = "backend_error", parsed.explanation
            else:
                kind = "eager_fallback"
                # e.g. BackendCompilerFailed: "backend='x' raised:" then the inner exception.
                text = [ln.strip() for ln in (m.fail_reason or m.fail_type).splitlines()]
                reason = parsed.explanation or " ".join(ln for ln in text[:2] if ln)
            gb_type = parsed.gb_type if m.fail_type == "Unsupported" else m.fail_type
            link = tc.gb_link(gb_type)
            self.report.add(
                BreakEvent(
                    kind=kind,
                    gb_type=gb_type,
                    gb_id=tc.gb_id_of_link(link) or parsed.gb_id,
                    reason=reason,
                    hints=parsed.hints,
                    link=link,
                    **where_fields(location),
                )
            )

    def _collect_deferred(self, tc: Any) -> None:
        """The breaks of compiles none of whose graphs ran in the block (a frame whose only
        code before and after a ``print`` is Python), as Dynamo logged them; the functions
        Dynamo had given up on that the block entered."""
        with self._lock:
            logged, self._logged = self._logged, []
        crossed = [
            (b.frame.site, self._break_event(b, b.stack))
            for b in logged
            if b.frame is not None and id(b.frame) not in self._frames_ran
        ]
        with self._lock:
            for site, split in crossed:
                self._cross(site, split)
            for site, (frame, events) in self._eager_entered.items():
                # Entered, then compiled again in the block (after a reset): not eager after all.
                if site not in self._eager_sites and tc.gave_up_on(frame):
                    self._eager_sites.add(site)
                    self.report._eager_missed += 1
                    for event in events:
                        self.report.add(event)
            self._eager_entered = {}

    def _collect_host_fallbacks(self) -> None:
        """One event per (op, reason): a model with dozens of host ops, all for the same reason
        (autograd is live, float64 weights), reads as a few entries, not dozens."""
        groups: dict[tuple[str, str], list[HostFallbackStats]] = {}
        for stats in self.report._asic.sites.values():
            groups.setdefault((stats.site.op, stats.site.reason), []).append(stats)
        # Most host MACs first (stable, so ties keep first-seen order): when the message lists
        # only the first few problems, the costliest ones are the ones shown.
        ordered = sorted(groups.values(), key=lambda group: -sum(s.macs for s in group))
        for first, *others in ordered:
            site = first.site
            # The backend names the user's line and the frame the op was traced in (see
            # asic_backend.lower.fx_nodes.user_frame and origin_frame); the paths are made the
            # user's here, as for every other event, and the owner is the origin's.
            location = self._locate(_host_stack(site))
            self.report.add(
                BreakEvent(
                    kind="host_fallback",
                    gb_type=HOST_FALLBACK_PREFIX + site.op,
                    calls=first.calls + sum(s.calls for s in others),
                    macs=first.macs + sum(s.macs for s in others),
                    detail=first.shape,
                    reason=site.reason,
                    also_at=tuple(
                        OtherSite(self._display(s.site.file), s.site.line, s.calls) for s in others
                    ),
                    **{
                        **where_fields(location),
                        "source": location.source
                        or (site.source if location.line == site.line else None),
                    },
                )
            )

    def _collect_host_syncs(self) -> None:
        """One event per op at each place of the user's code, with the calls that ran it: a
        graph compiled twice (a recompile) or a helper's sync reached from one line is one
        entry."""
        with self._lock:
            ran, self.report._sync_calls = self.report._sync_calls or {}, None
        merged: dict[tuple[object, ...], BreakEvent] = {}
        for graph, calls, callers in ran.values():
            for site in graph.sites:
                location = self._locate([*callers, *site.traced])
                event = BreakEvent(
                    kind="host_sync",
                    gb_type=site.op,
                    reason=(
                        f"the host waits for a device value ({site.form}): on an accelerator "
                        "the device drains its queue, copies the value back and idles until the "
                        "host decides what comes next"
                    ),
                    detail=site.form,
                    calls=site.count * calls,
                    fix=site.fix,
                    **where_fields(location),
                )
                key = event.dedupe_key()
                known = merged.get(key)
                merged[key] = (
                    event
                    if known is None
                    else dataclasses.replace(known, calls=(known.calls or 0) + (event.calls or 0))
                )
        for event in merged.values():
            self.report.add(event)

    def _display(self, file: str | None) -> str | None:
        return None if file is None else display_path(file, self.root)


def _frame_of(file: str | None, line: int | None) -> list[Frame]:
    return [] if file is None else [Frame(file, line)]


def _host_stack(site: Any) -> list[Frame]:
    """A host fallback's user line, then the frame its op was traced in when that is another."""
    stack = _frame_of(site.file, site.line)
    origin = getattr(site, "origin_file", None)
    if origin is not None and (origin, site.origin_line) != (site.file, site.line):
        stack.append(Frame(origin, site.origin_line, getattr(site, "origin_function", None)))
    return stack


def where_fields(location: Location) -> dict[str, Any]:
    """The location fields of a ``BreakEvent``."""
    return {
        "file": location.file,
        "line": location.line,
        "source": location.source,
        "call_sites": location.call_sites,
        "library": location.library,
        "owner": location.owner,
    }


def chained_event(
    kind: BreakKind, chain: Sequence[tc.ParsedMessage], location: Location
) -> BreakEvent:
    """The event of a break and the breaks it caused (``chain``, root cause first): about the
    root cause, which is what the user fixes; the kind is what the last one made Dynamo do."""
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from pytest_nobreak.watch import dynamo as tc

    root = chain[0]
    link = tc.gb_link(root.gb_type)
    links = tuple(ChainLink(_gb_id(tc, part), part.gb_type, part.explanation) for part in chain)
    # The root's first hint, then the first of each later break (how to live with it), then
    # the root's other hints; "caused by an earlier graph break" is what the chain shows.
    hints = [*root.hints[:1], *(h for part in chain[1:] for h in part.hints[:1]), *root.hints[1:]]
    return BreakEvent(
        kind=kind,
        gb_type=root.gb_type,
        gb_id=tc.gb_id_of_link(link) or root.gb_id,
        reason=root.explanation or root.gb_type,
        hints=tuple(dict.fromkeys(h for h in hints if _EARLIER_BREAK_HINT not in h)),
        link=link,
        chain=links if len(links) > 1 else (),
        **where_fields(location),
    )


def _gb_id(tc: Any, part: tc.ParsedMessage) -> str | None:
    return part.gb_id or tc.gb_id_of_link(tc.gb_link(part.gb_type))


@contextmanager
def watch(*, reset: bool = True, first_party: Sequence[str] = ()) -> Iterator[CompileReport]:
    """Watch every torch.compile region that runs in the block.

    ``reset=True`` (the default) starts from a clean Dynamo state, so cached code from earlier
    compiles cannot hide a break; ``reset=False`` changes no state, and the figures count what
    the block ran, whenever it was compiled (``recompiles``: what it compiled itself). Call
    ``report.check()`` afterwards to raise on any break (``report.check(scope="own")``: only
    on those in the user's own code, where ``first_party`` names installed packages that are
    theirs too).
    """
    monitor = Monitor(reset=reset, reports=True, first_party=first_party)
    report = monitor.start()
    try:
        yield report
    finally:
        monitor.stop()
