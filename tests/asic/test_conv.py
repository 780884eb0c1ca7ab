"""Convolutions on the DUT: the exact int32 accumulator equals the integer golden model, the
geometry equals PyTorch's, and the devices count one GEMM per group."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from asic_backend.sim import conv, host_gemm, int16_gemm, numerics
from asic_backend.sim import device as devices
from asic_backend.sim.config import AsicConfig
from asic_backend.sim.conv import ConvGeometry, conv_i32, im2col
from asic_backend.sim.cycles import conv_cost
from asic_backend.sim.device import get_device, run_conv_i32, run_conv_requant
from asic_backend.sim.macs import conv_params, macs
from asic_backend.sim.numerics import AccOverflow
from tests.asic import golden

INT8 = st.integers(-128, 127)
# Extremes are where the bugs live; mix them in with uniform values (as test_numerics does).
INT8_VALUES = st.one_of(st.sampled_from([-128, -127, -1, 0, 1, 126, 127]), INT8)
INT32 = st.one_of(
    st.sampled_from([golden.INT32_MIN, golden.INT32_MIN + 1, -1, 0, 1, golden.INT32_MAX]),
    st.integers(golden.INT32_MIN, golden.INT32_MAX),
)
BIAS = st.one_of(st.integers(-(2**12), 2**12), INT32)
OVERFLOW = st.sampled_from(["wrap", "saturate"])
ZP_KINDS = ("zero", "int", "samples", "samples_equal")

#: Per spatial rank: the largest input size and kernel drawn (keeps the golden model fast).
MAX_SIZE = {1: 7, 2: 5, 3: 3}
MAX_KERNEL = {1: 3, 2: 3, 3: 2}


def i8(nested: list[Any]) -> torch.Tensor:
    return torch.tensor(nested, dtype=torch.int8)


def i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def random_nested(shape: tuple[int, ...], draw: st.DrawFn) -> list[Any]:
    flat = draw(st.lists(INT8_VALUES, min_size=math.prod(shape), max_size=math.prod(shape)))
    return torch.tensor(flat, dtype=torch.int8).reshape(shape).tolist()


@dataclasses.dataclass
class ConvCase:
    x: list[Any]  # [N][C_in][*size]
    w: list[Any]  # [C_out][C_in/g][*k]; transposed: [C_in][C_out/g][*k]
    stride: list[int]
    padding: list[tuple[int, int]]
    dilation: list[int]
    groups: int
    transposed: bool
    output_padding: list[int]
    zp: int | list[int]  # a list: one per sample
    zp_tensor: bool  # pass the zero-point as an int32 tensor [N] (or [1])
    bias: list[int] | None
    padding_form: str  # how padding is spelt to ConvGeometry.of: "int", "dims" or "pairs"
    x_layout: str  # "contiguous", "channels_last" (a permuted copy) or "strided" (a view)

    @property
    def spatial(self) -> int:
        return len(self.stride)

    def padding_arg(self) -> Any:
        if self.padding_form == "int":
            return self.padding[0][0]
        if self.padding_form == "dims":
            return [lo for lo, _ in self.padding]
        return list(self.padding)

    def geometry(self) -> ConvGeometry:
        return ConvGeometry.of(
            golden.shape_of(self.x, 2 + self.spatial),
            golden.shape_of(self.w, 2 + self.spatial),
            stride=self.stride,
            padding=self.padding_arg(),
            dilation=self.dilation,
            groups=self.groups,
            transposed=self.transposed,
            output_padding=self.output_padding,
        )

    def x_tensor(self) -> torch.Tensor:
        x = i8(self.x)
        if self.x_layout == "channels_last":
            return x.movedim(1, -1).contiguous().movedim(-1, 1)
        if self.x_layout == "strided":
            wide = torch.zeros((*x.shape[:-1], 2 * x.shape[-1]), dtype=torch.int8)
            wide[..., ::2] = x
            return wide[..., ::2]
        return x

    def zp_arg(self) -> int | torch.Tensor:
        if not self.zp_tensor:
            assert isinstance(self.zp, int)
            return self.zp
        return i32(self.zp if isinstance(self.zp, list) else [self.zp])

    def run(self, overflow: AccOverflow) -> torch.Tensor:
        geo = self.geometry()
        x, w = self.x_tensor(), i8(self.w)
        bias = None if self.bias is None else i32(self.bias)
        out = conv_i32(x, w, geo, a_zp=self.zp_arg(), bias_i32=bias, acc_overflow=overflow)
        assert out.dtype == torch.int32
        assert tuple(out.shape) == geo.out_shape
        assert out.is_contiguous()
        assert out.data_ptr() not in (x.data_ptr(), w.data_ptr())
        return out

    def golden(self, overflow: AccOverflow) -> list[Any]:
        return golden.conv_i32(
            self.x,
            self.w,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            self.zp,
            self.bias,
            overflow,
            transposed=self.transposed,
            output_padding=self.output_padding,
        )


def _min_size(kernel: int, stride: int, pad: tuple[int, int], dilation: int, op: int, t: bool):
    """The smallest input size with a non-empty output."""
    span = dilation * (kernel - 1)
    if t:  # (size − 1)·s + span + 1 + op − lo − hi >= 1
        return 1 + max(0, -(-(pad[0] + pad[1] - span - op) // stride))
    return max(1, span + 1 - pad[0] - pad[1])


@st.composite
def conv_case(
    draw: st.DrawFn,
    *,
    transposed: bool | None = None,
    dense: bool = False,
    pointwise: bool = False,
    zp_kinds: tuple[str, ...] = ZP_KINDS,
) -> ConvCase:
    """A small convolution; ``dense``: groups = 1 and not transposed (the ``_int_mm`` path);
    ``pointwise``: a dense 1x1 conv of stride 1 without padding."""
    dense = dense or pointwise
    spatial = draw(st.integers(1, 3))
    t = draw(st.booleans()) if transposed is None else transposed
    t = t and not dense
    batch = draw(st.integers(1, 2))
    if dense:
        groups, c_in_g, c_out_g = 1, draw(st.integers(1, 3)), draw(st.integers(1, 3))
    elif draw(st.booleans()):  # depthwise (with a channel multiplier)
        groups, c_in_g, c_out_g = draw(st.integers(2, 4)), 1, draw(st.integers(1, 2))
    else:
        groups, c_in_g, c_out_g = (draw(st.integers(1, 3)) for _ in range(3))
    kernel = [draw(st.integers(1, MAX_KERNEL[spatial])) for _ in range(spatial)]
    stride = [draw(st.integers(1, 3)) for _ in range(spatial)]
    dilation = [draw(st.integers(1, 2)) for _ in range(spatial)]
    form = draw(st.sampled_from(["int", "dims", "pairs"]))
    if form == "int":
        pad = draw(st.integers(0, 2))
        padding = [(pad, pad)] * spatial
    elif form == "dims":
        padding = [(p, p) for p in (draw(st.integers(0, 2)) for _ in range(spatial))]
    else:
        padding = [(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(spatial)]
    # PyTorch's bound on output_padding (the float path runs F.conv_transpose*d).
    output_padding = [
        draw(st.integers(0, max(s, d) - 1)) if t else 0
        for s, d in zip(stride, dilation, strict=True)
    ]
    if pointwise:
        kernel, stride, padding = [1] * spatial, [1] * spatial, [(0, 0)] * spatial
    size = []
    for i in range(spatial):
        low = _min_size(kernel[i], stride[i], padding[i], dilation[i], output_padding[i], t)
        assume(low <= MAX_SIZE[spatial])
        size.append(draw(st.integers(low, MAX_SIZE[spatial])))
    c_in, c_out = groups * c_in_g, groups * c_out_g
    x = random_nested((batch, c_in, *size), draw)
    w = random_nested((c_in, c_out_g, *kernel) if t else (c_out, c_in_g, *kernel), draw)
    zp_kind = draw(st.sampled_from(zp_kinds))
    zp: int | list[int] = 0
    if zp_kind == "int":
        zp = draw(INT8)
    elif zp_kind == "samples":
        zp = [draw(INT8) for _ in range(batch)]
    elif zp_kind == "samples_equal":
        zp = [draw(INT8)] * batch
    return ConvCase(
        x=x,
        w=w,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        transposed=t,
        output_padding=output_padding,
        zp=zp,
        zp_tensor=isinstance(zp, list) or (zp_kind == "int" and draw(st.booleans())),
        bias=draw(st.one_of(st.none(), st.lists(BIAS, min_size=c_out, max_size=c_out))),
        padding_form=form,
        x_layout=draw(st.sampled_from(["contiguous", "channels_last", "strided"])),
    )


@settings(max_examples=150, deadline=None)
@given(case=conv_case(), overflow=OVERFLOW)
def test_conv_i32_equals_golden(case: ConvCase, overflow: AccOverflow) -> None:
    assert case.run(overflow).tolist() == case.golden(overflow)


@settings(max_examples=60, deadline=None)
@given(case=conv_case(dense=True, zp_kinds=("zero", "int")), overflow=OVERFLOW)
def test_int_mm_path_and_float_path_agree(case: ConvCase, overflow: AccOverflow) -> None:
    expected = case.golden(overflow)
    k = case.geometry().gemm[1]
    with (
        host_gemm.forced("int_mm"),
        mock.patch.object(conv, "_int8_gemm_conv", wraps=conv._int8_gemm_conv) as int_mm,
    ):
        assert case.run(overflow).tolist() == expected
    assert int_mm.called == (k >= host_gemm.INT_MM_MIN_K)  # dense, K >= 2: torch._int_mm
    with (
        host_gemm.forced("float32"),
        mock.patch.object(conv, "_int8_gemm_conv", wraps=conv._int8_gemm_conv) as int_mm,
    ):
        assert case.run(overflow).tolist() == expected
    assert not int_mm.called
    if "int16" not in host_gemm.available_kernels():
        return
    # int16 takes the int8 GEMM where it writes no im2col matrix (1-D or 2-D of a row stride of
    # 1 or 2, or a 1x1 conv of stride 1), else from INT16_MIN_FILTERS filters on: these few,
    # once it is 1.
    geo = case.geometry()
    pointwise = all(k == 1 for k in geo.kernel) and not any(sum(p) for p in geo.padding)
    unwritten = (geo.spatial <= 2 and geo.stride[-1] <= 2) or (
        pointwise and all(s == 1 for s in geo.stride)
    )
    for fewest in (conv.INT16_MIN_FILTERS, 1):
        with (
            host_gemm.forced("int16"),
            mock.patch.object(conv, "INT16_MIN_FILTERS", fewest),
            mock.patch.object(conv, "_int8_gemm_conv", wraps=conv._int8_gemm_conv) as int16,
        ):
            assert case.run(overflow).tolist() == expected
        # any K: int16 has no INT_MM_MIN_K
        assert int16.called == (unwritten or geo.out_channels >= fewest)


@pytest.mark.skipif(not int16_gemm.available(), reason="no int16 kernel on this host")
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "stride", "padding", "dilation"),
    [
        ((2, 3, 5, 20), (4, 3, 3, 3), 1, 1, 1),  # rows of 20 points: panels wrap once
        ((2, 3, 9, 40), (4, 3, 3, 3), 2, 1, 1),  # stride 2: rows of 20 again
        ((2, 3, 9, 26), (4, 3, 3, 3), 1, 1, 2),  # dilation 2 by rows and columns
        ((2, 5, 37), (3, 5, 3), 1, 2, 2),  # 1-D, as Whisper's conv
    ],
    ids=["2d", "2d-stride-2", "2d-dilated", "1d"],
)
def test_int16_packs_a_convs_input_without_an_im2col_matrix(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: int, padding: int, dilation: int
) -> None:
    gen = torch.Generator().manual_seed(len(x_shape))
    x = torch.randint(-128, 128, x_shape, dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, w_shape, dtype=torch.int8, generator=gen)
    geo = ConvGeometry.of(
        x_shape, w_shape, stride=stride, padding=padding, dilation=dilation, groups=1
    )
    fp64 = {3: F.conv1d, 4: F.conv2d}[len(x_shape)]
    expected = fp64(x.double() - 9, w.double(), stride=stride, padding=padding, dilation=dilation)
    with (
        host_gemm.forced("int16"),
        mock.patch.object(conv, "INT16_MIN_FILTERS", 1),
        mock.patch.object(int16_gemm, "pack_conv", wraps=int16_gemm.pack_conv) as pack_conv,
        mock.patch.object(conv, "im2col", wraps=conv.im2col) as im2col,
    ):
        got = conv.conv_i32(x, w, geo, a_zp=9)
    assert torch.equal(got.double(), expected)
    assert pack_conv.call_count == x_shape[0]
    assert not im2col.called


@settings(max_examples=40, deadline=None)
@given(case=conv_case(pointwise=True, zp_kinds=("zero", "int")), overflow=OVERFLOW)
def test_a_pointwise_conv_multiplies_its_input_as_it_lies(
    case: ConvCase, overflow: AccOverflow
) -> None:
    """A 1x1 conv of stride 1 without padding: its im2col matrix is the input (no copy), under
    each kernel that takes the int8 GEMM, in every input layout."""
    expected = case.golden(overflow)
    k = case.geometry().gemm[1]
    for kernel in host_gemm.available_kernels():
        with (
            host_gemm.forced(kernel),
            mock.patch.object(conv, "INT16_MIN_FILTERS", 1),
            mock.patch.object(conv, "_int8_gemm_conv", wraps=conv._int8_gemm_conv) as gemm,
            mock.patch.object(conv, "im2col", wraps=conv.im2col) as im2col,
        ):
            assert case.run(overflow).tolist() == expected, kernel
        takes_gemm = kernel in ("int16", "amx") or (
            kernel == "int_mm" and k >= host_gemm.INT_MM_MIN_K
        )
        assert gemm.called == takes_gemm, kernel
        assert not im2col.called, kernel


@settings(max_examples=80, deadline=None)
@given(case=conv_case(), overflow=OVERFLOW, kernel=st.sampled_from(["int_mm", "float32"]))
def test_float32_int8_values_give_the_int8_accumulator(
    case: ConvCase, overflow: AccOverflow, kernel: str
) -> None:
    """Where ``takes_float32`` says so (no zero-point; a float32 convolution on the host), the
    int8 values given as float32 give the golden accumulator and are left as they were;
    elsewhere float32 is refused."""
    geo, x, zp = case.geometry(), case.x_tensor().float(), case.zp_arg()
    w = i8(case.w)
    bias = None if case.bias is None else i32(case.bias)
    before = x.clone()
    with host_gemm.forced(kernel):
        if not conv.takes_float32(geo, zp):
            with pytest.raises(TypeError, match="conv operands must be int8"):
                conv_i32(x, w, geo, a_zp=zp, bias_i32=bias, acc_overflow=overflow)
            return
        out = conv_i32(x, w, geo, a_zp=zp, bias_i32=bias, acc_overflow=overflow)
    assert out.dtype == torch.int32
    assert out.tolist() == case.golden(overflow)
    assert torch.equal(x, before)


def test_takes_float32_is_where_the_host_convolves_in_float32() -> None:
    x = torch.zeros(1, 4, 6, 6, dtype=torch.int8)
    depthwise = ConvGeometry.of(x.shape, (4, 1, 3, 3), stride=1, padding=1, dilation=1, groups=4)
    dense = ConvGeometry.of(x.shape, (8, 4, 3, 3), stride=1, padding=1, dilation=1, groups=1)
    with host_gemm.forced("int_mm"):
        assert conv.takes_float32(depthwise)
        assert not conv.takes_float32(depthwise, a_zp=1)  # the zero-point is subtracted
        # A zero-point tensor counts as conv_i32 reads it: one value for the batch, or several.
        pair = ConvGeometry.of(
            (2, 4, 6, 6), (4, 1, 3, 3), stride=1, padding=1, dilation=1, groups=4
        )
        assert conv.takes_float32(pair, a_zp=i32([0, 0]))
        assert not conv.takes_float32(pair, a_zp=i32([0, 3]))
        assert not conv.takes_float32(dense)  # torch._int_mm on the im2col matrix
    with host_gemm.forced("float32"):
        assert conv.takes_float32(dense)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("weights", ["small", "worst case"])
def test_a_long_reduction_is_one_float32_conv_where_the_weights_allow(
    weights: str, transposed: bool
) -> None:
    """K = 1,152 is past the 1,024 any int8 operands allow a float32 sum: the worst-case
    weight (every value -128) is convolved in slices of channels, a quantized layer's smaller
    one in one convolution. Both exact, on activations of -128 and 127 that make every partial
    sum as large as it can be."""
    from unittest import mock

    g = torch.Generator().manual_seed(11)
    shape = (128, 2, 3, 3) if transposed else (2, 128, 3, 3)
    if weights == "small":
        w = torch.randint(-100, 101, shape, dtype=torch.int8, generator=g)
    else:
        w = _filled(shape, -128)
    x = torch.where(torch.rand(1, 128, 4, 4, generator=g) < 0.5, -128, 127).to(torch.int8)
    x[0, :, 1] = -128
    geo = ConvGeometry.of(
        x.shape, w.shape, stride=1, padding=1, dilation=1, groups=1, transposed=transposed
    )
    assert geo.reduction > host_gemm.FLOAT32_SLICE
    spy = mock.patch.object(conv, "_sliced_float32_conv", wraps=conv._sliced_float32_conv)
    with host_gemm.forced("float32"), spy as sliced:
        out = conv_i32(x, w, geo)
    assert sliced.called == (weights == "worst case")
    expected = golden.conv_i32(
        x.tolist(), w.tolist(), [1, 1], [(1, 1), (1, 1)], [1, 1], 1, transposed=transposed
    )
    assert out.tolist() == expected


@pytest.mark.parametrize(
    ("total", "zp", "one_conv"),
    [(2**17, 0, True), (2**17 + 1, 0, False), (65_793, -128, True), (65_794, -128, False)],
    ids=["at-2^24", "past-2^24", "zero-point-at", "zero-point-past"],
)
def test_one_float32_conv_takes_weights_up_to_the_bound_exactly(
    total: int, zp: int, one_conv: bool
) -> None:
    """``max |x| · Σ |w|`` at 2^24 is one convolution, one more is slices: max |x| is 128, or
    255 with a zero-point of -128, and activations at it reach the bound in every window."""
    from unittest import mock

    w = torch.zeros(2, 128, 3, 3, dtype=torch.int8)
    flat = w[0].view(-1)
    flat[: total // 128] = -128
    flat[total // 128] = -(total % 128)  # every weight of one sign: no window cancels
    w[1] = w[0].flip(0)
    x = torch.full((1, 128, 3, 3), 127 if zp else -128, dtype=torch.int8)
    geo = ConvGeometry.of(x.shape, w.shape, stride=1, padding=1, dilation=1, groups=1)
    spy = mock.patch.object(conv, "_sliced_float32_conv", wraps=conv._sliced_float32_conv)
    with host_gemm.forced("float32"), spy as sliced:
        out = conv_i32(x, w, geo, a_zp=zp)
    assert sliced.called == (not one_conv)
    expected = golden.conv_i32(x.tolist(), w.tolist(), [1, 1], [(1, 1), (1, 1)], [1, 1], 1, a_zp=zp)
    assert out.tolist() == expected
    assert max(abs(v) for v in out.flatten().tolist()) == (255 if zp else 128) * total


# -- regressions found by the property tests ----------------------------------------------------


def test_transposed_conv_with_asymmetric_padding() -> None:
    # The float path padded a transposed conv's input as well as cropping its output.
    x = _filled((1, 2, 1, 2), -128)
    w = _filled((2, 1, 1, 1), -128)
    geo = ConvGeometry.of(
        x.shape,
        w.shape,
        stride=1,
        padding=[(0, 0), (0, 1)],
        dilation=1,
        groups=2,
        transposed=True,
    )
    assert geo.out_shape == (1, 2, 1, 1)
    out = conv_i32(x, w, geo)
    assert out.tolist() == [[[[16384]], [[16384]]]]
    expected = golden.conv_i32(
        x.tolist(), w.tolist(), [1, 1], [(0, 0), (0, 1)], [1, 1], 2, transposed=True
    )
    assert out.tolist() == expected


@pytest.mark.parametrize("overflow", ["wrap", "saturate"])
def test_bias_int32_min_overflows_on_the_float_path(overflow: AccOverflow) -> None:
    # |INT32_MIN| is not an int32: the bound on the accumulator must not wrap to negative.
    x = _filled((1, 2, 1), -128)
    w = torch.tensor([[[-128]], [[1]]], dtype=torch.int8)
    bias = i32([5, golden.INT32_MIN])
    geo = ConvGeometry.of(x.shape, w.shape, stride=1, padding=0, dilation=1, groups=2)
    out = conv_i32(x, w, geo, bias_i32=bias, acc_overflow=overflow)
    exact = [2**14 + 5, golden.INT32_MIN - 128]
    assert out.flatten().tolist() == [golden.narrow(v, overflow) for v in exact]


# -- crafted worst cases: accumulators that really overflow int32 ------------------------------

#: The smallest reduction whose (−128)·(−128) products overflow int32: K·2^14 = 2^31.
K_OVERFLOW = 2**17
#: With a zero-point, (127 − (−128))·(−128) = −32640 a product: 65794·32640 > 2^31.
K_OVERFLOW_ZP = 65794


def test_the_overflowing_reductions_are_the_smallest() -> None:
    assert (K_OVERFLOW - 1) * 128 * 128 <= golden.INT32_MAX < K_OVERFLOW * 128 * 128
    assert K_OVERFLOW - 1 == numerics.INT_MM_MAX_K  # one past what torch._int_mm may take
    product = 255 * 128
    assert (K_OVERFLOW_ZP - 1) * product <= golden.INT32_MAX < K_OVERFLOW_ZP * product


def _filled(shape: tuple[int, ...], value: int) -> torch.Tensor:
    return torch.full(shape, value, dtype=torch.int8)


def overflow_cases() -> Iterator[Any]:
    k = K_OVERFLOW
    # 1-D, one channel, a kernel as long as the input: one output point per filter.
    x = _filled((1, 1, k), -128)
    w = _filled((3, 1, k), -128)
    w[1] = 127
    w[2, 0, ::2] = 127
    yield pytest.param(x, w, {}, 0, None, "float", id="k_2^17_1d")
    # The same reduction over channels (a 1x1 conv), with extreme biases.
    x = _filled((1, k, 1), -128)
    w = _filled((2, k, 1), -128)
    w[1, ::3] = -1
    bias = i32([golden.INT32_MAX, golden.INT32_MIN])
    yield pytest.param(x, w, {}, 0, bias, "float", id="k_2^17_channels_bias")
    # The smallest overflowing K with a zero-point: still torch._int_mm (the fold overflows).
    kz = K_OVERFLOW_ZP
    x = _filled((2, kz, 1), 127)
    x[1, ::2] = -128
    w = _filled((2, kz, 1), -128)
    w[1] = 127
    yield pytest.param(x, w, {}, -128, i32([-1, 1]), "int_mm", id="k_65794_zp")
    # One zero-point per sample: the float path.
    yield pytest.param(x, w, {}, i32([-128, 127]), None, "float", id="k_65794_sample_zp")
    # The largest K torch._int_mm takes: the GEMM fits int32, adding the bias does not.
    km = numerics.INT_MM_MAX_K
    x = _filled((1, km, 1), -128)
    w = _filled((1, km, 1), -128)
    yield pytest.param(x, w, {}, 0, i32([2**14]), "int_mm", id="k_max_int_mm_bias")
    # Grouped (2 groups of K = 2^17): one GEMM per group, each overflowing.
    x = _filled((1, 2 * k, 1), -128)
    x[0, k:] = 127
    w = _filled((2, k, 1), -128)
    yield pytest.param(x, w, {"groups": 2}, 0, None, "float", id="grouped")
    # Transposed: each output point sums C_in = 2^17 products.
    x = _filled((1, k, 1), -128)
    w = _filled((k, 1, 1), -128)
    yield pytest.param(x, w, {"transposed": True}, 0, None, "float", id="transposed")


@pytest.mark.parametrize(("x", "w", "kwargs", "zp", "bias", "path"), list(overflow_cases()))
def test_overflowing_accumulators_wrap_or_saturate_exactly(
    x: torch.Tensor,
    w: torch.Tensor,
    kwargs: dict[str, Any],
    zp: int | torch.Tensor,
    bias: torch.Tensor | None,
    path: str,
) -> None:
    args: dict[str, Any] = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, **kwargs}
    geo = ConvGeometry.of(x.shape, w.shape, **args)
    zps = zp.tolist() if isinstance(zp, torch.Tensor) else zp
    exact = golden.conv_exact(
        x.tolist(),
        w.tolist(),
        [1],
        [(0, 0)],
        [1],
        args["groups"],
        zps,
        None if bias is None else bias.tolist(),
        transposed=args.get("transposed", False),
    )
    flat = [v for batch in exact for channel in batch for v in channel]
    assert any(abs(v) > golden.INT32_MAX for v in flat)  # the case does overflow
    # Under each host kernel: the int_mm path where the kernel is int_mm, float convolutions
    # (sliced where they would pass 2^24) otherwise, the same bits.
    # int16 with its fewest filters at 1: the int8 GEMM path where int_mm's is.
    kernels = [k for k in ("int_mm", "float32", "int16") if k in host_gemm.available_kernels()]
    for kernel, overflow in itertools.product(kernels, ("wrap", "saturate")):
        with (
            host_gemm.forced(kernel),
            mock.patch.object(conv, "INT16_MIN_FILTERS", 1),
            mock.patch.object(conv, "_int8_gemm_conv", wraps=conv._int8_gemm_conv) as int_mm,
        ):
            out = conv_i32(x, w, geo, a_zp=zp, bias_i32=bias, acc_overflow=overflow)
        assert int_mm.called == (path.startswith("int_mm") and kernel != "float32")
        expected = golden.map_nested(lambda v, mode=overflow: golden.narrow(v, mode), exact)
        assert out.tolist() == expected, (kernel, overflow)


@pytest.mark.parametrize(
    ("reduction", "zp", "transposed"),
    [(1023, 0, False), (514, -128, False), (1023, 0, True), (514, 127, True)],
)
def test_float32_path_is_exact_at_its_limit(reduction: int, zp: int, transposed: bool) -> None:
    """The largest reductions the float32 path takes, at worst-case magnitudes and mixed signs
    (2 groups, so not torch._int_mm)."""
    if transposed:  # x [1, 2·R, 3], w [2·R, 2, 1]: each output sums R products
        x_shape, w_shape = (1, 2 * reduction, 3), (2 * reduction, 2, 1)
    else:  # x [1, 2·R/k, 4], w [4, R/k, k]
        k = 3 if reduction % 3 == 0 else 2
        x_shape, w_shape = (1, 2 * reduction // k, 4), (4, reduction // k, k)
    x = _filled(x_shape, -128 if zp >= 0 else 127)
    x.view(-1)[::11] = 127 if zp >= 0 else -128
    w = _filled(w_shape, -128)
    w[1] = 127
    w.view(-1)[::7] = 127
    geo = ConvGeometry.of(
        x_shape, w_shape, stride=1, padding=0, dilation=1, groups=2, transposed=transposed
    )
    assert geo.reduction == reduction
    max_x = 255 if zp else 128
    assert conv._float_dtype(geo.reduction * max_x * 128) == torch.float32  # the path under test
    assert conv._float_dtype((reduction + 1) * max_x * 128) == torch.float64  # and its limit
    expected = golden.conv_i32(
        x.tolist(), w.tolist(), [1], [(0, 0)], [1], 2, zp, transposed=transposed
    )
    assert conv_i32(x, w, geo, a_zp=zp).tolist() == expected


# -- im2col -------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(case=conv_case(transposed=False), pad_value=INT8)
def test_im2col_rows_are_the_windows(case: ConvCase, pad_value: int) -> None:
    """Row (n, *out) of group g is its window, ordered (*kernel, channel), padding pad_value."""
    geo = case.geometry()
    cols = im2col(case.x_tensor(), geo, pad_value=pad_value)
    m, k, _ = geo.gemm
    assert tuple(cols.shape) == (geo.groups, m, k)
    c_in_g = geo.in_channels // geo.groups
    expected = []
    for g in range(geo.groups):
        rows = []
        for n, o in itertools.product(range(geo.batch), golden.positions(geo.out_size)):
            row = []
            for kk, c in itertools.product(golden.positions(geo.kernel), range(c_in_g)):
                p = [
                    o[i] * geo.stride[i] - geo.padding[i][0] + kk[i] * geo.dilation[i]
                    for i in range(geo.spatial)
                ]
                inside = all(0 <= p[i] < geo.in_size[i] for i in range(geo.spatial))
                row.append(golden.at(case.x, (n, g * c_in_g + c, *p)) if inside else pad_value)
            rows.append(row)
        expected.append(rows)
    assert cols.tolist() == expected


# -- geometry -------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(case=conv_case())
def test_geometry_matches_pytorch(case: ConvCase) -> None:
    geo = case.geometry()
    x = torch.empty(golden.shape_of(case.x, 2 + case.spatial), device="meta")
    w = torch.empty(golden.shape_of(case.w, 2 + case.spatial), device="meta")
    lows = [lo for lo, _ in case.padding]
    symmetric = all(lo == hi for lo, hi in case.padding)
    if case.transposed:
        fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[case.spatial]
        full = fn(x, w, None, case.stride, 0, case.output_padding, case.groups, case.dilation)
        # Padding crops (lo, hi) off the full output.
        size = [full.shape[2 + i] - lo - hi for i, (lo, hi) in enumerate(case.padding)]
        expected = (*full.shape[:2], *size)
        if symmetric:
            out = fn(x, w, None, case.stride, lows, case.output_padding, case.groups, case.dilation)
            assert tuple(out.shape) == expected
    else:
        fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[case.spatial]
        pad = [p for pair in reversed(case.padding) for p in pair]
        expected = tuple(
            fn(F.pad(x, pad), w, None, case.stride, 0, case.dilation, case.groups).shape
        )
        if symmetric:
            out = fn(x, w, None, case.stride, lows, case.dilation, case.groups)
            assert tuple(out.shape) == expected
    assert geo.out_shape == expected
    assert geo.in_channels == x.shape[1]
    assert geo.out_channels == expected[1]
    # The GEMM per group (SCALE-Sim's mapping) and the MACs of all groups.
    m, k, n = geo.gemm
    c_in_g, c_out_g = geo.in_channels // geo.groups, geo.out_channels // geo.groups
    if case.transposed:
        assert (m, k, n) == (x.shape[0] * math.prod(x.shape[2:]), c_in_g, c_out_g * w[0, 0].numel())
    else:
        assert (m, k, n) == (x.shape[0] * math.prod(expected[2:]), w[0].numel(), c_out_g)
    assert geo.macs == geo.groups * m * k * n
    if symmetric:  # what the host-fallback accounting counts for aten.convolution
        params = conv_params(case.transposed, case.stride, lows, case.dilation)
        assert geo.macs == macs("conv", [x.shape, w.shape], params)


def test_geometry_docstring_example_and_padding_spellings() -> None:
    geo = ConvGeometry.of((2, 3, 8, 8), (4, 3, 3, 3), stride=1, padding=1, dilation=1, groups=1)
    assert geo.out_shape == (2, 4, 8, 8)
    assert geo.gemm == (128, 27, 4)
    assert geo.macs == 128 * 27 * 4
    assert geo.reduction == 27
    base = {"stride": 1, "dilation": 1, "groups": 1}
    for padding in (1, [1], (1, 1), [(1, 1), (1, 1)]):
        other = ConvGeometry.of((2, 3, 8, 8), (4, 3, 3, 3), padding=padding, **base)
        assert other == geo
    asym = ConvGeometry.of((1, 3, 8, 8), (4, 3, 3, 3), padding=[(0, 1), (2, 0)], **base)
    assert asym.padding == ((0, 1), (2, 0))
    assert asym.out_shape == (1, 4, 7, 8)


def test_geometry_of_a_depthwise_and_a_transposed_conv() -> None:
    dw = ConvGeometry.of((2, 32, 16, 16), (32, 1, 3, 3), stride=2, padding=1, dilation=1, groups=32)
    assert dw.out_shape == (2, 32, 8, 8)
    assert dw.gemm == (2 * 8 * 8, 9, 1)
    assert dw.macs == 32 * 128 * 9
    up = ConvGeometry.of(
        (1, 8, 5, 5),
        (8, 3, 4, 4),
        stride=2,
        padding=1,
        dilation=1,
        groups=1,
        transposed=True,
        output_padding=1,
    )
    assert up.out_shape == (1, 3, 11, 11)  # (5 − 1)·2 − 2 + 3 + 1 + 1
    assert up.gemm == (25, 8, 3 * 16)
    assert up.reduction == 8 * 16


def test_empty_batch() -> None:
    x = torch.zeros((0, 3, 5), dtype=torch.int8)
    w = torch.ones((2, 3, 3), dtype=torch.int8)
    geo = ConvGeometry.of(x.shape, w.shape, stride=1, padding=1, dilation=1, groups=1)
    for zp in (0, 5):
        out = conv_i32(x, w, geo, a_zp=zp, bias_i32=i32([1, 2]))
        assert out.shape == (0, 2, 5)
        assert out.dtype == torch.int32


# -- bad input: one clear line --------------------------------------------------------------

X = torch.zeros(2, 4, 6, 6, dtype=torch.int8)
W = torch.zeros(6, 2, 3, 3, dtype=torch.int8)
GEO = ConvGeometry.of(X.shape, W.shape, stride=1, padding=1, dilation=1, groups=2)


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        # float32 values only where takes_float32: not with a zero-point to subtract.
        ({"x_q": X.float(), "a_zp": 3}, TypeError, r"must be int8, got x torch.float32"),
        ({"x_q": X.double()}, TypeError, r"int8 \(or float32 int8 values, for this conv\)"),
        ({"w_q": W.to(torch.uint8)}, TypeError, r"got x torch.int8, w torch.uint8; quantize"),
        ({"x_q": X[:, :2]}, ValueError, r"conv input \(2, 2, 6, 6\) does not match its geometry"),
        ({"bias_i32": torch.zeros(6)}, ValueError, r"bias must be int32 \[C_out\]=\(6,\), got"),
        ({"bias_i32": i32([0, 0])}, ValueError, r"got torch.int32 of shape \(2,\)"),
        ({"a_zp": 128}, ValueError, r"zero-point 128 is outside int8"),
        ({"a_zp": i32([0, -129])}, ValueError, r"-129 is outside int8"),
        ({"a_zp": i32([0, 1, 2])}, ValueError, r"int32 tensor of 1 or N=2 values, got torch.int32"),
        ({"a_zp": torch.zeros(2)}, ValueError, r"got torch.float32 of shape \(2,\)"),
        ({"acc_overflow": "clip"}, ValueError, r"acc_overflow must be 'wrap' or 'saturate'"),
    ],
)
def test_conv_i32_rejects_bad_input(kwargs: dict[str, Any], exc: type, message: str) -> None:
    args: dict[str, Any] = {"x_q": X, "w_q": W, "geo": GEO, "a_zp": 0, "bias_i32": None}
    args.update(kwargs)
    with pytest.raises(exc, match=message) as info:
        conv_i32(**args)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "kwargs", "message"),
    [
        ((2, 4, 6, 6), (6, 3, 3, 3), {"groups": 2}, r"do not split into 2 groups"),
        ((2, 4, 6, 6), (6, 4, 3, 3), {"groups": 2}, r"do not split into 2 groups"),
        ((2, 4, 6, 6), (5, 2, 3, 3), {"groups": 2}, r"do not split into 2 groups"),
        ((2, 4, 6, 6), (6, 2, 3, 3), {"groups": 0}, r"do not split into 0 groups"),
        ((2, 4, 6), (5, 3, 3), {"groups": 1, "transposed": True}, r"do not split into 1 groups"),
        ((2, 4, 6, 6), (6, 4, 3, 3, 3), {}, r"1-3 spatial dims, got x \(2, 4, 6, 6\)"),
        ((2, 4, 6, 6), (6, 4), {}, r"1-3 spatial dims"),
        ((1, 1, 2, 2, 2, 2), (1, 1, 1, 1, 1, 1), {}, r"1-3 spatial dims"),
        ((2, 4, 2, 2), (6, 4, 3, 3), {}, r"output would be empty or negative: \(2, 6, 0, 0\)"),
        (
            (2, 4, 6, 6),
            (6, 4, 3, 3),
            {"stride": [1, 1, 1]},
            r"stride must be an int >= 1 or 2 of them",
        ),
        (
            (2, 4, 6, 6),
            (6, 4, 3, 3),
            {"dilation": [1, 1.0]},
            r"dilation must be an int >= 1 or 2 of them",
        ),
        ((2, 4, 6, 6), (6, 4, 3, 3), {"padding": [1, 1, 1]}, r"padding must have 2 entries"),
        ((2, 4, 6, 6), (6, 4, 3, 3), {"padding": [(1, -1), 0]}, r"padding must be >= 0"),
        ((2, 4, 6), (4, 3, 3), {"padding": (1, 1)}, r"padding must have 1 entries"),
        (
            (1, 4, 2),
            (4, 1, 1),
            {"transposed": True, "padding": 1},
            r"output would be empty or negative: \(1, 1, 0\)",
        ),
    ],
)
def test_geometry_rejects_bad_shapes(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], kwargs: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, **kwargs}
    with pytest.raises(ValueError, match=message) as info:
        ConvGeometry.of(x_shape, w_shape, **args)
    assert "\n" not in str(info.value)


# Found while writing these tests: stride 0 was a ZeroDivisionError, dilation 1.0 a TypeError,
# and dilation 0 or output_padding >= max(stride, dilation) gave geometries PyTorch rejects.
@pytest.mark.parametrize(
    "kwargs",
    [
        {"stride": 0},
        {"dilation": 0},
        {"transposed": True, "output_padding": 1},
        {"dilation": 1.0},
    ],
    ids=["stride_0", "dilation_0", "output_padding_too_large", "dilation_float"],
)
def test_geometry_rejects_what_pytorch_rejects(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, **kwargs}
    with pytest.raises(ValueError, match=r"asic: conv"):
        ConvGeometry.of((1, 2, 5), (2, 2, 2), **args)


# -- on a device: the counters and the int8-out convolution ------------------------------------

SATURATE_RNE = AsicConfig.preset("gemmini").replace(
    name="gemmini_sat_rne", acc_overflow="saturate", requant_rounding="float64_rne"
)


@pytest.fixture(autouse=True)
def _fresh_counters() -> Iterator[None]:
    devices.reset_all()
    yield
    devices.reset_all()


def rand_i8(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=g)


DEVICE_CASES = [
    pytest.param((2, 3, 9, 9), (4, 3, 3, 3), {"padding": 1}, id="dense_2d"),
    pytest.param((1, 6, 8, 8), (6, 1, 3, 3), {"groups": 6, "stride": 2}, id="depthwise"),
    pytest.param((2, 4, 7), (6, 2, 2), {"groups": 2, "dilation": 2}, id="grouped_1d"),
    pytest.param((1, 2, 3, 4, 4), (4, 2, 1, 3, 3), {"padding": [(0, 0), (1, 0), (0, 1)]}, id="3d"),
    pytest.param((1, 4, 3, 3), (4, 2, 2, 2), {"transposed": True, "stride": 2}, id="transposed"),
]


def _device_case(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], kwargs: dict[str, Any]
) -> tuple[ConvGeometry, torch.Tensor, torch.Tensor]:
    """A :data:`DEVICE_CASES` case's geometry and int8 operands."""
    args: dict[str, Any] = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, **kwargs}
    geo = ConvGeometry.of(x_shape, w_shape, **args)
    return geo, rand_i8(*x_shape, seed=1), rand_i8(*w_shape, seed=2)


