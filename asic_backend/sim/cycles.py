"""Closed-form cost of one GEMM on a simulated systolic array: cycles, bytes, roofline.

``Y[M,N] = X[M,K] · W[N,K]ᵀ`` on an R x C array. Cycle counts are SCALE-Sim's per-fold formulas
for its three dataflows (weight-, output- and input-stationary): each equals SCALE-Sim's
"Total Cycles" + 1, as SCALE-Sim counts from cycle 0 (checked against SCALE-Sim 3.0.0's reports
on 72 runs, which ``tests/asic/scalesim_reports.py`` regenerates and
``tests/asic/test_dataflows.py`` compares). A double-buffered weight-stationary array
(``weight_buffers=2``) overlaps each fold's weight load with the previous fold's stream, which
SCALE-Sim does not model. SCALE-Sim's mapping efficiency and compute utilization are reported
too. Traffic is compulsory DRAM traffic plus input re-fetch and partial-sum spill when the SRAMs
are too small (docs/research/int8-asic.md §5). Everything is integer arithmetic on the shape, so the
figures are deterministic and CI can gate on them with zero noise.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Literal

from asic_backend.sim.config import OPS_PER_MAC, AsicConfig

if TYPE_CHECKING:
    from asic_backend.sim.conv import ConvGeometry

Bound = Literal["compute", "memory"]

#: Bytes per element of the int32 accumulator and of the per-channel int32 vector (bias with the
#: zero-point correction folded in) the post-processing unit reads.
ACC_BYTES = 4


@dataclasses.dataclass(frozen=True)
class GemmCost:
    """What one ``[m,k] x [k,n]`` GEMM costs on a device.

    ``utilization`` is MACs / (R·C·cycles); ``mapping_efficiency`` and ``compute_utilization``
    are SCALE-Sim's (:func:`mapping_efficiency`, :func:`compute_utilization`), means over the
    GEMM's ``folds`` (:func:`fold_grid`);
    ``arithmetic_intensity`` is ops (2 per MAC) per DRAM byte; ``roofline_time_s`` is
    ``max(cycles / f, bytes / bandwidth)`` and ``bound`` says which term won;
    ``attained_ops_per_s`` is ops / ``roofline_time_s``.
    """

    m: int
    k: int
    n: int
    macs: int
    cycles: int
    bytes_moved: int
    utilization: float
    arithmetic_intensity: float
    bound: Bound
    roofline_time_s: float
    attained_ops_per_s: float
    mapping_efficiency: float = 0.0
    compute_utilization: float = 0.0
    folds: int = 0


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def fold_grid(config: AsicConfig, m: int, k: int, n: int) -> tuple[int, int, int]:
    """SCALE-Sim's mapping of the GEMM on the array, ``(Sr, Sc, T)``: ``Sr`` spreads over the
    rows, ``Sc`` over the columns (``ceil(Sr/R)·ceil(Sc/C)`` folds), ``T`` streams through.

    ``ws``: the weights are stationary, ``(K, N, M)``; ``os``: the outputs, ``(M, N, K)``;
    ``is``: the inputs, ``(K, M, N)``.
    """
    if config.dataflow == "ws":
        return k, n, m
    if config.dataflow == "os":
        return m, n, k
    return k, m, n


def fold_count(config: AsicConfig, m: int, k: int, n: int) -> int:
    """How many folds the GEMM takes on the array: ``ceil(Sr/R)·ceil(Sc/C)`` (0 when empty)."""
    if m == 0 or k == 0 or n == 0:
        return 0
    sr, sc, _ = fold_grid(config, m, k, n)
    return _ceil_div(sr, config.rows) * _ceil_div(sc, config.cols)


def systolic_cycles(config: AsicConfig, m: int, k: int, n: int) -> int:
    """Cycles of the GEMM on the array, by dataflow (SCALE-Sim's, + 1: it counts from 0).

    With ``(Sr, Sc, T)`` from :func:`fold_grid` and ``F = ceil(Sr/R)·ceil(Sc/C)`` folds:

    * ``ws`` and ``is``: each fold preloads its stationary tile (R cycles), streams T, drains over
      C-1 and skews over R-1: ``F·(2R + C + T - 2)``;
    * ``os``: nothing to preload; each fold streams K with the same fill and drain:
      ``F·(R + C + K - 2)``;
    * ``ws`` with ``weight_buffers=2``: the next fold's weights shift in (R cycles) while the
      current fold streams its M rows, and its stream follows the current one through the
      pipeline, so after the first fold each fold adds ``max(M, R)``:
      ``(2R + C + M - 2) + (F - 1)·max(M, R)``. When M < R (decode) loading is the bottleneck:
      every fold waits R cycles for its weights, against 2R + C + M - 2 single-buffered.
      (``tests/asic/test_dataflows.py`` simulates this schedule fold by fold, event by event.)

    An empty GEMM is not issued: 0.
    """
    if m == 0 or k == 0 or n == 0:
        return 0
    r, c = config.rows, config.cols
    _, _, t = fold_grid(config, m, k, n)
    folds = fold_count(config, m, k, n)
    if config.dataflow == "os":
        return folds * (r + c + t - 2)
    per_fold = 2 * r + c + t - 2
    if config.weight_buffers == 2:
        return per_fold + (folds - 1) * max(t, r)
    return folds * per_fold


def mapping_efficiency(config: AsicConfig, m: int, k: int, n: int) -> float:
    """SCALE-Sim's "mapping efficiency": the mean over folds of the share of PEs the fold maps,
    ``used_rows·used_cols / (R·C)``. The folds of a row (column) band share their used rows
    (columns), so the mean is ``Sr·Sc / (ceil(Sr/R)·R · ceil(Sc/C)·C)``. 0.0 for an empty GEMM.

    >>> mapping_efficiency(AsicConfig.preset("gemmini"), 1, 40, 24)  # K=40 on 16 rows: 3 folds
    0.625
    """
    if m == 0 or k == 0 or n == 0:
        return 0.0
    r, c = config.rows, config.cols
    sr, sc, _ = fold_grid(config, m, k, n)
    return (sr * sc) / (_ceil_div(sr, r) * r * _ceil_div(sc, c) * c)


def compute_utilization(config: AsicConfig, m: int, k: int, n: int) -> float:
    """SCALE-Sim's "compute utilization": the mean over folds of the MACs the fold does over
    the MACs the array could do in its cycles, ``used_rows·used_cols·T / (R·C·cycles_fold)``.

    Every fold has the same ``cycles_fold`` in SCALE-Sim's accounting, so this is
    ``mapping_efficiency · T / cycles_fold``, with ``cycles_fold = 2R + 2C + T - 3`` for ``ws``
    and ``is`` (SCALE-Sim counts the last column's skew here, which its total does not) and
    ``R + C + K - 2`` for ``os``. It describes one fold in isolation: a double-buffered array's
    overlap shows in :attr:`GemmCost.utilization`, not here. 0.0 for an empty GEMM.
    """
    if m == 0 or k == 0 or n == 0:
        return 0.0
    r, c = config.rows, config.cols
    _, _, t = fold_grid(config, m, k, n)
    cycles_fold = r + c + t - 2 if config.dataflow == "os" else 2 * r + 2 * c + t - 3
    return mapping_efficiency(config, m, k, n) * t / cycles_fold


def dram_bytes(
    config: AsicConfig, m: int, k: int, n: int, out_bytes: int, input_bytes: int | None = None
) -> int:
    """DRAM traffic of the GEMM.

    Compulsory: the int8 inputs and weights once, one int32 per output channel, the outputs once.
    Plus, when the inputs do not fit their SRAM, a re-read of them for every further column fold;
    and when C accumulator columns for M rows do not fit, each further K fold spills and reloads
    its int32 partial sums. ``input_bytes`` is what the inputs are in DRAM, when that is less
    than the ``M·K`` matrix the array streams (a convolution's feature map: the im2col patches
    overlap, and the address generator reads each pixel from on-chip SRAM).
    """
    if m == 0 or k == 0 or n == 0:
        return 0
    r, c = config.rows, config.cols
    inputs = m * k if input_bytes is None else input_bytes
    total = inputs + k * n + ACC_BYTES * n + m * n * out_bytes
    if inputs > config.inp_sram_bytes:
        total += inputs * (_ceil_div(n, c) - 1)
    if ACC_BYTES * m * c > config.acc_sram_bytes:
        total += 2 * ACC_BYTES * m * n * (_ceil_div(k, r) - 1)
    return total


def gemm_cost(
    config: AsicConfig, m: int, k: int, n: int, out_bytes: int, input_bytes: int | None = None
) -> GemmCost:
    """The cost of ``[m,k] x [k,n]`` with ``out_bytes`` per output element (1: int8, 4: int32);
    ``input_bytes``: see :func:`dram_bytes`.

    >>> cost = gemm_cost(AsicConfig.preset("gemmini"), 8, 64, 32, out_bytes=4)
    >>> cost.cycles, cost.bytes_moved, cost.bound
    (432, 3712, 'compute')
    """
    for label, value in (("m", m), ("k", k), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"gemm_cost: {label} must be a non-negative int, got {value!r}")
    if input_bytes is not None and not (type(input_bytes) is int and input_bytes >= 0):
        raise ValueError(f"gemm_cost: input_bytes must be a non-negative int, got {input_bytes!r}")
    if out_bytes not in (1, ACC_BYTES):
        raise ValueError(f"gemm_cost: out_bytes must be 1 (int8) or 4 (int32), got {out_bytes!r}")
    macs = m * k * n
    cycles = systolic_cycles(config, m, k, n)
    moved = dram_bytes(config, m, k, n, out_bytes, input_bytes)
    ops = OPS_PER_MAC * macs
    t_compute = cycles / config.clock_hz
    t_memory = moved / config.dram_bw_bytes_per_s
    time_s = max(t_compute, t_memory)
    return GemmCost(
        m=m,
        k=k,
        n=n,
        macs=macs,
        cycles=cycles,
        bytes_moved=moved,
        utilization=macs / (config.peak_macs_per_cycle * cycles) if cycles else 0.0,
        arithmetic_intensity=ops / moved if moved else 0.0,
        bound="compute" if t_compute >= t_memory else "memory",
        roofline_time_s=time_s,
        attained_ops_per_s=ops / time_s if time_s else 0.0,
        mapping_efficiency=mapping_efficiency(config, m, k, n),
        compute_utilization=compute_utilization(config, m, k, n),
        folds=fold_count(config, m, k, n),
    )


def conv_cost(config: AsicConfig, geo: ConvGeometry, out_bytes: int) -> GemmCost:
    """The cost of one group's GEMM of the convolution ``geo`` (SCALE-Sim's im2col mapping: the
    same cycles as the GEMM ``geo.gemm``); a conv issues ``geo.groups`` of them.

    Its DRAM inputs are the group's slice of the feature map, read once, or the patches when a
    stride makes those fewer (a transposed conv's GEMM inputs are the feature map itself).

    >>> geo = ConvGeometry.of((1, 64, 56, 56), (64, 64, 3, 3), stride=1, padding=1, dilation=1,
    ...                       groups=1)
    >>> conv_cost(AsicConfig.preset("default"), geo, out_bytes=4).cycles
    17590
    """
    m, k, n = geo.gemm
    feature_map = None
    if not geo.transposed:
        # A strided conv skips inputs: then the patches it streams are less than the map.
        group_map = geo.batch * (geo.in_channels // geo.groups) * math.prod(geo.in_size)
        feature_map = min(group_map, m * k)
    return gemm_cost(config, m, k, n, out_bytes, input_bytes=feature_map)
