"""The closed-form cycle, traffic and roofline model against hand-computed values."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asic_backend.config import AsicConfig
from asic_backend.cycles import GemmCost, dram_bytes, gemm_cost, systolic_cycles

DEFAULT = AsicConfig.preset("default")  # 128x128 @ 1 GHz, 100 GB/s


# research/int8-asic.md §5, exp5_cycles.py: (M, K, N) -> WS cycles, WS util, OS cycles, OS util, AI.
RESEARCH_TABLE = [
    ((8, 64, 128), 390, 0.010, 318, 0.013, 12.8),
    ((1, 4096, 4096), 392192, 0.003, 139200, 0.007, 2.0),
    ((512, 512, 512), 14304, 0.573, 12256, 0.668, 340.0),
    ((1024, 1024, 1024), 89984, 0.728, 81792, 0.801, 682.0),
    ((2048, 768, 3072), 349920, 0.843, 392448, 0.751, 944.0),
]


@pytest.mark.parametrize(("shape", "ws", "ws_util", "os_", "os_util", "ai"), RESEARCH_TABLE)
def test_research_table(
    shape: tuple[int, int, int], ws: int, ws_util: float, os_: int, os_util: float, ai: float
) -> None:
    m, k, n = shape
    for dataflow, cycles, util in (("ws", ws, ws_util), ("os", os_, os_util)):
        cost = gemm_cost(DEFAULT.replace(dataflow=dataflow), m, k, n, out_bytes=1)
        assert cost.cycles == cycles
        assert cost.utilization == pytest.approx(util, abs=5e-4)
        assert cost.arithmetic_intensity == pytest.approx(ai, abs=0.5)
        assert cost.macs == m * k * n


def test_bound_follows_the_roofline() -> None:
    # M=1 K=N=4096: WS takes 392 us of compute vs 168 us of DRAM; OS 139 us vs 168 us.
    ws = gemm_cost(DEFAULT, 1, 4096, 4096, out_bytes=1)
    os_ = gemm_cost(DEFAULT.replace(dataflow="os"), 1, 4096, 4096, out_bytes=1)
    assert ws.bound == "compute"
    assert ws.roofline_time_s == pytest.approx(392192e-9)
    assert os_.bound == "memory"
    assert os_.roofline_time_s == pytest.approx(os_.bytes_moved / 100e9)
    assert os_.attained_ops_per_s == pytest.approx(2 * 4096 * 4096 / os_.roofline_time_s)


def test_small_array_by_hand() -> None:
    cfg = AsicConfig(rows=4, cols=2)
    # WS: ceil(5/4)·ceil(3/2) folds of 2·4 + 2 + 3 − 2 = 11 cycles.
    assert systolic_cycles(cfg, 3, 5, 3) == 2 * 2 * 11
    # OS: ceil(3/4)·ceil(3/2) folds of 4 + 2 + 5 − 2 = 9 cycles.
    assert systolic_cycles(cfg.replace(dataflow="os"), 3, 5, 3) == 1 * 2 * 9
    # Compulsory traffic: 15 + 15 + 4·3 + 9·4 bytes.
    assert dram_bytes(cfg, 3, 5, 3, out_bytes=4) == 15 + 15 + 12 + 36


def test_refetch_and_spill_by_hand() -> None:
    m, k, n = 8, 10, 6  # on a 4x2 array: ceil(N/C) = 3 column folds, ceil(K/R) = 3 row folds
    compulsory = m * k + k * n + 4 * n + m * n * 1
    roomy = AsicConfig(rows=4, cols=2, inp_sram_bytes=m * k, acc_sram_bytes=4 * m * 2)
    assert dram_bytes(roomy, m, k, n, 1) == compulsory
    # Inputs larger than their SRAM are read again for each further column fold.
    small_inp = roomy.replace(inp_sram_bytes=m * k - 1)
    assert dram_bytes(small_inp, m, k, n, 1) == compulsory + m * k * 2
    # Partial sums that do not fit spill (write + read, int32) for each further row fold.
    small_acc = roomy.replace(acc_sram_bytes=4 * m * 2 - 1)
    assert dram_bytes(small_acc, m, k, n, 1) == compulsory + 8 * m * n * 2


@pytest.mark.parametrize("shape", [(0, 64, 64), (64, 0, 64), (64, 64, 0), (0, 0, 0)])
def test_empty_gemm_costs_nothing(shape: tuple[int, int, int]) -> None:
    for dataflow in ("ws", "os"):
        cost = gemm_cost(DEFAULT.replace(dataflow=dataflow), *shape, out_bytes=4)
        assert (cost.macs, cost.cycles, cost.bytes_moved) == (0, 0, 0)
        assert cost.utilization == cost.arithmetic_intensity == cost.roofline_time_s == 0.0
        assert cost.attained_ops_per_s == 0.0


def test_counts_are_ints() -> None:
    cost = gemm_cost(AsicConfig.preset("tpu_v1"), 300, 700, 900, out_bytes=4)
    assert all(type(v) is int for v in (cost.m, cost.k, cost.n, cost.macs, cost.cycles))
    assert type(cost.bytes_moved) is int
    assert isinstance(cost, GemmCost)


def test_peak_and_ridge() -> None:
    assert DEFAULT.peak_ops_per_s == 2 * 128 * 128 * 1e9
    assert DEFAULT.ridge_ops_per_byte == pytest.approx(327.68)
    tpu = AsicConfig.preset("tpu_v1")
    assert tpu.peak_ops_per_s == pytest.approx(91.75e12, rel=1e-3)  # "92 TeraOps/second"
    # The paper's ridge of ~1350 counts MACs per byte; ours counts 2 ops per MAC.
    assert tpu.ridge_ops_per_byte / 2 == pytest.approx(1350, rel=0.01)


@settings(max_examples=200, deadline=None)
@given(
    m=st.integers(1, 5000),
    k=st.integers(1, 5000),
    n=st.integers(1, 5000),
    rows=st.integers(1, 300),
    cols=st.integers(1, 300),
    dataflow=st.sampled_from(["ws", "os"]),
)
def test_utilization_never_exceeds_one(
    m: int, k: int, n: int, rows: int, cols: int, dataflow: str
) -> None:
    cfg = AsicConfig(rows=rows, cols=cols, dataflow=dataflow)  # type: ignore[arg-type]
    cost = gemm_cost(cfg, m, k, n, out_bytes=1)
    assert 0 < cost.utilization <= 1
    assert cost.attained_ops_per_s <= cfg.peak_ops_per_s * (1 + 1e-12)
    assert cost.bytes_moved >= m * k + k * n + m * n


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 2, 3, 4), r"m must be a non-negative int, got -1"),
        ((1, 2.0, 3, 4), r"k must be a non-negative int, got 2.0"),
        ((1, 2, True, 4), r"n must be a non-negative int, got True"),
        ((1, 2, 3, 2), r"out_bytes must be 1 \(int8\) or 4 \(int32\), got 2"),
    ],
)
def test_bad_arguments(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gemm_cost(DEFAULT, *args)  # type: ignore[arg-type]