@pytest.mark.parametrize("config", ["default", SATURATE_RNE], ids=["default", "gemmini_sat"])
@pytest.mark.parametrize(("x_shape", "w_shape", "kwargs"), DEVICE_CASES)
def test_run_conv_i32_counts_one_gemm_per_group(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    kwargs: dict[str, Any],
    config: str | AsicConfig,
) -> None:
    dev = get_device(config)
    geo, x, w = _device_case(x_shape, w_shape, kwargs)
    bias = torch.arange(geo.out_channels, dtype=torch.int32) * 1000 - 2000
    out = run_conv_i32(x, w, geo, a_zp=-7, bias_i32=bias, device=dev)
    expected = conv_i32(x, w, geo, a_zp=-7, bias_i32=bias, acc_overflow=dev.config.acc_overflow)
    assert torch.equal(out, expected)
    snap = dev.snapshot()
    cost = conv_cost(dev.config, geo, out_bytes=4)
    assert snap.dut_ops == geo.groups
    assert snap.macs == geo.macs == geo.groups * cost.macs
    assert snap.cycles == geo.groups * cost.cycles
    assert snap.bytes_moved == geo.groups * cost.bytes_moved
    assert snap.host_fallbacks == snap.host_macs == 0
    assert dev.last_costs == (cost,) * geo.groups
    # An int8 readout moves fewer output bytes, the same cycles.
    dev.reset()
    run_conv_i32(x, w, geo, device=dev, out_bytes=1)
    assert dev.snapshot().bytes_moved == geo.groups * conv_cost(dev.config, geo, 1).bytes_moved
    assert dev.snapshot().cycles == geo.groups * cost.cycles


