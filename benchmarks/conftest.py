"""The int8-path suite's closing table: per layer shape, DUT/fp32 and DUT/int_mm wall-time ratios.

Tests record their fastest round (and the DUT's simulated time) with :func:`record`; the table
prints at the end of the run, after pytest-benchmark's own tables, only when wall times were
measured (not under ``--benchmark-disable`` or xdist, where nothing is timed). The minimum, not
the median: on a shared machine every other statistic measures the neighbours too.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest
import torch

from asic_backend.sim import host_gemm, host_passes
from tests.accounting import checking_every_graph

DUT_PRESET = "default"  # the DUT row of the ratios (every preset runs the same host code)
#: The marker (registered in pyproject.toml) of a benchmark row a plain (benchmark-disabled) run
#: leaves out: a timed row whose code the rows it keeps already check (an Inductor compile a
#: layer shape, 1.6 s of CPU each).
TIMED_ONLY = "timed_only"


@dataclasses.dataclass
class Row:
    min_s: dict[str, float] = dataclasses.field(default_factory=dict)  # variant -> fastest round
    sim_s: dict[str, float] = dataclasses.field(default_factory=dict)  # preset -> roofline time
    # variant -> fastest round when the variants ran interleaved (test_interleaved): preferred
    interleaved: dict[str, float] = dataclasses.field(default_factory=dict)


_ROWS = pytest.StashKey[dict[str, Row]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A plain run (``--benchmark-disable``, or xdist) checks each benchmark's code, not its
    speed: it deselects the rows marked :data:`TIMED_ONLY`."""
    session = getattr(config, "_benchmarksession", None)  # pytest-benchmark's, made at configure
    if session is not None and not session.disabled:
        return
    left = [item for item in items if item.get_closest_marker(TIMED_ONLY)]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if not item.get_closest_marker(TIMED_ONLY)]


@pytest.fixture(autouse=True)
def _every_mac_accounted() -> Iterator[None]:
    """The suite's MAC invariant (tests/accounting.py) on every graph a benchmark compiles with
    the asic backend: on each graph's first call, compared when the benchmark ends, so no timed
    round runs the eager reference (a compile-time round pays only for copying the inputs)."""
    with checking_every_graph(first_call_only=True):
        yield


def record(
    config: pytest.Config,
    group: str,
    variant: str,
    benchmark: Any,
    *,
    preset: str | None = None,
    sim_time_s: float | None = None,
) -> None:
    """Note the fastest round of ``variant`` (``fp32``, ``int_mm``, ``dut``, ``dut_inductor``) in
    ``group``.

    ``benchmark.stats`` is pytest-benchmark's and is ``None`` when benchmarking is disabled;
    pytest-codspeed's fixture has none: then only the simulated time is kept.
    """
    rows = config.stash.setdefault(_ROWS, {})
    row = rows.setdefault(group, Row())
    stats = getattr(benchmark, "stats", None)
    if stats is not None and (variant != "dut" or preset == DUT_PRESET):
        row.min_s[variant] = stats.stats.min
    if preset is not None and sim_time_s is not None:
        row.sim_s[preset] = sim_time_s


def record_interleaved(config: pytest.Config, group: str, best: dict[str, float]) -> None:
    """Note the fastest round of each variant of ``group`` measured by :func:`best_interleaved`;
    the table prefers these (every variant saw the same machine)."""
    config.stash.setdefault(_ROWS, {}).setdefault(group, Row()).interleaved.update(best)


#: The time one candidate of :func:`best_interleaved` may take over its rounds, once it has run
#: :data:`MIN_ROUNDS` of them: forced ``int_mm`` on an AVX2-only host takes seconds per prefill
#: GEMM, and its best of three rounds is as steady as a millisecond kernel's best of 200.
BUDGET_S = 3.0
MIN_ROUNDS = 3


