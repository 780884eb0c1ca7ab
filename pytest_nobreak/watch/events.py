"""What a watched block produced: break events and the per-test integer figures.

These two records are the project's data model. The failure message, the JSON report, the
baseline file and the JUnit properties are all rendered from them, so their field names are the
schema of the reports and live only here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pytest_nobreak.watch.fixes import fix_for

BreakKind = Literal[
    "graph_break",  # the frame was split; both halves still compiled
    "eager_fallback",  # a whole frame ran eagerly (skip, loop break, silent stance)
    "partial_fallback",  # Dynamo could not resume after a break: the rest of the frame ran eagerly
    "backend_error",  # the backend compiler failed and Dynamo fell back (gb0219, the seed)
    "recompile_limit",  # the recompile limit was hit; unmatched inputs now run eagerly
    "recompile",  # more recompiles than the marker's max_recompiles allows
    "host_fallback",  # under the ASIC backend, a matmul-class op ran on the host, not the DUT
    "compile_error",  # Dynamo raised to the caller (fullgraph, fake-tensor error): nothing ran
    "host_sync",  # a compiled graph made the host wait for a device value (.item(), a mask)
    "export_error",  # torch.export raised in a mode (strict or non-strict)
    "export_unsound",  # draft_export had to guess (data-dependent value, fake kernel, guard)
    "specialized_dim",  # a dimension declared dynamic came out static or narrowed
    "export_mismatch",  # strict and non-strict programs (or a program and eager) disagree
    "export_sync",  # an exported program makes the host wait for a device value (.item())
]
BREAK_KINDS: tuple[str, ...] = get_args(BreakKind)

CORE_FIGURES = (
    "graphs",
    "graph_breaks",
    "eager_frames",
    "recompiles",
    "host_syncs",
    "foreign_breaks",
    "export_problems",
    "specialized_dims",
)
#: The figures of a test's exported programs: ``None`` (not 0) in a test that exported nothing,
#: so reports show them only where a test exported.
EXPORT_FIGURES = ("export_problems", "specialized_dims")
#: The core figures every entry has. ``host_syncs`` and ``foreign_breaks`` came later: a
#: baseline or report written before them lacks them, and there they are "not measured"
#: (``None``), never zero.
REQUIRED_CORE_FIGURES = ("graphs", "graph_breaks", "eager_frames", "recompiles")
ASIC_FIGURES = ("dut_ops", "host_fallbacks", "macs", "host_macs", "cycles", "syncs")
#: The ASIC figures every ASIC entry has. ``host_macs`` and ``syncs`` came later: a baseline or
#: report written before them lacks them, and there they are "not measured" (``None``), never 0.
REQUIRED_ASIC_FIGURES = ("dut_ops", "host_fallbacks", "macs", "cycles")
ALL_FIGURES = CORE_FIGURES + ASIC_FIGURES
#: ``BreakEvent.gb_type`` of a host fallback is this prefix and the op (``Host fallback: conv2d``).
HOST_FALLBACK_PREFIX = "Host fallback: "
#: Dynamo's reason for a break that made it give up on the whole frame (it runs eagerly).
FRAME_SKIP_REASON = "Failed to handle graph break gracefully"
#: The kinds whose events count the calls that ran them (``BreakEvent.calls``).
COUNTED_KINDS = ("host_fallback", "host_sync")
#: ``BreakEvent.owner`` of a problem in the user's own code (see :mod:`pytest_nobreak.watch.sites`);
#: any other owner is the name of the library it happened in (``transformers``, ``torch``).
OWN = "own"
#: The verdict's scope: fail on every problem, or only on those whose owner is :data:`OWN`.
Scope = Literal["all", "own"]
SCOPES: tuple[str, ...] = get_args(Scope)
#: The problems of an exported program (:mod:`pytest_nobreak.watch.exporting`), which
#: ``export_problems`` counts (``specialized_dims`` counts the ``specialized_dim`` ones again).
EXPORT_KINDS = (
    "export_error",
    "export_unsound",
    "specialized_dim",
    "export_mismatch",
    "export_sync",
)
#: The kinds ``foreign_breaks`` counts: every break and fallback of Dynamo's. Host fallbacks and
#: host syncs have figures of their own; a recompile gate is about inputs, not a place in code.
FOREIGN_KINDS = tuple(
    k for k in BREAK_KINDS if k not in (*COUNTED_KINDS, *EXPORT_KINDS, "recompile")
)
_GB_ID = re.compile(r"GB\d+")
#: The op families the DUT's share of MACs is shown by (``asic_backend.sim.device.GEMM_FAMILIES``,
#: restated because this module must not import the simulator, which imports torch).
OP_FAMILIES = ("matmul", "bmm", "conv")
_BATCHED = ("attention", "bmm", "mha", "encoder_layer", "transformer")


def op_family(op: str) -> str:
    """The family of a host-fallback op, by its name (``conv2d`` → ``conv``; attention and
    batched products → ``bmm``; every other matmul-class op → ``matmul``)."""
    name = op.lower()
    if "conv" in name:
        return "conv"
    if any(part in name for part in _BATCHED):
        return "bmm"
    return "matmul"


@dataclasses.dataclass(frozen=True)
class CallSite:
    """A line of the user's code on the way to a break: a call that led to it."""

    file: str
    line: int | None
    source: str | None = None