@pytest.mark.parametrize("config", ["default", SATURATE_RNE], ids=["default", "gemmini_sat"])
@pytest.mark.parametrize(("x_shape", "w_shape", "kwargs"), DEVICE_CASES)
def test_a_conv_run_by_chunks_of_samples_is_one_runs_values_and_counters(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    kwargs: dict[str, Any],
    config: str | AsicConfig,
) -> None:
    dev = get_device(config)
    geo, x, w = _device_case((5, *x_shape[1:]), w_shape, kwargs)
    dev.reset()
    whole = run_conv_i32(x, w, geo, device=dev)
    counted, costs = dev.snapshot(), dev.last_costs
    dev.reset()
    chunks = (x[lo : lo + 2] for lo in range(0, 5, 2))
    parts = list(devices.run_conv_i32_by_chunks(chunks, w, geo, device=dev))
    assert [part.shape[0] for part in parts] == [2, 2, 1]
    assert torch.equal(torch.cat(parts), whole)
    assert (dev.snapshot(), dev.last_costs) == (counted, costs)


@pytest.mark.parametrize("overflow", ["wrap", "saturate"])
@pytest.mark.parametrize("bias", [None, 2**12, 2**30], ids=["no_bias", "bias_2e12", "bias_2e30"])
@pytest.mark.parametrize("zp", [0, -7, "samples"])
@pytest.mark.parametrize(("x_shape", "w_shape", "kwargs"), DEVICE_CASES)
def test_conv_i32_by_chunks_of_samples_gives_the_whole_batchs_values(
    monkeypatch: pytest.MonkeyPatch,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    kwargs: dict[str, Any],
    zp: int | str,
    bias: int | None,
    overflow: AccOverflow,
) -> None:
    """A large batch of a thin conv goes a chunk of samples at a time (here, one sample): the
    same accumulator, for every zero-point, bias and overflow mode, and for float32 operands."""
    geo, x, w = _device_case((5, *x_shape[1:]), w_shape, kwargs)
    a_zp = i32([-7, 0, 3, -128, 127]) if zp == "samples" else zp
    bias_i32 = None if bias is None else torch.linspace(-bias, bias, geo.out_channels).int()
    args: dict[str, Any] = {"a_zp": a_zp, "bias_i32": bias_i32, "acc_overflow": overflow}
    whole = conv_i32(x, w, geo, **args)
    monkeypatch.setattr(numerics, "CHUNK_BYTES", 1)
    # Whole where the geometry goes to _int_mm (per-sample zero-points then take the float path).
    assert conv.samples_per_chunk(geo) == (geo.batch if conv._takes_int8_gemm(geo) else 1)
    assert torch.equal(conv_i32(x, w, geo, **args), whole)
    if conv.takes_float32(geo, a_zp) and bias is None:
        floats = conv_i32(x.float(), w, geo, **args, allow_float32=True)
        assert torch.equal(floats, whole.float())


