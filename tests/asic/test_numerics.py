"""The vectorized numerics equal the integer golden model exactly."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asic_backend.sim import host_gemm, host_passes, numerics
from asic_backend.sim.numerics import AccOverflow, RequantRounding
from tests.asic import golden

INT8 = st.integers(-128, 127)
# Extremes are where the bugs live; mix them in with uniform values.
INT8_VALUES = st.one_of(st.sampled_from([-128, -127, -1, 0, 1, 126, 127]), INT8)
INT32 = st.one_of(
    st.sampled_from([golden.INT32_MIN, golden.INT32_MIN + 1, -1, 0, 1, golden.INT32_MAX]),
    st.integers(golden.INT32_MIN, golden.INT32_MAX),
)
BIAS = st.one_of(st.integers(-(2**12), 2**12), INT32)
OVERFLOW = st.sampled_from(["wrap", "saturate"])
ROUNDING = st.sampled_from(["tflite", "float64_rne"])
PROPERTY = settings(max_examples=150, deadline=None)


def i8(rows: list[list[int]], cols: int, *, transposed: bool = False) -> torch.Tensor:
    """An int8 [len(rows), cols] tensor; ``transposed`` makes it a non-contiguous view."""
    flat = [v for row in rows for v in row]
    t = torch.tensor(flat, dtype=torch.int8).reshape(len(rows), cols)
    return t.t().contiguous().t() if transposed else t


def i32(values: list[int] | list[list[int]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


@dataclasses.dataclass
class GemmCase:
    k: int
    a: list[list[int]]
    w: list[list[int]]
    zp: int | list[int]  # a list: one per row
    zp_shape: tuple[int, ...] | None  # a per-tensor zero-point as a tensor of this shape
    bias: list[int] | None
    a_transposed: bool
    w_transposed: bool

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, int | torch.Tensor, torch.Tensor | None]:
        a = i8(self.a, self.k, transposed=self.a_transposed)
        w = i8(self.w, self.k, transposed=self.w_transposed)
        zp: int | torch.Tensor = (
            self.zp if isinstance(self.zp, int) else i32(self.zp).reshape(-1, 1)
        )
        if self.zp_shape is not None and isinstance(zp, int):
            zp = torch.full(self.zp_shape, zp, dtype=torch.int32)
        bias = None if self.bias is None else i32(self.bias)
        return a, w, zp, bias

    def golden(self, overflow: AccOverflow) -> list[list[int]]:
        return golden.linear_i32(self.a, self.w, self.zp, self.bias, overflow)


@st.composite
def gemm_case(draw: st.DrawFn, max_dim: int = 6, max_k: int = 12) -> GemmCase:
    m = draw(st.integers(0, max_dim))
    k = draw(st.integers(0, max_k))
    n = draw(st.integers(0, max_dim))
    zp_kind = draw(st.sampled_from(["zero", "tensor", "rows"]))
    return GemmCase(
        k=k,
        a=[[draw(INT8_VALUES) for _ in range(k)] for _ in range(m)],
        w=[[draw(INT8_VALUES) for _ in range(k)] for _ in range(n)],
        zp=[draw(INT8) for _ in range(m)] if zp_kind == "rows" else draw(INT8),
        zp_shape=draw(st.sampled_from([None, (), (1,), (1, 1)])),
        bias=draw(st.one_of(st.none(), st.lists(BIAS, min_size=n, max_size=n))),
        a_transposed=draw(st.booleans()),
        w_transposed=draw(st.booleans()),
    )


def run_linear_i32(case: GemmCase, overflow: AccOverflow) -> torch.Tensor:
    a, w, zp, bias = case.tensors()
    out = numerics.linear_i32(a, w, zp, bias, overflow)
    assert out.dtype == torch.int32
    assert out.shape == (len(case.a), len(case.w))
    assert out.is_contiguous()
    assert out.numel() == 0 or out.data_ptr() not in (a.data_ptr(), w.data_ptr())
    return out


@PROPERTY
@given(case=gemm_case(), overflow=OVERFLOW)
def test_linear_i32_equals_golden(case: GemmCase, overflow: AccOverflow) -> None:
    assert run_linear_i32(case, overflow).tolist() == case.golden(overflow)


@settings(max_examples=60, deadline=None)
@given(case=gemm_case(), overflow=OVERFLOW)
def test_float64_path_equals_golden(case: GemmCase, overflow: AccOverflow) -> None:
    # The path taken when K is too large for torch._int_mm, exercised on small shapes.
    with mock.patch.object(numerics, "int_mm_applies", return_value=False):
        assert run_linear_i32(case, overflow).tolist() == case.golden(overflow)


@settings(max_examples=40, deadline=None)
@given(case=gemm_case(), overflow=OVERFLOW)
def test_gemm_i32_equals_golden(case: GemmCase, overflow: AccOverflow) -> None:
    a, w, _, _ = case.tensors()
    out = numerics.gemm_i32(a, w, overflow)
    assert out.tolist() == golden.gemm_i32(case.a, case.w, overflow)


@pytest.mark.parametrize("m", [1, 5])
def test_k_equal_one_is_exact(m: int) -> None:
    # torch._int_mm returns uninitialized memory for K = 1, N >= 2 on CPU (torch 2.13).
    a = [[-128 + 37 * i] for i in range(m)]
    w = [[127 - 4 * j] for j in range(64)]
    out = numerics.linear_i32(i8(a, 1), i8(w, 1), 3)
    assert out.tolist() == golden.linear_i32(a, w, 3)


def test_size_one_dims_with_stride_zero_are_exact() -> None:
    # Inductor may hand the op a [1, K] operand with stride (0, 1): pytorch#195066.
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (1, 512), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (64, 512), dtype=torch.int8, generator=g)
    a0 = a.as_strided((1, 512), (0, 1))
    w0 = w[:1].as_strided((1, 512), (0, 1))
    assert numerics.linear_i32(a0, w, -2).tolist() == golden.linear_i32(a.tolist(), w.tolist(), -2)
    expected = golden.linear_i32(w.tolist(), w[:1].tolist())
    assert numerics.linear_i32(w, w0).tolist() == expected


def test_int_mm_is_exact_on_this_host() -> None:
    # Otherwise the int_mm kernel silently hands every GEMM to float32 (correct, slower).
    assert host_gemm.int_mm_is_exact()


# -- crafted worst cases with a K large enough to overflow int32 --------------------------------

BIG_K = numerics.INT_MM_MAX_K + 8869  # 140000: (−128)² · K exceeds 2^31


def exact_reference(
    a: torch.Tensor, w: torch.Tensor, zp: torch.Tensor | int, bias: torch.Tensor
) -> list[list[int]]:
    """Python ints via an int64 matmul (exact here: |sum| < 2^40)."""
    zp64 = zp.to(torch.int64) if isinstance(zp, torch.Tensor) else zp
    return [
        [int(v) for v in row]
        for row in ((a.to(torch.int64) - zp64) @ w.to(torch.int64).t() + bias.to(torch.int64))
    ]


@pytest.mark.parametrize("overflow", ["wrap", "saturate"])
@pytest.mark.parametrize("zp_kind", ["none", "int", "rows"])
def test_overflowing_k_wraps_or_saturates_exactly(overflow: AccOverflow, zp_kind: str) -> None:
    a = torch.full((3, BIG_K), -128, dtype=torch.int8)
    a[1] = 127
    a[2, ::2] = 127
    w = torch.full((4, BIG_K), -128, dtype=torch.int8)
    w[1] = 127
    w[2, 1::3] = -1
    w[3] = 0
    bias = i32([golden.INT32_MAX, golden.INT32_MIN, 5, -7])
    zp: int | torch.Tensor = -3 if zp_kind == "int" else 0
    if zp_kind == "rows":
        zp = i32([127, -128, 0]).reshape(3, 1)
    exact = exact_reference(a, w, zp, bias)
    assert any(abs(v) > golden.INT32_MAX for row in exact for v in row)  # the case does overflow
    out = numerics.linear_i32(a, w, zp, bias, overflow)
    assert out.tolist() == [[golden.narrow(v, overflow) for v in row] for row in exact]


@pytest.mark.parametrize("overflow", ["wrap", "saturate"])
def test_fold_overflow_at_the_largest_fast_k(overflow: AccOverflow) -> None:
    # The GEMM itself fits int32 (torch._int_mm), but adding the bias and the zero-point does not.
    k = numerics.INT_MM_MAX_K
    a = torch.full((2, k), -128, dtype=torch.int8)
    w = torch.full((2, k), -128, dtype=torch.int8)
    w[1] = 127
    bias = i32([20_000, -20_000])
    for zp in (0, 100, i32([100, -100]).reshape(2, 1)):
        exact = exact_reference(a, w, zp, bias)
        out = numerics.linear_i32(a, w, zp, bias, overflow)
        assert out.tolist() == [[golden.narrow(v, overflow) for v in row] for row in exact]


# -- requantization -------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    real=st.one_of(
        st.sampled_from([0.0, 0.5, 1.0, 1.0 - 2**-40, 2.0**-31, 2.0**-32, 2.0**30, 2.0**31, 1e300]),
        st.floats(0, 1e12, allow_nan=False, allow_infinity=False, allow_subnormal=True),
        st.floats(1e-12, 1.0),
    )
)
def test_quantize_multiplier_equals_golden(real: float) -> None:
    mult, shift = numerics.quantize_multiplier(real)
    assert mult.dtype == shift.dtype == torch.int32
    assert (int(mult), int(shift)) == golden.quantize_multiplier(real)


def test_quantize_multiplier_is_vectorized_and_matches_tflite() -> None:
    reals = [0.0015315535711, 0.5, 1.0 - 2**-40, 1e-40, 1e12]
    mult, shift = numerics.quantize_multiplier(torch.tensor(reals, dtype=torch.float64))
    # 0.0015315535711 -> (1683960960, -9) is the research run's example (docs/research/
    # int8-asic.md §5). 0.5 = 0.5·2^0 -> (2^30, 0); 1 - 2^-40 rounds q·2^31 up to 2^31, halved:
    # (2^30, 1); 1e-40 needs a shift below -31: (0, 0); 1e12 needs one above 30: TFLite clamps
    # to (2^31 - 1, 30).
    assert mult.tolist() == [1683960960, 2**30, 2**30, 0, 2**31 - 1]
    assert shift.tolist() == [-9, 0, 1, 0, 30]


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_quantize_multiplier_rejects_bad_reals(bad: float) -> None:
    with pytest.raises(ValueError, match=r"must be finite and >= 0, got"):
        numerics.quantize_multiplier(torch.tensor([0.25, bad]))


EXTREME_X = [golden.INT32_MIN, golden.INT32_MIN + 1, -(2**30), -3, -1, 0, 1, 3, 2**30, 2**31 - 1]
EXTREME_M = [0, 1, 2**30, 2**30 + 1, 1683960960, 2**31 - 1]
EXTREME_SHIFT = [-31, -30, -9, -1, 0, 1, 2, 29, 30]


def test_multiply_by_quantized_multiplier_extremes() -> None:
    for mult, shift in itertools.product(EXTREME_M, EXTREME_SHIFT):
        x = i32(EXTREME_X)
        out = numerics.multiply_by_quantized_multiplier(x, i32([mult]), i32([shift]))
        expected = [golden.multiply_by_quantized_multiplier(v, mult, shift) for v in EXTREME_X]
        assert out.tolist() == expected, (mult, shift)


def test_rounding_ties_follow_gemmlowp() -> None:
    # x·M = ±2^30 is a tie inside SRDHM; x / 2^e = ±k.5 is a tie inside RDBPOT.
    x = i32([1, -1, 3, -3, 5, -5, 6, -6])
    cases = [(2**30, 0), (2**30, -1), (2**30, -2)]
    for mult, shift in cases:
        out = numerics.multiply_by_quantized_multiplier(x, i32([mult]), i32([shift]))
        expected = [golden.multiply_by_quantized_multiplier(v, mult, shift) for v in x.tolist()]
        assert out.tolist() == expected


@dataclasses.dataclass
class RequantCase:
    acc: list[list[int]]
    n: int
    mult: list[int]
    shift: list[int]
    out_zp: int
    qmin: int
    qmax: int
    scalar_params: bool  # [] instead of [1]


@st.composite
def requant_case(draw: st.DrawFn) -> RequantCase:
    m = draw(st.integers(0, 5))
    n = draw(st.integers(1, 5))
    per_channel = draw(st.booleans())
    channels = n if per_channel else 1
    if draw(st.booleans()):
        reals = [draw(st.floats(1e-10, 4.0)) for _ in range(channels)]
        pairs = [golden.quantize_multiplier(r) for r in reals]
    else:
        pairs = [
            (draw(st.integers(0, 2**31 - 1)), draw(st.integers(-31, 30))) for _ in range(channels)
        ]
    qmin = draw(INT8)
    qmax = draw(st.integers(qmin, 127))
    return RequantCase(
        acc=[[draw(INT32) for _ in range(n)] for _ in range(m)],
        n=n,
        mult=[p[0] for p in pairs],
        shift=[p[1] for p in pairs],
        out_zp=draw(INT8),
        qmin=qmin,
        qmax=qmax,
        scalar_params=channels == 1 and draw(st.booleans()),
    )


@settings(max_examples=200, deadline=None)
@given(case=requant_case(), rounding=ROUNDING)
def test_requantize_equals_golden(case: RequantCase, rounding: RequantRounding) -> None:
    acc = i32([v for row in case.acc for v in row]).reshape(-1, case.n)
    mult, shift = i32(case.mult), i32(case.shift)
    if case.scalar_params:
        mult, shift = mult.reshape(()), shift.reshape(())
    args = (case.out_zp, case.qmin, case.qmax)
    out = numerics.requantize(acc, mult, shift, *args, rounding=rounding)
    expected = golden.requantize(case.acc, case.mult, case.shift, *args, rounding)
    assert out.dtype == torch.int8
    assert out.tolist() == expected


@PROPERTY
@given(case=gemm_case(max_dim=5, max_k=10), overflow=OVERFLOW, rounding=ROUNDING, data=st.data())
def test_linear_requant_equals_golden(
    case: GemmCase, overflow: AccOverflow, rounding: RequantRounding, data: st.DataObject
) -> None:
    channels = data.draw(st.sampled_from([1, len(case.w)])) or 1
    reals = data.draw(st.lists(st.floats(1e-6, 2.0), min_size=channels, max_size=channels))
    mult, shift = zip(*(golden.quantize_multiplier(r) for r in reals), strict=True)
    a_zp = case.zp if isinstance(case.zp, int) else 0  # this op's zero-point is per tensor
    out_zp = data.draw(INT8)
    a, w, _, bias = case.tensors()
    out = numerics.linear_requant(
        a,
        w,
        a_zp=a_zp,
        bias_i32=bias,
        multiplier=i32(list(mult)),
        shift=i32(list(shift)),
        out_zp=out_zp,
        qmin=-128,
        qmax=127,
        acc_overflow=overflow,
        rounding=rounding,
    )
    expected = golden.linear_requant(
        case.a,
        case.w,
        a_zp,
        case.bias,
        list(mult),
        list(shift),
        out_zp,
        -128,
        127,
        overflow,
        rounding,
    )
    assert out.is_contiguous()
    assert out.tolist() == expected


def test_requant_is_within_one_lsb_of_the_float_reference() -> None:
    # The integer pipeline approximates PT2E's dq -> fp32 linear -> q; it must not drift further.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g)
    w = torch.randn(96, 256, generator=g) * 0.05
    b = torch.randn(96, generator=g) * 0.1
    s_x, zp_x, s_y, zp_y = 0.025, -3, 0.02, 5
    s_w = w.abs().amax(1).double() / 127
    x_q = torch.clamp(torch.round(x / s_x) + zp_x, -128, 127).to(torch.int8)
    w_q = torch.clamp(torch.round(w / s_w[:, None].float()), -127, 127).to(torch.int8)
    y_ref = torch.nn.functional.linear(
        (x_q.float() - zp_x) * s_x, w_q.float() * s_w[:, None].float(), b
    )
    y_ref_q = torch.clamp(torch.round(y_ref / s_y) + zp_y, -128, 127)
    mult, shift = numerics.quantize_multiplier(s_x * s_w / s_y)
    for rounding in ("tflite", "float64_rne"):
        y_q = numerics.linear_requant(
            x_q,
            w_q,
            a_zp=zp_x,
            bias_i32=numerics.quantize_bias(b, s_x * s_w),
            multiplier=mult,
            shift=shift,
            out_zp=zp_y,
            qmin=-128,
            qmax=127,
            rounding=rounding,
        )
        assert int((y_q.float() - y_ref_q).abs().max()) <= 1


def test_quantize_bias_rounds_half_even_and_saturates() -> None:
    bias = torch.tensor([0.5, 1.5, -2.5, 1e30, -1e30, 0.3], dtype=torch.float32)
    out = numerics.quantize_bias(bias, torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.1]))
    assert out.dtype == torch.int32
    assert out.tolist() == [0, 2, -2, golden.INT32_MAX, golden.INT32_MIN, 3]


def test_dequantize_acc_follows_torchao_order() -> None:
    acc = i32([[3, -7], [100, 0]])
    a_scale = torch.tensor([[0.5], [0.25]])
    w_scale = torch.tensor([[0.1], [0.3]])
    bias = torch.tensor([1.0, -1.0])
    expected = (acc.float() * a_scale) * w_scale.reshape(1, -1) + bias
    assert torch.equal(numerics.dequantize_acc(acc, a_scale, w_scale, bias), expected)


@pytest.mark.parametrize("passes", host_passes.MODES)
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "n", [17, numerics.CAST_FIRST_MIN_NUMEL // 33 + 1], ids=["small", "cast-first"]
)
def test_dequantize_acc_in_place_equals_the_plain_formula(
    passes: str, per_row: bool, bias_dtype: torch.dtype | None, n: int
) -> None:
    """Bit for bit, including accumulators beyond float32's exact integers (2^24), in both of
    its forms (a large accumulator is cast first)."""
    g = torch.Generator().manual_seed(0)
    acc = torch.randint(-(2**31), 2**31 - 1, (33, n), dtype=torch.int32, generator=g)
    a_scale: float | torch.Tensor = torch.rand(33, 1, generator=g) * 1e-3 if per_row else 0.0123
    w_scale = torch.rand(n, 1, generator=g) * 1e-2
    bias = None if bias_dtype is None else torch.randn(n, generator=g).to(bias_dtype)
    expected = (acc.to(torch.float32) * a_scale) * w_scale.reshape(1, -1)
    if bias is not None:
        expected = expected + bias
    with host_passes.forced(passes):
        out = numerics.dequantize_acc(acc, a_scale, w_scale, bias)
    assert out.dtype == torch.float32
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))


def test_a_pass_goes_by_chunks_of_rows_only_past_the_last_level_of_cache() -> None:
    chunk_rows = numerics.CHUNK_BYTES // (4 * 2048)
    below = numerics.CHUNKED_MIN_BYTES // (4 * 2048) - 1
    assert numerics.row_spans(below, 2048) == [(0, below)]
    rows = numerics.CHUNKED_MIN_BYTES // (4 * 2048) + 3
    chunks = numerics.row_spans(rows, 2048)
    assert [hi - lo for lo, hi in chunks[:-1]] == [chunk_rows] * (len(chunks) - 1)
    assert chunks[0][0] == 0
    assert chunks[-1][1] == rows
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
    # A row longer than a chunk is a chunk of its own.
    long_row = numerics.CHUNK_BYTES // 4 + 1
    assert numerics.row_spans(8, long_row) == [(i, i + 1) for i in range(8)]
    # While tracing the pass is whole: the compiler fuses it.
    with mock.patch.object(torch.compiler, "is_compiling", return_value=True):
        assert numerics.row_spans(rows, 2048) == [(0, rows)]


@pytest.fixture
def chunked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every host pass by chunks of rows, of 3 rows of 37 values (and fewer at the end), in
    the aten kernels (the native passes go a row at a time, whatever the size)."""
    monkeypatch.setattr(numerics, "CHUNKED_MIN_BYTES", 0)
    monkeypatch.setattr(numerics, "CHUNK_BYTES", 3 * 37 * 4)
    monkeypatch.setattr(numerics, "CAST_FIRST_MIN_NUMEL", 1)
    with host_passes.forced("aten"):
        yield


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "form", ["int32", "int32 consumed", "float32", "batched"], ids=lambda f: f.replace(" ", "-")
)
def test_scale_acc_by_chunks_of_rows_is_the_whole_formula(
    chunked: None, form: str, bias: bool
) -> None:
    """Bit for bit, each operand's rows with their own accumulator rows: a per-row scale, a
    batch's scales (attention's ``[B, M, 1]`` by ``[B, 1, N]``), and ones that broadcast."""
    g = torch.Generator().manual_seed(1)
    shape = (11, 5, 37) if form == "batched" else (11, 37)
    acc = torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32, generator=g)
    if form == "float32":
        acc = acc.to(torch.float32)
    a_scale = torch.rand(*shape[:-1], 1, generator=g)
    b_scale = torch.rand(11, 1, 37, generator=g) if form == "batched" else torch.rand(1, 37)
    b = torch.randn(37, generator=g) if bias else None
    expected = (acc.to(torch.float32) * a_scale) * b_scale
    if b is not None:
        expected = expected + b
    consume = form != "int32"
    address = acc.data_ptr()
    out = numerics.scale_acc(acc, a_scale, b_scale, bias=b, consume=consume)
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))
    # A consumed accumulator (and a float32 one) is scaled in its own memory.
    assert (out.data_ptr() == address) == consume


