"""The int8-path suite's closing table: per layer shape, DUT/fp32 and DUT/int_mm wall-time ratios.

Tests record their fastest round (and the DUT's simulated time) with :func:`record`; the table
prints at the end of the run, after pytest-benchmark's own tables, only when wall times were
measured (not under ``--benchmark-disable`` or xdist, where nothing is timed). The minimum, not
the median: on a shared machine every other statistic measures the neighbours too.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

DUT_PRESET = "default"  # the DUT row of the ratios (every preset runs the same host code)


@dataclasses.dataclass
class Row:
    min_s: dict[str, float] = dataclasses.field(default_factory=dict)  # variant -> fastest round
    sim_s: dict[str, float] = dataclasses.field(default_factory=dict)  # preset -> roofline time
    # variant -> fastest round when the variants ran interleaved (test_interleaved): preferred
    interleaved: dict[str, float] = dataclasses.field(default_factory=dict)


_ROWS = pytest.StashKey[dict[str, Row]]()


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


def best_interleaved(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Best time (s) of each function over ``rounds`` round-robin passes.

    Interleaving makes every candidate see the same machine: on a shared 2-core host a
    neighbour's load (or a slow spell of memory bandwidth, which a decode GEMV is bound by)
    would otherwise land on whichever benchmark ran at that moment.
    """
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def ratio_table(rows: dict[str, Row]) -> list[str]:
    """Markdown: one line per group that has all three wall times."""
    presets = sorted({p for row in rows.values() for p in row.sim_s})
    fused = any("dut_inductor" in {*row.min_s, *row.interleaved} for row in rows.values())
    head = ["layer (M×K×N)", "fp32 ms", "int_mm ms", "DUT ms", "DUT/fp32", "DUT/int_mm"]
    if fused:
        head += ["DUT ind ms", "DUT ind/int_mm"]
    head += [f"sim {p} µs" for p in presets]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group, row in rows.items():
        t = row.interleaved if {"fp32", "int_mm", "dut"} <= row.interleaved.keys() else row.min_s
        if not {"fp32", "int_mm", "dut"} <= t.keys():
            continue
        cells = [group, *(_number(t[v] * 1e3) for v in ("fp32", "int_mm", "dut"))]
        cells += [f"{t['dut'] / t['fp32']:.2f}", f"{t['dut'] / t['int_mm']:.2f}"]
        if fused:
            ind = t.get("dut_inductor")
            cells += [_number(ind * 1e3), f"{ind / t['int_mm']:.2f}"] if ind else ["-", "-"]
        cells += [_number(row.sim_s[p] * 1e6) if p in row.sim_s else "-" for p in presets]
        out.append("| " + " | ".join(cells) + " |")
    return out if len(out) > 2 else []


def _number(value: float) -> str:
    """3 significant digits, without an exponent: 0.0615, 2.43, 139, 27,400."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's tables
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = ratio_table(config.stash.get(_ROWS, {}))
    if not lines:
        return
    terminalreporter.write_sep("-", f"int8 path: fastest round, DUT = dut[{DUT_PRESET}]")
    for line in lines:
        terminalreporter.write_line(line)