def test_conv_chunks_short_of_or_past_the_batch_are_an_error_and_count_nothing() -> None:
    dev = get_device("default")
    dev.reset()
    geo = ConvGeometry.of((3, 4, 6, 6), (4, 1, 3, 3), stride=1, padding=1, dilation=1, groups=4)
    x, w = rand_i8(3, 4, 6, 6, seed=1), rand_i8(4, 1, 3, 3, seed=2)
    runs = devices.run_conv_i32_by_chunks([x[:1], x[1:2]], w, geo, device=dev)
    with pytest.raises(ValueError, match="conv chunks cover 2 of the batch's 3 samples"):
        list(runs)
    runs = devices.run_conv_i32_by_chunks([x[:2], x[1:3]], w, geo, device=dev)
    with pytest.raises(ValueError, match="conv chunks go past the batch's 3 samples"):
        list(runs)
    assert dev.snapshot().dut_ops == 0


def golden_rows(acc: list[Any]) -> list[list[int]]:
    """``acc [N][C][*out]`` as rows ``(n, *out)`` of C values (the GEMM's output matrix)."""
    rows = []
    for batch in acc:
        spatial = _nested_shape(batch[0])
        for o in golden.positions(spatial):
            rows.append([golden.at(channel, o) for channel in batch])
    return rows