# -- bad input: one clear line ----------------------------------------------------------------

A = torch.zeros(2, 3, dtype=torch.int8)
W = torch.zeros(4, 3, dtype=torch.int8)


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        (
            {"a_q": A.float()},
            TypeError,
            r"activations must be a 2-D int8 tensor \[M, K\], got torch.float32",
        ),
        (
            {"a_q": A.reshape(1, 2, 3)},
            TypeError,
            r"activations must be a 2-D int8 .* shape \(1, 2, 3\)",
        ),
        ({"w_q": W.to(torch.uint8)}, TypeError, r"weights must be a 2-D int8 tensor \[N, K\]"),
        ({"w_q": torch.zeros(4, 5, dtype=torch.int8)}, ValueError, r"inner dimensions differ"),
        ({"bias_i32": torch.zeros(4)}, TypeError, r"bias must be an int32 tensor \[N\]"),
        (
            {"bias_i32": torch.zeros(3, dtype=torch.int32)},
            ValueError,
            r"bias must have shape \[N\]=\(4,\)",
        ),
        ({"a_zp": torch.zeros(2, 1)}, TypeError, r"zero-point must be an int32 tensor"),
        (
            {"a_zp": torch.zeros(3, 1, dtype=torch.int32)},
            ValueError,
            r"shape \[\], \[1\], \[1, 1\] or \[M, 1\]",
        ),
        ({"a_zp": 128}, ValueError, r"zero-point 128 is outside int8 \[-128, 127\]; for uint8"),
        (
            {"a_zp": torch.tensor([[0], [-129]], dtype=torch.int32)},
            ValueError,
            r"-129 is outside int8",
        ),
        ({"a_zp": 1.5}, TypeError, r"must be an int or an int32 tensor"),
        (
            {"acc_overflow": "clip"},
            ValueError,
            r"acc_overflow must be 'wrap' or 'saturate', got 'clip'",
        ),
    ],
)
def test_linear_i32_rejects_bad_input(kwargs: dict[str, object], exc: type, message: str) -> None:
    args: dict[str, Any] = {
        "a_q": A,
        "w_q": W,
        "a_zp": 0,
        "bias_i32": None,
        "acc_overflow": "wrap",
    }
    args.update(kwargs)
    with pytest.raises(exc, match=message) as info:
        numerics.linear_i32(**args)
    assert "\n" not in str(info.value)