@dataclasses.dataclass(frozen=True)
class ChainLink:
    """One break of a chain: Dynamo hit ``gb_type`` while handling the break before it."""

    gb_id: str | None
    gb_type: str
    reason: str = ""

    @property
    def label(self) -> str:
        """How the chain names it (and the JSON report stores it): its id, else its type."""
        return self.gb_id or self.gb_type

    @classmethod
    def from_label(cls, label: str) -> ChainLink:
        """The link a JSON report's ``chain`` entry stands for."""
        return cls(gb_id=label if _GB_ID.fullmatch(label) else None, gb_type=label)


@dataclasses.dataclass(frozen=True)
class OtherSite:
    """Another place in the user's code where the same host fallback (op and reason) ran."""

    file: str | None
    line: int | None
    calls: int = 1


@dataclasses.dataclass(frozen=True)
class BreakEvent:
    """One reason a watched region did not run as one compiled graph.

    ``file``/``line`` point at the user's code (the innermost user frame Dynamo reported),
    relative to the rootdir, ``source`` is that line's text, ``reason`` the one-line explanation
    and ``hints`` Dynamo's hints, in order. ``call_sites`` are the user's lines that led there,
    innermost first; ``library`` names the library frame the break happened in, when it was not
    the user's code (``file``/``line`` is then the nearest user frame). ``owner`` is whose code
    it happened in: :data:`OWN` or a library's name (:func:`pytest_nobreak.watch.sites.owner_of`);
    ``None`` in a report written before owners were recorded.

    A break Dynamo hit while handling another one has a ``chain``, root cause first: the event
    is about the root (``gb_id``, ``gb_type``, ``reason`` and ``link`` are the root's) and the
    kind is what the last one made Dynamo do.

    A ``host_fallback`` event stands for every site where one op ran on the host for one reason:
    ``file``/``line`` is the first of them, ``also_at`` the others; ``calls`` and ``macs`` are
    the calls and host MACs of all of them, and ``detail`` the operand shapes of the first call.
    A ``host_sync`` event is one place of the user's code where a compiled graph made the host
    wait for a device value: ``gb_type`` is the op as the user wrote it (``Tensor.item``),
    ``calls`` how many times it ran (each a device→host round trip) and ``detail`` the form
    that made it one (``data-dependent scalar``). Other kinds leave these ``None``/empty.
    """

    kind: BreakKind
    gb_type: str
    gb_id: str | None = None
    file: str | None = None
    line: int | None = None
    source: str | None = None
    reason: str = ""
    hints: tuple[str, ...] = ()
    link: str | None = None
    calls: int | None = None
    macs: int | None = None
    detail: str | None = None
    also_at: tuple[OtherSite, ...] = ()
    chain: tuple[ChainLink, ...] = ()
    call_sites: tuple[CallSite, ...] = ()
    library: str | None = None
    owner: str | None = OWN
    #: The source lines around ``line`` (``context_start`` is the first one's number), for the
    #: HTML report, which may be rendered where the sources are not (a merged CI report).
    context: tuple[str, ...] = ()
    context_start: int | None = None
    #: The change that removes this break (:func:`pytest_nobreak.watch.fixes.fix_for`): a rewrite of
    #: the user's line, or the fix's template; None when the table has none. Made from the
    #: event when not given, so it survives the trip through JSON (which drops the source).
    fix: str | None = None

    def __post_init__(self) -> None:
        if self.fix is None:
            object.__setattr__(self, "fix", fix_for(self.gb_id, self.source, self.reason))

    @property
    def ids(self) -> str:
        """The id to show: ``GB0025 → GB0066`` for a chain, else the id (empty if none)."""
        if self.chain:
            return " → ".join(link.label for link in self.chain)
        return self.gb_id or ""

    @property
    def title(self) -> str:
        """What the event is about, after its kind's label: the op of a host fallback (the label
        already says it ran on the host), the Dynamo break type otherwise."""
        if self.kind == "host_fallback" and self.gb_type.startswith(HOST_FALLBACK_PREFIX):
            return self.gb_type[len(HOST_FALLBACK_PREFIX) :]
        return self.gb_type

    @property
    def own(self) -> bool:
        """Whether the user's own code is where it happened (an unknown owner counts as theirs:
        a narrower scope must never hide what it cannot attribute)."""
        return self.owner in (OWN, None)

    @property
    def owned_by(self) -> str:
        """The owner as reports group by it: :data:`OWN` for the user's (an unknown owner
        included), else the library's name."""
        return OWN if self.own else str(self.owner)

    @property
    def location(self) -> str:
        if self.file is None:
            return "<unknown location>"
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    def site_key(self) -> tuple[object, ...]:
        """What makes two events the same break, whatever the call sites that led to it."""
        chain = tuple(link.label for link in self.chain)
        return (self.kind, self.gb_type, chain, self.file, self.line, self.reason)

    def dedupe_key(self) -> tuple[object, ...]:
        """Repeats of one break are counted per call site (a helper called from three lines is
        three entries, each with its count)."""
        sites = tuple((site.file, site.line) for site in self.call_sites)
        return (*self.site_key(), sites)

    def to_json(self) -> dict[str, Any]:
        """The event as it appears under ``breaks`` in the JSON report.

        A host fallback adds ``calls`` and ``macs`` (host MACs), summed over all its sites, the
        first call's operand shapes ``detail`` and its other sites ``also_at``; a host sync
        ``calls`` and its form ``detail``. A
        chained break adds ``chain`` (its ids, root first), an export problem ``detail`` (its
        modes), a break reached through the user's
        calls ``call_sites`` (innermost first), one inside a library ``library``, and one the
        fixes table knows ``fix`` (:mod:`pytest_nobreak.watch.fixes`). ``owner`` is there when
        known: ``"own"`` or the library's name. The user's ``source`` line,
        Dynamo's ``hints`` and docs ``link``, and the ``context`` lines around the user's line
        (``{"start": n, "lines": [...]}``) are there when known, for the HTML report.
        """
        out: dict[str, Any] = {
            "kind": self.kind,
            "gb_id": self.gb_id,
            "gb_type": self.gb_type,
            "file": self.file,
            "line": self.line,
            "reason": self.reason,
        }
        if self.kind in COUNTED_KINDS:
            out["calls"] = self.calls
            if self.kind == "host_fallback":
                out["macs"] = self.macs
            if self.detail:
                out["detail"] = self.detail
            if self.also_at:
                out["also_at"] = [
                    {"file": s.file, "line": s.line, "calls": s.calls} for s in self.also_at
                ]
        if self.kind in EXPORT_KINDS and self.detail:
            out["detail"] = self.detail  # the export modes it happened in
        if self.chain:
            out["chain"] = [link.label for link in self.chain]
        if self.library:
            out["library"] = self.library
        if self.owner is not None:
            out["owner"] = self.owner
        if self.fix:
            out["fix"] = self.fix
        if self.source is not None:
            out["source"] = self.source
        if self.hints:
            out["hints"] = list(self.hints)
        if self.link:
            out["link"] = self.link
        if self.context and self.context_start is not None:
            out["context"] = {"start": self.context_start, "lines": list(self.context)}
        if self.call_sites:
            out["call_sites"] = [_site_json(s) for s in self.call_sites]
        return out


