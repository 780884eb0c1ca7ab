"""The closed-form cycle, traffic and roofline model against hand-computed values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asic_backend.sim.config import AsicConfig
from asic_backend.sim.conv import ConvGeometry
from asic_backend.sim.cycles import GemmCost, conv_cost, dram_bytes, gemm_cost, systolic_cycles

DEFAULT = AsicConfig.preset("default")  # 128x128 @ 1 GHz, 100 GB/s
GEMMINI = AsicConfig.preset("gemmini")  # 16x16, 128 KiB input SRAM, 64 KiB accumulators


# docs/research/int8-asic.md §5, the output of docs/research/exp5_cycles.py:
# (M, K, N) -> WS cycles, WS util, OS cycles, OS util, AI.
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
    dataflow=st.sampled_from(["ws", "os", "is"]),
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
        ((1, 2, 3, 4, -1), r"input_bytes must be a non-negative int, got -1"),
        ((1, 2, 3, 4, True), r"input_bytes must be a non-negative int, got True"),
        ((1, 2, 3, 4, 2.5), r"input_bytes must be a non-negative int, got 2.5"),
    ],
)
def test_bad_arguments(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gemm_cost(DEFAULT, *args)  # type: ignore[arg-type]


# -- convolutions: one GEMM per group (SCALE-Sim's im2col mapping), the feature map read once ----


def geometry(x: tuple[int, ...], w: tuple[int, ...], **kwargs: object) -> ConvGeometry:
    args: dict[str, object] = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, **kwargs}
    return ConvGeometry.of(x, w, **args)  # type: ignore[arg-type]


RESNET_3X3 = geometry((1, 64, 56, 56), (64, 64, 3, 3), padding=1)  # M 3136, K 576, N 64
DEPTHWISE = geometry((1, 32, 112, 112), (32, 1, 3, 3), padding=1, groups=32)  # M 12544, K 9, N 1
POINTWISE = geometry((1, 256, 56, 56), (64, 256, 1, 1))  # M 3136, K 256, N 64
STEM_7X7 = geometry((1, 3, 224, 224), (64, 3, 7, 7), stride=2, padding=3)  # M 112², K 147, N 64

# (geometry, config, out_bytes) -> (cycles of one group's GEMM, its DRAM bytes), by hand:
# WS cycles = ceil(K/R)·ceil(N/C)·(2R + C + M − 2); bytes = feature map (one group's channels)
# + K·N weights + 4·N + M·N·out_bytes, + the feature map again for each further column fold when
# it exceeds the input SRAM, + 2·4·M·N per further row fold when 4·M·C exceeds the accumulators.
CONV_TABLE = [
    # 5·1·(256 + 128 + 3136 − 2) = 5·3518. Bytes: fmap 64·56² = 200704, weights 36864, 256,
    # out 3136·64·4 = 802816; 4·3136·128 > 1 MiB: spill 8·3136·64·(5 − 1) = 6422528.
    (RESNET_3X3, DEFAULT, 4, 17590, 200704 + 36864 + 256 + 802816 + 6422528),
    # 36·4·(32 + 16 + 3136 − 2) = 144·3182. Bytes: fmap 200704 > 128 KiB: re-read 3 times
    # (602112); out 3136·64 = 200704; spill 8·3136·64·35 = 56197120.
    (RESNET_3X3, GEMMINI, 1, 458208, 200704 + 602112 + 36864 + 256 + 200704 + 56197120),
    # Per group: 1·1·(256 + 128 + 12544 − 2) = 12926. Bytes: fmap 112² = 12544, weights 9,
    # 4, out 12544·1; one row fold, nothing spills.
    (DEPTHWISE, DEFAULT, 1, 12926, 12544 + 9 + 4 + 12544),
    # 1·1·(32 + 16 + 12544 − 2) = 12590; out 12544·4 = 50176.
    (DEPTHWISE, GEMMINI, 4, 12590, 12544 + 9 + 4 + 50176),
    # 2·1·3518. A 1x1 conv's feature map is its im2col matrix: 3136·256 = 802816; weights 16384,
    # 256, out 3136·64·4 = 802816; spill 8·3136·64·1 = 1605632.
    (POINTWISE, DEFAULT, 4, 7036, 802816 + 16384 + 256 + 802816 + 1605632),
    # 16·4·3182. fmap re-read 3 times (2408448); spill 8·3136·64·15 = 24084480.
    (POINTWISE, GEMMINI, 4, 203648, 802816 * 4 + 16384 + 256 + 802816 + 24084480),
    # 2·1·(256 + 128 + 12544 − 2) = 2·12926. Bytes: fmap 3·224² = 150528 (the im2col matrix
    # would be 12544·147 = 1843968), weights 147·64 = 9408, 256, out 12544·64 = 802816,
    # spill 8·12544·64·1 = 6422528.
    (STEM_7X7, DEFAULT, 1, 25852, 150528 + 9408 + 256 + 802816 + 6422528),
    # 10·4·(32 + 16 + 12544 − 2) = 40·12590. fmap 150528 > 128 KiB: re-read 3 times (451584);
    # spill 8·12544·64·9 = 57802752.
    (STEM_7X7, GEMMINI, 1, 503600, 150528 + 451584 + 9408 + 256 + 802816 + 57802752),
]


@pytest.mark.parametrize(("geo", "config", "out_bytes", "cycles", "moved"), CONV_TABLE)
def test_conv_cost_by_hand(
    geo: ConvGeometry, config: AsicConfig, out_bytes: int, cycles: int, moved: int
) -> None:
    cost = conv_cost(config, geo, out_bytes)
    assert (cost.cycles, cost.bytes_moved) == (cycles, moved)
    m, k, n = geo.gemm
    assert (cost.m, cost.k, cost.n, cost.macs) == (m, k, n, m * k * n)
    assert geo.groups * cost.macs == geo.macs
    # The same cycles as the GEMM; only the input traffic differs.
    assert cost.cycles == systolic_cycles(config, m, k, n)
    feature_map = geo.batch * geo.in_channels // geo.groups * math.prod(geo.in_size)
    assert cost == gemm_cost(config, m, k, n, out_bytes, input_bytes=feature_map)


def test_depthwise_conv_is_one_gemm_a_channel() -> None:
    # 32 GEMMs of N = 1: the array's columns idle, utilization 9·12544 / (128·128·12926).
    cost = conv_cost(DEFAULT, DEPTHWISE, out_bytes=1)
    assert DEPTHWISE.groups * cost.cycles == 32 * 12926
    assert cost.utilization == pytest.approx(9 * 12544 / (128 * 128 * 12926))


def test_transposed_conv_reads_its_gemm_inputs() -> None:
    # The gradient form: M = 8² input points, K = C_in = 16, N = 8·4² (a kernel a point).
    geo = geometry((1, 16, 8, 8), (16, 8, 4, 4), stride=2, padding=1, transposed=True)
    assert geo.gemm == (64, 16, 128)
    cost = conv_cost(DEFAULT, geo, out_bytes=4)
    assert cost == gemm_cost(DEFAULT, 64, 16, 128, out_bytes=4)
    # 1·1·(256 + 128 + 64 − 2); the feature map 16·64 = 1024 = M·K.
    assert cost.cycles == 446
    assert cost.bytes_moved == 1024 + 16 * 128 + 4 * 128 + 64 * 128 * 4


def test_input_bytes_replace_the_streamed_matrix() -> None:
    m, k, n = 8, 10, 6  # on a 4x2 array: 3 column folds, 3 row folds
    cfg = AsicConfig(rows=4, cols=2, inp_sram_bytes=50, acc_sram_bytes=4 * m * 2)
    assert dram_bytes(cfg, m, k, n, 1) == m * k * 3 + k * n + 4 * n + m * n  # 80 > 50: re-read
    # 40 input bytes fit the 50-byte SRAM: read once.
    assert dram_bytes(cfg, m, k, n, 1, input_bytes=40) == 40 + k * n + 4 * n + m * n
    assert dram_bytes(cfg, m, k, n, 1, input_bytes=m * k) == dram_bytes(cfg, m, k, n, 1)
    assert dram_bytes(cfg, 0, k, n, 1, input_bytes=40) == 0
