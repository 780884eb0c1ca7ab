"""The convolution ``asic::`` ops the lowering puts in place of ``conv1d/2d/3d`` and transposed
convolutions (:mod:`asic_backend.lower.conv`).

* ``asic::dyn_conv``: a float convolution as dynamic int8 on the DUT. Weights symmetric per
  output channel (cached while unchanged), activations symmetric per sample (one scale per batch
  element, so a sample's result does not depend on the rest of the batch), the int32
  accumulator of :func:`asic_backend.sim.device.run_conv_i32` scaled on the host:
  ``y = acc·(s_x[n]·s_w[c]) + b[c]`` in float32, rounded after each step. A large batch of a
  conv with few MACs per input value (depthwise) goes a chunk of samples at a time
  (:func:`asic_backend.sim.conv.sample_spans`), so its host passes run in the CPU's caches.
* ``asic::qconv``: a PT2E ``dequantize → conv(·, dequantize(W)) [→ relu] [→ quantize]`` chain on
  the integer tensors, int8-out (requantized on the DUT) or scaled on the host.

``padding`` is per spatial dim, before and after (``[lo0, hi0, lo1, hi1, ...]``): ``"same"``
padding may be asymmetric.

>>> import asic_backend.ops.conv
>>> y = torch.ops.asic.dyn_conv(torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), None,
...                             [1, 1], [1, 1, 1, 1], [1, 1], 1, False, [0, 0], True, "default")
>>> y.shape
torch.Size([2, 4, 8, 8])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from asic_backend.ops.library import dut_op
from asic_backend.ops.linear import (
    F32_EPS,
    Pt2eOutput,
    pt2e_activation,
    qlinear_params,
    quantize_sym_rows,
)
from asic_backend.sim import host_gemm, host_passes, numerics
from asic_backend.sim.conv import ConvGeometry, conv_out_size, sample_spans, takes_float32
from asic_backend.sim.device import (
    get_device,
    record_conv,
    run_conv_i32,
    run_conv_i32_by_chunks,
    run_conv_requant,
)
from asic_backend.sim.host import scratch
from asic_backend.sim.tensor_cache import new_cache, stamp

__all__ = ["dyn_conv", "dyn_weight_conv", "qconv"]

#: Quantized float convolution weights (``asic::dyn_conv``).
_conv_weight_cache = new_cache()


def _pairs(padding: Sequence[int]) -> list[tuple[int, int]]:
    return [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)]


def _geometry(
    x: Tensor,
    w: Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    transposed: bool,
    output_padding: Sequence[int],
) -> ConvGeometry:
    return ConvGeometry.of(
        x.shape,
        w.shape,
        stride=list(stride),
        padding=_pairs(padding),
        dilation=list(dilation),
        groups=groups,
        transposed=transposed,
        output_padding=list(output_padding),
    )


def _fake_out(
    x: Tensor,
    w: Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    transposed: bool,
    output_padding: Sequence[int],
    dtype: torch.dtype,
) -> Tensor:
    spatial = w.dim() - 2
    batched = x.dim() == spatial + 2
    _check: Callable[[Any, Callable[[], str]], None] = torch._check
    _check(
        batched or x.dim() == spatial + 1,
        lambda: f"asic conv: input must be [N, C, *size] or [C, *size], got {tuple(x.shape)}",
    )
    c_out = w.shape[1] * groups if transposed else w.shape[0]
    pads = _pairs(padding)
    size = x.shape[-spatial:]
    out = [
        conv_out_size(
            size[i],
            w.shape[2 + i],
            stride[i],
            pads[i],
            dilation[i],
            transposed,
            output_padding[i] if output_padding else 0,
        )
        for i in range(spatial)
    ]
    shape = [x.shape[0], c_out, *out] if batched else [c_out, *out]
    return x.new_empty(shape, dtype=dtype)


# -- asic::dyn_conv: float convolutions, dynamic int8 -------------------------------------------


def _quantize_conv_weight(w: Tensor, groups: int, transposed: bool) -> tuple[Tensor, Tensor]:
    """Symmetric per output channel: ``(w_q in w's layout, scale [C_out])``."""
    w = w.detach()
    if not transposed:
        q, scale = quantize_sym_rows(w.reshape(w.shape[0], -1))
        return q.reshape(w.shape), scale.reshape(-1)
    # [C_in, C_out/g, *k]: output channel g·C_out/g + j owns w[g·C_in/g : (g+1)·C_in/g, j].
    c_in, c_out_g = w.shape[0], w.shape[1]
    grouped = w.reshape(groups, c_in // groups, c_out_g, -1).transpose(1, 2)
    q, scale = quantize_sym_rows(grouped.reshape(groups * c_out_g, -1))
    q = q.reshape(groups, c_out_g, c_in // groups, -1).transpose(1, 2).reshape(w.shape)
    return q.contiguous(), scale.reshape(-1)


def _conv_weight(w: Tensor, groups: int, transposed: bool, cache: bool) -> tuple[Tensor, Tensor]:
    key = stamp(w) if cache else None
    return _conv_weight_cache.get(
        w,
        None if key is None else (*key, groups, transposed),
        lambda: _quantize_conv_weight(w, groups, transposed),
    )


def _channel_view(t: Tensor, spatial: int) -> Tensor:
    """A per-channel vector as ``[1, C, 1, ...]``, to broadcast over ``[N, C, *size]``."""
    return t.reshape(1, -1, *([1] * spatial))


def _rescale(
    acc: Tensor, scale: Tensor, bias: Tensor | None, *, out: Tensor | None = None
) -> Tensor:
    """``acc·scale + bias[c]`` in float32, rounded after the product and after the sum (as the
    linears' :func:`numerics.dequantize_acc`); ``acc`` is int32, or float32 holding the same
    values, and is the caller's to give up: a float32 one is rescaled in place, unless ``out``
    (float32, shaped as ``acc``) is given to receive the result.

    Cast first, then two in-place passes: ``addcmul`` with operands broadcast over the spatial
    dims runs unvectorized, 5x the time of a multiply and an add together (1.83 ms against 0.36
    at 8×128×56×56, one thread, AVX-512 host). The fused native pass
    (:mod:`asic_backend.sim.host_passes`) does both in one loop where it applies: the same
    values."""
    bias_f32 = None if bias is None else bias.to(torch.float32)
    fused = host_passes.scale_planes(acc, scale, bias_f32, out=out)
    if fused is not None:
        return fused
    y = acc if acc.dtype == torch.float32 else acc.to(torch.float32)
    y = y.mul_(scale) if out is None else torch.mul(y, scale, out=out)
    if bias_f32 is None:
        return y
    return y.add_(_channel_view(bias_f32, acc.dim() - 2))


@dut_op("asic::dyn_conv")
def dyn_conv(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    transposed: bool,
    output_padding: list[int],
    cache_weight: bool,
    device: str,
) -> Tensor:
    """A float (transposed) convolution run as dynamic int8 on the DUT; see the module doc."""
    xb, unbatched = _batched(x, w)
    geo = _geometry(xb, w, stride, padding, dilation, groups, transposed, output_padding)
    w_q, w_scale = _conv_weight(w, groups, transposed, cache_weight)
    if xb.numel() == 0:
        return _unbatched(xb.new_zeros(geo.out_shape), unbatched)
    if _depthwise_2d(geo) and xb.dtype == torch.float32:
        fused = _fused_depthwise(xb, w_q, w_scale, bias, geo, device)
        if fused is not None:
            return _unbatched(fused, unbatched)
    rows = xb.reshape(geo.batch, -1)
    float32 = takes_float32(geo)
    # Where the host convolves in float32, a chunk of samples at a time (sim.conv.sample_spans).
    if float32 and len(spans := sample_spans(geo)) > 1:
        y = _dyn_conv_by_chunks(rows, xb.shape, w_q, w_scale, bias, geo, device, spans)
        return _unbatched(y.to(x.dtype), unbatched)
    # Where the host convolves in float32, the quantized values go to it as float32, in this
    # thread's reused buffer: no int8 tensor and conversion back, and no fresh pages to fault
    # in (the depthwise benchmark layer: 10.1 to 9.3 ms, one thread, AVX-512 host).
    out = scratch(tuple(rows.shape), torch.float32) if float32 else None
    x_q, x_scale = quantize_sym_rows(rows, out=out)
    acc = run_conv_i32(
        x_q.reshape(xb.shape), w_q, geo, device=get_device(device), allow_float32=True
    )
    return _scaled(acc, x_scale, w_scale, bias, x.dtype, unbatched)


def _depthwise_2d(geo: ConvGeometry) -> bool:
    """One filter a channel (MobileNet's 3×3): :func:`host_passes.depthwise_conv` takes it."""
    return (
        geo.spatial == 2
        and not geo.transposed
        and geo.groups == geo.in_channels == geo.out_channels
    )


def _fused_depthwise(
    xb: Tensor, w_q: Tensor, w_scale: Tensor, bias: Tensor | None, geo: ConvGeometry, device: str
) -> Tensor | None:
    """:func:`dyn_conv` of a depthwise 2-D convolution in one native loop a plane (quantize,
    convolve, rescale: the same values), recorded on the device as any convolution; None where
    the fused loop does not apply."""
    fused = host_passes.depthwise_conv(
        xb,
        host_gemm.float_weight(w_q, torch.float32),
        w_scale,
        None if bias is None else bias.to(torch.float32),
        stride=(geo.stride[0], geo.stride[1]),
        padding=(geo.padding[0], geo.padding[1]),
        dilation=(geo.dilation[0], geo.dilation[1]),
        out_size=(geo.out_size[0], geo.out_size[1]),
        eps=F32_EPS,
    )
    if fused is None:
        return None
    record_conv(geo, device=get_device(device))
    return fused[0]


def _dyn_conv_by_chunks(
    rows: Tensor,
    shape: torch.Size,
    w_q: Tensor,
    w_scale: Tensor,
    bias: Tensor | None,
    geo: ConvGeometry,
    device: str,
    spans: list[tuple[int, int]],
) -> Tensor:
    """:func:`dyn_conv`'s float32 result, a span of samples at a time: the same values, since
    every step is per sample or per element."""
    y = rows.new_empty(geo.out_shape, dtype=torch.float32)
    x_scales: list[Tensor] = []

    def quantized() -> Iterator[Tensor]:
        for lo, hi in spans:
            out = scratch((hi - lo, rows.shape[1]), torch.float32)
            x_q, x_scale = quantize_sym_rows(rows[lo:hi], out=out)
            x_scales.append(x_scale)  # for the rescale of the accumulator this chunk gives
            yield x_q.reshape(hi - lo, *shape[1:])

    accs = run_conv_i32_by_chunks(
        quantized(), w_q, geo, device=get_device(device), allow_float32=True
    )
    # Every chunk, to the generator's end: the device records the convolution after the last.
    for i, acc in enumerate(accs):
        lo, hi = spans[i]
        _rescale(acc, _scale(x_scales[i], w_scale, geo.spatial), bias, out=y[lo:hi])
    return y


def _scaled(
    acc: Tensor,
    x_scale: Tensor,
    w_scale: Tensor,
    bias: Tensor | None,
    dtype: torch.dtype,
    unbatched: bool,
) -> Tensor:
    """``dyn_conv``'s result from its accumulator (given up to it) and the per-sample and
    per-channel scales: ``acc·(s_x[n]·s_w[c]) + b[c]``, as ``dtype``, contiguous."""
    y = _rescale(acc, _scale(x_scale, w_scale, acc.dim() - 2), bias)
    return _unbatched(y.to(dtype), unbatched)


def _scale(x_scale: Tensor, w_scale: Tensor, spatial: int) -> Tensor:
    """``s_x[n]·s_w[c]``, float32 ``[N, C_out, 1, ...]``: broadcast over the spatial dims."""
    scale = x_scale.reshape(-1, 1) * w_scale.reshape(1, -1)
    return scale.reshape(*scale.shape, *([1] * spatial))


def _batched(x: Tensor, w: Tensor) -> tuple[Tensor, bool]:
    """``x`` with a batch dim (``[C, *size]`` gains one), and whether it had to gain it."""
    unbatched = x.dim() == w.dim() - 1
    return (x.unsqueeze(0) if unbatched else x), unbatched


def _unbatched(y: Tensor, unbatched: bool) -> Tensor:
    return (y.squeeze(0) if unbatched else y).contiguous()


@dyn_conv.register_fake
def _(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    transposed: bool,
    output_padding: list[int],
    cache_weight: bool,
    device: str,
) -> Tensor:
    return _fake_out(x, w, stride, padding, dilation, groups, transposed, output_padding, x.dtype)


# -- host="inductor": dyn_conv with its host work in the graph -----------------------------------


@dut_op("asic::dyn_weight_conv")
def dyn_weight_conv(
    x_q: Tensor,
    w: Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    transposed: bool,
    output_padding: list[int],
    cache_weight: bool,
    device: str,
) -> tuple[Tensor, Tensor]:
    """The DUT convolution of a float conv: the batched int8 ``x_q`` by the float weight ``w``,
    quantized symmetric per output channel (cached while unchanged when ``cache_weight``).
    Returns the int32 accumulator ``[N, C_out, *out]`` and the weight scales ``[C_out]``
    (float32)."""
    geo = _geometry(x_q, w, stride, padding, dilation, groups, transposed, output_padding)
    w_q, w_scale = _conv_weight(w, groups, transposed, cache_weight)
    acc = run_conv_i32(x_q, w_q, geo, device=get_device(device))
    # A copy: the cached scales must not be an output a compiler may reuse as a buffer.
    return acc, w_scale.clone()


@dyn_weight_conv.register_fake
def _(
    x_q: Tensor,
    w: Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    transposed: bool,
    output_padding: list[int],
    cache_weight: bool,
    device: str,
) -> tuple[Tensor, Tensor]:
    acc = _fake_out(
        x_q, w, stride, padding, dilation, groups, transposed, output_padding, torch.int32
    )
    c_out = w.shape[1] * groups if transposed else w.shape[0]
    return acc, w.new_empty((c_out,), dtype=torch.float32)


def _dyn_conv_fusable(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    transposed: bool,
    output_padding: list[int],
    cache_weight: bool,
    device: str,
) -> Tensor:
    args = (stride, padding, dilation, groups, transposed, output_padding, cache_weight, device)
    xb, unbatched = _batched(x, w)
    if xb.numel() == 0:  # nothing to quantize or fuse
        whole: Tensor = torch.ops.asic.dyn_conv.default(x, w, bias, *args)
        return whole
    x_q, x_scale = quantize_sym_rows(xb.reshape(xb.shape[0], -1))
    acc, w_scale = torch.ops.asic.dyn_weight_conv.default(x_q.reshape(xb.shape), w, *args)
    return _scaled(acc, x_scale, w_scale, bias, x.dtype, unbatched)


# asic::dyn_conv as the host compiler should see it (as asic::dyn_linear_fusable): the per-sample
# quantization and the rescale as aten ops around the one opaque DUT convolution, for Inductor
# to fuse with their neighbours. Same numbers as asic::dyn_conv.
torch.library.define(
    "asic::dyn_conv_fusable", torch.library.infer_schema(_dyn_conv_fusable, mutates_args=())
)
torch.library.impl("asic::dyn_conv_fusable", "CompositeImplicitAutograd", _dyn_conv_fusable)


# -- asic::qconv: PT2E (quantized_decomposed) convolutions --------------------------------------


@dut_op("asic::qconv")
def qconv(
    x_q: Tensor,
    x_scale: Tensor,
    x_zp: Tensor,
    w_q: Tensor,
    w_scale: Tensor,
    w_zp: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    transposed: bool,
    output_padding: list[int],
    y_scale: float,
    y_zp: int,
    y_qmin: int,
    y_qmax: int,
    out_dtype: torch.dtype,
    device: str,
) -> Tensor:
    """A PT2E ``dequantize_per_tensor → conv(·, dequantize_per_channel(W), b)`` on the DUT.

    As :func:`asic_backend.ops.linear.qlinear`: ``x_q`` int8/uint8 with one scale and zero-point,
    ``w_q`` int8 per output channel (axis 0; a transposed conv's axis 1, repeated over its
    groups) or per tensor, zero-point 0; ``out_dtype`` int8/uint8 fuses the following
    ``quantize_per_tensor`` (requantized per output channel on the DUT), otherwise the int32
    result is scaled on the host: ``acc·(s_x·s_w[c]) + b[c]``.
    """
    dev = get_device(device)
    spatial = w_q.dim() - 2
    x, a_zp, s_x = pt2e_activation(x_q, x_scale, x_zp)
    geo = _geometry(x, w_q, stride, padding, dilation, groups, transposed, output_padding)
    if transposed and groups > 1 and w_scale.numel() == geo.out_channels // groups:
        w_scale, w_zp = w_scale.repeat(groups), w_zp.reshape(-1).repeat(groups)
    requant = out_dtype in (torch.int8, torch.uint8)
    params = qlinear_params(w_scale, w_zp, bias, s_x, y_scale if requant else None)
    if requant:
        window = Pt2eOutput.of(out_dtype, y_zp, y_qmin, y_qmax)
        assert params.multiplier is not None
        assert params.shift is not None
        y = run_conv_requant(
            x,
            w_q,
            geo,
            a_zp=a_zp,
            bias_i32=params.bias_i32,
            multiplier=params.multiplier,
            shift=params.shift,
            out_zp=window.zp,
            qmin=window.qmin,
            qmax=window.qmax,
            device=dev,
        )
        return window.to_dtype(y)
    acc = run_conv_i32(x, w_q, geo, a_zp=a_zp, device=dev)
    return _rescale(acc, _channel_view(params.w_scale * s_x, spatial), bias).to(out_dtype)


@qconv.register_fake
def _(
    x_q: Tensor,
    x_scale: Tensor,
    x_zp: Tensor,
    w_q: Tensor,
    w_scale: Tensor,
    w_zp: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    transposed: bool,
    output_padding: list[int],
    y_scale: float,
    y_zp: int,
    y_qmin: int,
    y_qmax: int,
    out_dtype: torch.dtype,
    device: str,
) -> Tensor:
    numerics.check_int8_qparams(None, y_zp - (128 if out_dtype == torch.uint8 else 0), -128, 127)
    return _fake_out(
        x_q, w_q, stride, padding, dilation, groups, transposed, output_padding, out_dtype
    )


def padding_pairs(padding: Any, spatial: int) -> list[int] | None:
    """``padding`` as the ops take it (``[lo0, hi0, ...]``) when it is ints; None otherwise."""
    values = [padding] if isinstance(padding, int) else list(padding)
    if len(values) == 1:
        values *= spatial
    if len(values) != spatial or not all(isinstance(v, int) for v in values):
        return None
    return [v for value in values for v in (value, value)]