def _nested_shape(nested: Any) -> tuple[int, ...]:
    shape = []
    while isinstance(nested, list):
        shape.append(len(nested))
        nested = nested[0]
    return tuple(shape)


@settings(max_examples=30, deadline=None)
@given(
    case=conv_case(zp_kinds=("zero", "int")),
    config=st.sampled_from(["default", SATURATE_RNE]),
    data=st.data(),
)
def test_run_conv_requant_equals_golden(
    case: ConvCase, config: str | AsicConfig, data: st.DataObject
) -> None:
    dev = get_device(config)
    dev.reset()
    geo = case.geometry()
    channels = data.draw(st.sampled_from([1, geo.out_channels]))
    reals = data.draw(st.lists(st.floats(1e-6, 2.0), min_size=channels, max_size=channels))
    mult, shift = (list(v) for v in zip(*map(golden.quantize_multiplier, reals), strict=True))
    out_zp = data.draw(INT8)
    qmin = data.draw(INT8)
    qmax = data.draw(st.integers(qmin, 127))
    assert isinstance(case.zp, int)
    out = run_conv_requant(
        case.x_tensor(),
        i8(case.w),
        geo,
        a_zp=case.zp,
        bias_i32=None if case.bias is None else i32(case.bias),
        multiplier=i32(mult),
        shift=i32(shift),
        out_zp=out_zp,
        qmin=qmin,
        qmax=qmax,
        device=dev,
    )
    cfg = dev.config
    acc = case.golden(cfg.acc_overflow)
    rows = golden.requantize(
        golden_rows(acc), mult, shift, out_zp, qmin, qmax, cfg.requant_rounding
    )
    assert out.dtype == torch.int8
    assert out.is_contiguous()
    assert tuple(out.shape) == geo.out_shape
    assert golden_rows(out.tolist()) == rows
    snap = dev.snapshot()
    cost = conv_cost(cfg, geo, out_bytes=1)
    assert (snap.dut_ops, snap.macs) == (geo.groups, geo.macs)
    assert (snap.cycles, snap.bytes_moved) == (
        geo.groups * cost.cycles,
        geo.groups * cost.bytes_moved,
    )


def test_run_conv_requant_rejects_bad_params() -> None:
    dev = get_device("default")
    geo = ConvGeometry.of((1, 2, 4), (3, 2, 1), stride=1, padding=0, dilation=1, groups=1)
    x, w = rand_i8(1, 2, 4, seed=0), rand_i8(3, 2, 1, seed=1)
    args: dict[str, Any] = {
        "a_zp": 0,
        "bias_i32": None,
        "multiplier": i32([2**30] * 3),
        "shift": i32([0] * 3),
        "out_zp": 0,
        "qmin": -128,
        "qmax": 127,
        "device": dev,
    }
    with pytest.raises(ValueError, match=r"per tensor or per output channel|shape"):
        run_conv_requant(x, w, geo, **{**args, "multiplier": i32([2**30] * 2)})
    with pytest.raises(ValueError, match=r"output zero-point 200 is outside int8"):
        run_conv_requant(x, w, geo, **{**args, "out_zp": 200})
    with pytest.raises(TypeError, match=r"device must be a Device"):
        run_conv_requant(x, w, geo, **{**args, "device": "default"})
    assert dev.snapshot().dut_ops == 0  # nothing counted for a rejected call