def best_interleaved(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Best time (s) of each function over ``rounds`` round-robin passes.

    Interleaving makes every candidate see the same machine: on a shared 2-core host a
    neighbour's load (or a slow spell of memory bandwidth, which a decode GEMV is bound by)
    would otherwise land on whichever benchmark ran at that moment. A candidate leaves the
    passes once it has run :data:`MIN_ROUNDS` and spent :data:`BUDGET_S` seconds.
    """
    best = dict.fromkeys(fns, float("inf"))
    spent = dict.fromkeys(fns, 0.0)
    for done in range(rounds):
        for name, fn in fns.items():
            if done >= MIN_ROUNDS and spent[name] >= BUDGET_S:
                continue
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            best[name] = min(best[name], elapsed)
            spent[name] += elapsed
    return best


#: A ratio of the DUT path to its own host GEMM is at least 1.0 where the path runs that GEMM as
#: the bare kernel does, and more. One below is marked, and the table says why, instead of
#: passing for a win. A prefill linear by ``int_mm`` runs its GEMM in tiles, each rescaled while
#: in the CPU's cache (:func:`asic_backend.sim.host_gemm.native_linear_gemm`), and that can
#: be faster than the bare kernel's one call, whose int32 product goes through memory.
BELOW_FLOOR = "†"
FLOOR_NOTE = (
    f"{BELOW_FLOOR} below 1.0: noise or a different baseline (the bare kernel's fresh int32 "
    "accumulator), or, by int_mm from "
    f"{host_gemm.INT_MM_TILE_MIN_ROWS} rows × {host_gemm.INT_MM_TILE_MIN_COLUMNS} outputs on, the "
    "DUT's GEMM in tiles rescaled in the CPU's cache, faster than the bare kernel's one call"
)


def over_gemm(ratio: float) -> str:
    """A DUT/GEMM ratio, marked :data:`BELOW_FLOOR` when under its floor of 1.0 (with a third
    decimal where two would round it up to the floor: ``0.996†``, not ``1.00†``)."""
    if ratio >= 1.0:
        return f"{ratio:.2f}"
    return f"{ratio:.3f}{BELOW_FLOOR}" if f"{ratio:.2f}" == "1.00" else f"{ratio:.2f}{BELOW_FLOOR}"


class _Pair(NamedTuple):
    """A variant's two columns after DUT/GEMM: its time and a ratio of it."""

    variant: str
    time_title: str
    ratio_title: str
    #: The ratio's cell, of the row's times ``t`` and the variant's ``time``.
    ratio: Callable[[dict[str, float], float], str]
    #: Whether every table has the columns (a dash where a row did not time the variant).
    always: bool = False


#: The variants' columns, in their order; a table has those any of its rows timed.
_PAIRS = (
    _Pair("dut_whole", "DUT whole ms", "DUT/whole", lambda t, time: f"{t['dut'] / time:.2f}"),
    _Pair("dut_aten", "DUT aten ms", "DUT aten/GEMM", lambda t, time: over_gemm(time / t["gemm"])),
    _Pair(
        "dut_inductor",
        "DUT ind ms",
        "DUT ind/GEMM",
        lambda t, time: over_gemm(time / t["gemm"]),
        always=True,
    ),
    _Pair("torchao", "TorchAO ms", "DUT/TorchAO", lambda t, time: f"{t['dut'] / time:.2f}"),
)


def ratio_table(rows: dict[str, Row]) -> list[str]:
    """Markdown: one line per group and host GEMM kernel that has all three wall times.

    Interleaved runs name their variants per kernel (``gemm@float32``, ``dut@float32``,
    ``dut_aten@float32``, ``dut_inductor@float32``: the DUT with that kernel forced, with the
    aten kernels' host passes instead of the native ones, compiled with ``host="inductor"``, and
    the kernel alone on the same int8 operands; ``dut_whole@int_mm``: the DUT with its GEMMs in
    one call, not in tiles: ``DUT/whole`` is the tiles' gain), and may have ``torchao``: the
    layer as TorchAO's dynamic int8 under Inductor, whatever the kernel (its GEMMs are
    ``torch._int_mm``'s);
    separately timed runs have ``int_mm`` (raw ``torch._int_mm``), ``dut`` and ``dut_inductor``
    with this host's own kernel.
    """
    presets = sorted({p for row in rows.values() for p in row.sim_s})
    per_kernel = {group: _per_kernel(row) for group, row in rows.items()}
    pairs = [
        pair
        for pair in _PAIRS
        if pair.always or any(pair.variant in t for timed in per_kernel.values() for _, t in timed)
    ]
    head = ["layer (M×K×N)", "host GEMM", "fp32 ms", "GEMM ms", "DUT ms", "DUT/fp32", "DUT/GEMM"]
    head += [title for pair in pairs for title in (pair.time_title, pair.ratio_title)]
    head += ["DUT/best GEMM"]
    head += [f"sim {p} µs" for p in presets]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group, row in rows.items():
        # The fastest exact kernel alone of the group, whichever it is: what the DUT's time is
        # held to on this host.
        best = min((t["gemm"] for _, t in per_kernel[group]), default=0.0)
        for kernel, t in per_kernel[group]:
            cells = [group, kernel, *(_number(t[v] * 1e3) for v in ("fp32", "gemm", "dut"))]
            cells += [f"{t['dut'] / t['fp32']:.2f}", over_gemm(t["dut"] / t["gemm"])]
            for pair in pairs:
                time = t.get(pair.variant)
                cells += [_number(time * 1e3), pair.ratio(t, time)] if time else ["-", "-"]
            cells += [f"{t['dut'] / best:.2f}"]
            cells += [_number(row.sim_s[p] * 1e6) if p in row.sim_s else "-" for p in presets]
            out.append("| " + " | ".join(cells) + " |")
    if any(BELOW_FLOOR in line for line in out[2:]):
        out += ["", FLOOR_NOTE]
    return out if len(out) > 2 else []


def _per_kernel(row: Row) -> list[tuple[str, dict[str, float]]]:
    """``(kernel, {fp32, gemm, dut[, dut_whole, dut_aten, dut_inductor, torchao]})`` per host
    GEMM kernel the row measured."""
    t = row.interleaved
    kernels = [k for k in host_gemm.KERNELS if {"fp32", f"gemm@{k}", f"dut@{k}"} <= t.keys()]
    if kernels:
        return [
            (
                k,
                {
                    "fp32": t["fp32"],
                    "gemm": t[f"gemm@{k}"],
                    "dut": t[f"dut@{k}"],
                    **{
                        v: t[f"{v}@{k}"]
                        for v in ("dut_whole", "dut_aten", "dut_inductor")
                        if f"{v}@{k}" in t
                    },
                    **{v: t[v] for v in ("torchao",) if v in t},
                },
            )
            for k in kernels
        ]
    m = row.min_s
    if not {"fp32", "int_mm", "dut"} <= m.keys():
        return []
    times = {"fp32": m["fp32"], "gemm": m["int_mm"], "dut": m["dut"]}
    if "dut_inductor" in m:
        times["dut_inductor"] = m["dut_inductor"]
    return [(f"{host_gemm.kernel()} (GEMM: raw _int_mm)", times)]


#: TorchAO's Int8Tensor asks for a cache hash it does not have yet: its concern, not the figures.
AO_CACHE_WARNING = "ignore:Int8Tensor does not implement _stable_hash_for_caching:UserWarning"


def torchao_peer(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """A copy of ``model`` as TorchAO's dynamic int8 (per-token activations, per-channel
    weights) compiled with Inductor: the production int8 path on the CPU, the DUT path's peer.
    Skips the test where TorchAO is not installed."""
    ao = pytest.importorskip("torchao.quantization")
    peer = copy.deepcopy(model)
    ao.quantize_(peer, ao.Int8DynamicActivationInt8WeightConfig())
    compiled: Callable[[torch.Tensor], torch.Tensor] = torch.compile(
        peer, backend="inductor", fullgraph=True
    )
    return compiled


def forced_kernel(name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run with host GEMM kernel ``name`` forced
    (:func:`asic_backend.sim.host_gemm.forced`)."""

    def run() -> Any:
        with host_gemm.forced(name):
            return fn()

    return run


def timed_kernels(disabled: bool) -> tuple[str, ...]:
    """The host GEMM kernels a benchmark runs side by side: ``int_mm`` (what a host with an int8
    dot-product unit uses), ``float32`` and, where it builds, ``int16`` (what a host without one
    uses), or only this host's own in a plain (benchmark-disabled) run, where forcing ``int_mm``
    on an AVX2-only CI runner would cost seconds per prefill GEMM and measure nothing."""
    if disabled:
        return (host_gemm.kernel(),)
    return tuple(name for name in host_gemm.available_kernels() if name != "float64")


def smoke_rows(m: int, disabled: bool) -> int:
    """Rows of the activations of a benchmark whose GEMMs are ``torch._int_mm``'s (raw, or
    TorchAO's): all of them, except in a plain (benchmark-disabled) run on a CPU without an int8
    dot-product unit, where ``_int_mm`` has no fast kernel (10-20x a float GEMM's time) and
    nothing is timed: there 8 rows check the same exactness at the same K and N for a fraction
    of the suite's time."""
    return min(m, 8) if disabled and not host_gemm.has_int8_unit() else m


def host_line() -> str:
    """The CPU and host kernel a table was measured with, for its heading."""
    capability = torch.backends.cpu.get_cpu_capability()
    threads = torch.get_num_threads()
    return (
        f"CPU capability {capability}, {threads} thread(s), host GEMM {host_gemm.describe()}, "
        f"host passes {host_passes.describe()}"
    )


def _number(value: float) -> str:
    """3 significant digits, without an exponent: 0.0615, 2.43, 139, 27,400."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's tables
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = ratio_table(config.stash.get(_ROWS, {}))
    if not lines:
        return
    terminalreporter.write_sep("-", f"int8 path: fastest round, DUT = dut[{DUT_PRESET}]")
    terminalreporter.write_line(host_line())
    for line in lines:
        terminalreporter.write_line(line)