def _site_json(site: CallSite) -> dict[str, Any]:
    out: dict[str, Any] = {"file": site.file, "line": site.line}
    if site.source is not None:
        out["source"] = site.source
    return out


@dataclasses.dataclass(frozen=True)
class GemmRecord:
    """GEMMs of one shape and family that a test ran on one simulated device: how many, and
    what each costs (:class:`asic_backend.sim.cycles.GemmCost`'s figures). The HTML report's
    per-family share of MACs, per-test utilization and roofline points come from these."""

    device: str
    family: str
    m: int
    k: int
    n: int
    calls: int
    macs: int  # per call
    cycles: int  # per call
    utilization: float
    mapping_efficiency: float
    compute_utilization: float
    arithmetic_intensity: float
    attained_ops_per_s: float
    bound: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_cost(cls, device: str, family: str, cost: Any, calls: int) -> GemmRecord:
        """The record of ``calls`` GEMMs of one :class:`asic_backend.sim.cycles.GemmCost` (read by
        attribute: this module does not import the simulator)."""
        figures = {
            field.name: getattr(cost, field.name)
            for field in dataclasses.fields(cls)
            if field.name not in ("device", "family", "calls")
        }
        return cls(device=device, family=family, calls=calls, **figures)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> GemmRecord:
        """Raises ``ValueError`` when a field is missing or of the wrong type."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: a gemm must be an object, not {data!r}")
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            value = data.get(field.name)
            kind: type[Any] | tuple[type[Any], ...] = _GEMM_TYPES[str(field.type)]
            number = isinstance(value, (int, float)) and not isinstance(value, str)
            if (
                not isinstance(value, kind)
                or isinstance(value, bool)
                or (number and not (math.isfinite(value) and value >= 0))
            ):
                shown = f"{field.type} >= 0" if field.type != "str" else "str"
                problem = f"gemm {field.name!r} must be {shown}, not {value!r}"
                raise ValueError(f"{where}: {problem}")
            values[field.name] = float(value) if field.type == "float" else value
        return cls(**values)


_GEMM_TYPES: dict[str, type[Any] | tuple[type[Any], ...]] = {
    "str": str,
    "int": int,
    "float": (int, float),
}


@dataclasses.dataclass(frozen=True)
class Figures:
    """The integer figures of one test: what the baseline stores and CI gates on.

    Which way each figure should move is ``baseline.BETTER`` (only ``dut_ops`` is "higher is
    better"). ASIC figures are ``None`` when the test ran no ASIC backend; ``macs`` are the MACs
    the DUT did, ``host_macs`` those of its host fallbacks (``None`` alone in an entry written
    before that figure existed); ``syncs`` the host syncs the DUT stalled for (each adds
    ``AsicConfig.sync_cycles`` to ``cycles``). ``host_syncs`` are the device→host round trips
    the test's compiled graphs executed, ``foreign_breaks`` the breaks and fallbacks
    (:data:`FOREIGN_KINDS`) whose owner is a library, not the user's code (each ``None`` alone
    in an entry written before it existed). ``export_problems`` are the problems of the test's
    exported programs (:data:`EXPORT_KINDS`), ``specialized_dims`` the dynamic dimensions among
    them that came out static or narrowed; both ``None`` in a test that exported nothing.
    """

    graphs: int = 0
    graph_breaks: int = 0
    eager_frames: int = 0
    recompiles: int = 0
    host_syncs: int | None = None
    foreign_breaks: int | None = None
    export_problems: int | None = None
    specialized_dims: int | None = None
    dut_ops: int | None = None
    host_fallbacks: int | None = None
    macs: int | None = None
    host_macs: int | None = None
    cycles: int | None = None
    syncs: int | None = None

    def core(self) -> dict[str, int]:
        """The figures every watched test has (``host_syncs``, ``foreign_breaks`` and the
        export figures left out where not measured)."""
        return {
            name: getattr(self, name) for name in CORE_FIGURES if getattr(self, name) is not None
        }

    def asic(self) -> dict[str, int] | None:
        """The ASIC figures that were measured; ``None`` when the test ran no ASIC backend."""
        if self.dut_ops is None:
            return None
        out = {}
        for name in ASIC_FIGURES:
            value = getattr(self, name)
            if value is None and name not in REQUIRED_ASIC_FIGURES:
                continue  # an older entry: not measured, so it must not read as 0
            out[name] = int(value or 0)
        return out

    @property
    def dut_share(self) -> float | None:
        """The share of the MACs that ran on the DUT; ``None`` when not measured or no MACs."""
        if self.macs is None or self.host_macs is None:
            return None
        total = self.macs + self.host_macs
        return self.macs / total if total else None

    def as_dict(self) -> dict[str, int]:
        """Every figure that was measured, flat (the baseline entry)."""
        out = self.core()
        out.update(self.asic() or {})
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, int]) -> Figures:
        """The figures of :meth:`as_dict` output (unknown names are ignored)."""
        return cls(**{k: int(v) for k, v in data.items() if k in ALL_FIGURES})