ACC = torch.zeros(2, 4, dtype=torch.int32)
MULT = torch.full((4,), 2**30, dtype=torch.int32)
SHIFT = torch.zeros(4, dtype=torch.int32)


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"acc": ACC.long()}, TypeError, r"int32 \[M, N\] accumulator"),
        ({"multiplier": MULT.float()}, TypeError, r"multiplier must be an int32 tensor"),
        ({"shift": SHIFT[:3]}, ValueError, r"shift must have shape \[\], \[1\] or \[N\]=\(4,\)"),
        ({"multiplier": MULT.reshape(2, 2)}, ValueError, r"per tensor or per output channel"),
        ({"multiplier": -MULT}, ValueError, r"multipliers must be >= 0"),
        ({"shift": SHIFT - 32}, ValueError, r"shifts must lie in \[-31, 30\], got \[-32, -32\]"),
        ({"out_zp": 200}, ValueError, r"output zero-point 200 is outside int8"),
        ({"qmin": 5, "qmax": 4}, ValueError, r"qmin <= qmax .* got qmin=5, qmax=4"),
        ({"qmax": 255}, ValueError, r"<= 127"),
        ({"rounding": "nearest"}, ValueError, r"rounding must be 'tflite' or 'float64_rne'"),
    ],
)
def test_requantize_rejects_bad_input(kwargs: dict[str, object], exc: type, message: str) -> None:
    args: dict[str, Any] = {
        "acc": ACC,
        "multiplier": MULT,
        "shift": SHIFT,
        "out_zp": 0,
        "qmin": -128,
        "qmax": 127,
        "rounding": "tflite",
    }
    args.update(kwargs)
    with pytest.raises(exc, match=message) as info:
        numerics.requantize(**args)
    assert "\n" not in str(info.value)


def test_weight_zero_point_must_be_zero() -> None:
    numerics.check_weight_zp(None)
    numerics.check_weight_zp(torch.zeros(4, 1, dtype=torch.int8))
    numerics.check_weight_zp(0)
    with pytest.raises(ValueError, match=r"zero-point 0\); got a non-zero weight zero-point"):
        numerics.check_weight_zp(torch.tensor([0, 0, 3], dtype=torch.int8))
