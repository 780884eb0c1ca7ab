"""What one watched block compiled, as figures and events: :class:`CompileReport`, and the
error a marked test fails with."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_nobreak.watch.asic_counts import AsicCounts, minus
from pytest_nobreak.watch.events import (
    EXPORT_KINDS,
    FOREIGN_KINDS,
    SCOPES,
    BreakEvent,
    Figures,
    GemmRecord,
    Scope,
)
from pytest_nobreak.watch.render import render_failure
from pytest_nobreak.watch.sites import Location

if TYPE_CHECKING:
    from asic_backend.sim.device import CounterSnapshot
    from pytest_nobreak.watch import dynamo as tc


class GraphBreakError(AssertionError):
    """A watched region graph-broke or fell back to eager; the message lists every break."""

    def __init__(self, message: str, breaks: Sequence[BreakEvent]) -> None:
        super().__init__(message)
        self.breaks = tuple(breaks)


@dataclasses.dataclass
class CompileReport:
    """Everything the compile regions of one watched block did.

    Attributes are live while the block runs. ``breaks`` holds every problem, deduplicated in
    order of first appearance; ``counts`` how often each was seen. ``run_macs`` is set when the
    block ends: the MACs (DUT and host) of everything it ran, what a host fallback's MACs are
    a share of in the failure message.
    """

    events: list[BreakEvent] = dataclasses.field(default_factory=list)
    counts: dict[tuple[object, ...], int] = dataclasses.field(default_factory=dict)
    recompile_reasons: list[str] = dataclasses.field(default_factory=list)
    recompile_site: Location | None = None
    run_macs: int | None = None
    #: How many export checks (``nobreak_export``, ``export_check``) the block ran; their
    #: problems are among ``events``.
    exports: int = 0
    #: What Dynamo counted for the frames it was asked to compile in the block.
    _counted: tc.CounterView | None = None
    #: What ran on the simulated DUT in the block (``None`` until the simulator is imported) ...
    _asic: AsicCounts = dataclasses.field(default_factory=AsicCounts)
    #: ... less the repeated calls a benchmark made (see ``discount_asic``).
    _asic_discount: CounterSnapshot | None = None
    #: Eager runs Dynamo's frame counters miss (the rest of a frame after a break it could not
    #: resume from, a region entered under an eager stance) ...
    _eager_missed: int = 0
    #: ... and failed frames they count that never ran (the error reached the caller).
    _eager_not_run: int = 0
    #: id(graph) -> [graph, calls, callers] of the compiled graphs with host syncs the block
    #: ran, while it runs (``None`` once their events are made, or before the block starts).
    _sync_calls: dict[int, list[Any]] | None = None
    #: The keys of the graphs the block ran (``dynamo.RawGraph.key``), in order.
    _graph_keys: dict[tuple[object, ...], None] = dataclasses.field(default_factory=dict)

    # ----------------------------------------------------------------- figures

    @property
    def graphs(self) -> int:
        """Graphs the block ran, whenever they were compiled: one per compiled function and
        set of ops (a recompile of the same code into the same ops, such as a dynamic-shape
        graph after a static one, is the same graph; each piece a break splits off is one)."""
        return len(self._graph_keys)

    @property
    def eager_frames(self) -> int:
        """Frames that ran eagerly, whole or in part: every skipped frame, the rest of a frame
        after a break Dynamo could not resume from, and every region entered under an eager
        stance. A frame whose compile error reached the caller did not run: not counted."""
        counted = self._counted.eager_frames if self._counted is not None else 0
        return max(counted - self._eager_not_run, 0) + self._eager_missed

    @property
    def graph_breaks(self) -> int:
        """Breaks that split a graph which the block ran through, whenever they were compiled:
        each break once per compiled function it splits (the events, not
        ``counters["graph_break"]``, which misses data-dependent jumps)."""
        return sum(self.counts[e.dedupe_key()] for e in self.events if e.kind == "graph_break")

    @property
    def recompiles(self) -> int:
        return len(self.recompile_reasons)

    @property
    def host_syncs(self) -> int:
        """Device→host round trips the block's compiled graphs executed (``.item()``, a
        data-dependent shape; see :mod:`asic_backend.lower.host_syncs`): each sync node of a graph,
        once per call of the graph. Live; each one is an event once the block ends."""
        if self._sync_calls is not None:  # still running: what the graphs have run so far
            calls = list(self._sync_calls.values())
            return sum(site.count * n for graph, n, _ in calls for site in graph.sites)
        return sum(e.calls or 0 for e in self.events if e.kind == "host_sync")

    @property
    def foreign_breaks(self) -> int:
        """Breaks and fallbacks (:data:`~pytest_nobreak.watch.events.FOREIGN_KINDS`) that happened
        in a library's code, not the user's (see :func:`pytest_nobreak.watch.sites.owner_of`)."""
        return sum(
            self.counts[e.dedupe_key()]
            for e in self.events
            if e.kind in FOREIGN_KINDS and not e.own
        )

    @property
    def export_problems(self) -> int | None:
        """Problems of the block's exported programs (:data:`~pytest_nobreak.watch.events.
        EXPORT_KINDS`); ``None`` when it exported nothing."""
        return self._count_kinds(EXPORT_KINDS) if self.exports else None

    @property
    def specialized_dims(self) -> int | None:
        """Dimensions declared dynamic that an exported program made static or narrowed."""
        return self._count_kinds(("specialized_dim",)) if self.exports else None

    def _count_kinds(self, kinds: Sequence[str]) -> int:
        return sum(self.counts[e.dedupe_key()] for e in self.events if e.kind in kinds)

    @property
    def breaks(self) -> tuple[BreakEvent, ...]:
        return tuple(self.events)

    def add_export(self, export: CompileReport) -> None:
        """Take in the problems of one export check (an ``ExportReport``). The host fallbacks
        of its DUT run are left out: this block counted them itself, from the devices."""
        for event in export.events:
            if event.kind == "host_fallback":
                continue
            for _ in range(export.counts[event.dedupe_key()]):
                self.add(event)
        self.exports += 1

    @property
    def asic(self) -> CounterSnapshot | None:
        """This block's ASIC counters (DUT ops, host fallbacks, DUT and host MACs, cycles);
        ``None`` when the simulator was never imported."""
        total = self._asic.total
        if total is None or self._asic_discount is None:
            return total
        return minus(total, self._asic_discount)

    def discount_asic(self, counters: CounterSnapshot) -> None:
        """Leave ``counters`` out of this report's ASIC figures.

        A benchmark calls the model many times; its figures (what the baseline gates on) must be
        those of one call whatever the number of rounds, so the repeated calls are discounted.
        """
        discount = self._asic_discount
        self._asic_discount = counters if discount is None else discount + counters

    def gemms(self) -> tuple[GemmRecord, ...]:
        """The DUT GEMMs of the block, one record per device, family and shape."""
        return tuple(
            GemmRecord.from_cost(key, family, cost, calls)
            for (key, family, cost), calls in self._asic.gemms.items()
        )

    def figures(self) -> Figures:
        core = Figures(
            graphs=self.graphs,
            graph_breaks=self.graph_breaks,
            eager_frames=self.eager_frames,
            recompiles=self.recompiles,
            host_syncs=self.host_syncs,
            foreign_breaks=self.foreign_breaks,
            export_problems=self.export_problems,
            specialized_dims=self.specialized_dims,
        )
        asic = self.asic
        if asic is None or not (asic.dut_ops or asic.host_fallbacks or asic.syncs):
            return core  # the ASIC never ran: its figures are "not measured", not zero
        return dataclasses.replace(
            core,
            dut_ops=asic.dut_ops,
            host_fallbacks=asic.host_fallbacks,
            macs=asic.macs,
            host_macs=asic.host_macs,
            cycles=asic.cycles,
            syncs=asic.syncs,
        )

    # ----------------------------------------------------------------- verdict

    def problems(
        self,
        *,
        allow: Sequence[str | re.Pattern[str]] = (),
        max_recompiles: int | None = None,
        allow_host_fallback: bool = False,
        max_host_syncs: int | None = None,
        scope: Scope = "all",
    ) -> list[BreakEvent]:
        """The breaks that fail a check with these options, in order.

        Host syncs are problems only with ``max_host_syncs``, and only when the syncs the
        block executed (those ``allow`` does not match) are more than that: then each of them
        is listed. ``scope="own"`` leaves out every problem whose owner is a library (the
        recompile gate counts compiles, not a place in code, and stays).
        """
        patterns = [re.compile(p) if isinstance(p, str) else p for p in allow]
        out: list[BreakEvent] = []
        syncs: list[BreakEvent] = []
        for event in self.events:
            if scope == "own" and not event.own:
                continue
            if event.kind == "host_fallback" and allow_host_fallback:
                continue
            if any(p.search(allow_text(event)) for p in patterns):
                continue
            (syncs if event.kind == "host_sync" else out).append(event)
        if max_host_syncs is not None and sum(e.calls or 0 for e in syncs) > max_host_syncs:
            out.extend(syncs)
        if max_recompiles is not None and self.recompiles > max_recompiles:
            site = self.recompile_site or Location()
            out.append(
                BreakEvent(
                    kind="recompile",
                    gb_type=f"{self.recompiles} recompiles (max_recompiles={max_recompiles})",
                    file=site.file,
                    line=site.line,
                    source=site.source,
                    reason="; ".join(dict.fromkeys(self.recompile_reasons))[:400],
                    hints=("Mark the varying dimension dynamic or pass dynamic=True.",),
                    call_sites=site.call_sites,
                    library=site.library,
                    owner=site.owner,
                )
            )
        return out

    def check(
        self,
        *,
        allow: Sequence[str | re.Pattern[str]] = (),
        max_recompiles: int | None = None,
        allow_host_fallback: bool = False,
        max_host_syncs: int | None = None,
        scope: Scope = "all",
        title: str = "torch.compile did not run as whole graphs",
    ) -> None:
        """Raise ``GraphBreakError`` listing every break not allowed by the options; its
        message says how to allow them with these same options.

        Host syncs fail it only with ``max_host_syncs=N``, when the block executed more than
        ``N`` (``0``: any sync fails). ``scope="own"``: only problems in the user's own code
        fail it (``watch(first_party=...)`` names packages that count as theirs); the others
        stay in ``report.breaks`` with their ``owner``.
        """
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(map(repr, SCOPES))}, got {scope!r}")
        if max_host_syncs is not None and (
            isinstance(max_host_syncs, bool)
            or not isinstance(max_host_syncs, int)
            or max_host_syncs < 0
        ):
            raise TypeError(f"max_host_syncs must be a non-negative int, got {max_host_syncs!r}")
        options: dict[str, Any] = {
            "allow": allow,
            "max_recompiles": max_recompiles,
            "allow_host_fallback": allow_host_fallback,
            "max_host_syncs": max_host_syncs,
        }
        problems = self.problems(**options, scope=scope)
        if problems:
            theirs = self.theirs(**options) if scope == "own" else {}
            message = self.render(problems, title=title, spelling="check", theirs=theirs)
            raise GraphBreakError(message, problems)

    def theirs(self, **options: Any) -> dict[str, int]:
        """The problems ``scope="own"`` leaves out under these options of :meth:`problems`,
        counted by owner (the library's name), the largest first."""
        out: dict[str, int] = {}
        failing = self.problems(**options, scope="own")
        for event in self.problems(**options, scope="all"):
            if event not in failing:
                owner = event.owned_by
                out[owner] = out.get(owner, 0) + self.counts.get(event.dedupe_key(), 1)
        return dict(sorted(out.items(), key=lambda item: (-item[1], item[0])))

    def render(
        self,
        problems: Sequence[BreakEvent],
        *,
        title: str,
        spelling: str = "marker",
        theirs: Mapping[str, int] | None = None,
    ) -> str:
        """The failure message listing ``problems`` (see :func:`render.render_failure`);
        ``spelling`` of the options it suggests: ``"marker"`` or ``"check"``; ``theirs``: the
        problems a ``scope="own"`` verdict left out, by owner (:meth:`theirs`)."""
        return render_failure(
            title=title,
            figures=self.figures(),
            problems=problems,
            counts=[self.counts.get(p.dedupe_key(), 1) for p in problems],
            run_macs=self.run_macs,
            spelling=spelling,
            theirs=theirs or {},
        )

    # ----------------------------------------------------------------- collection

    def add(self, event: BreakEvent) -> None:
        key = event.dedupe_key()
        if key not in self.counts:
            self.events.append(event)
            self.counts[key] = 0
        self.counts[key] += 1


def allow_text(event: BreakEvent) -> str:
    """What an ``allow=[regex]`` pattern is searched in: ids, types, reason and location.

    Every break of a chain is in it, so allowing the root cause allows what it caused.
    """
    ids = " ".join(link.label for link in event.chain) or event.gb_id or ""
    types = " ".join(dict.fromkeys([event.gb_type, *(link.gb_type for link in event.chain)]))
    return f"{ids} {types}: {event.reason} ({event.location})"
