"""Convolutions as GEMMs on the array: their geometry, and their exact int32 accumulator.

A convolution reaches the DUT the way SCALE-Sim maps it (im2col): for each of the ``groups``
groups, one GEMM with ``M = N·prod(out)`` rows (output points), ``K = C_in/groups·prod(kernel)``
(a patch) and ``N = C_out/groups`` columns (filters). A transposed convolution is the GEMM of
its gradient form: ``M = N·prod(in)`` input points, ``K = C_in/groups`` and
``N = C_out/groups·prod(kernel)`` (each input point scatters a whole kernel), its outputs summed
into place (col2im).

The accumulator is the numeric contract of :mod:`asic_backend.sim.numerics` applied to every output
point: ``acc = Σ (x_q − zp)·w_q (+ bias_i32)`` over the window, padding contributing nothing,
exact, then wrapped or saturated to int32 once. It is computed by the host's int8 GEMM on the
im2col matrix where that is exact and pays (dense, K ≥ 2, on a host whose GEMM kernel is
``int_mm`` or ``amx``, or ``int16`` for a 1-D or 2-D conv of a row stride of 1 or 2, a 1x1
conv, or :data:`INT16_MIN_FILTERS` filters or more: :mod:`asic_backend.sim.host_gemm`), and
otherwise as float convolutions of the integer values, which are exact while every partial sum
stays an integer below 2^24 (float32, sliced by input channels to stay there) or 2^53
(float64): the order of exact integer additions does not matter.

>>> geo = ConvGeometry.of((2, 3, 8, 8), (4, 3, 3, 3), stride=1, padding=1, dilation=1, groups=1)
>>> geo.out_shape, geo.gemm           # (M, K, N) per group
((2, 4, 8, 8), (128, 27, 4))
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from asic_backend.sim import host_gemm, int16_gemm, numerics
from asic_backend.sim.host_gemm import F32_EXACT
from asic_backend.sim.numerics import INT_MM_MAX_K, AccOverflow
from asic_backend.sim.tensor_cache import new_cache, stamp

__all__ = [
    "INT16_MIN_FILTERS",
    "ConvGeometry",
    "conv_i32",
    "conv_out_size",
    "im2col",
    "per_dim",
    "sample_spans",
    "samples_per_chunk",
    "takes_float32",
]

#: Largest |integer| float64 holds exactly (float32's: host_gemm.F32_EXACT).
_F64_EXACT = 2**53


def per_dim(
    value: int | Sequence[int], spatial: int, name: str, minimum: int = 0
) -> tuple[int, ...]:
    """An ``int`` or per-dimension sequence as one int >= ``minimum`` per spatial dim
    (PyTorch's convention)."""
    values = list(value) if isinstance(value, Sequence) else [value]
    if len(values) == 1:
        values *= spatial
    if len(values) != spatial or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in values
    ):
        raise ValueError(
            f"asic: conv {name} must be an int >= {minimum} or {spatial} of them, got {value!r}"
        )
    return tuple(values)


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """The shapes of a batched convolution, and the GEMMs it is on the array.

    ``padding`` is per spatial dim, ``(before, after)`` (``"same"`` can be asymmetric).
    """

    batch: int
    in_channels: int
    out_channels: int
    in_size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]
    groups: int
    transposed: bool = False
    output_padding: tuple[int, ...] = ()

    @classmethod
    def of(
        cls,
        x_shape: Sequence[int],
        w_shape: Sequence[int],
        *,
        stride: int | Sequence[int],
        padding: int | Sequence[int] | Sequence[tuple[int, int]],
        dilation: int | Sequence[int],
        groups: int,
        transposed: bool = False,
        output_padding: int | Sequence[int] = 0,
    ) -> ConvGeometry:
        """The geometry of ``x [N, C_in, *size]`` convolved with ``w`` (``[C_out, C_in/g, *k]``;
        transposed: ``[C_in, C_out/g, *k]``). Raises ValueError for inconsistent shapes."""
        spatial = len(w_shape) - 2
        if spatial not in (1, 2, 3) or len(x_shape) != spatial + 2:
            raise ValueError(
                f"asic: conv needs x [N, C, *size] and w [C_out, C_in/groups, *kernel] with 1-3 "
                f"spatial dims, got x {tuple(x_shape)}, w {tuple(w_shape)}"
            )
        pads = _pairs(padding, spatial)
        c_in = int(x_shape[1])
        if transposed:
            c_out = int(w_shape[1]) * groups
            per_group_in = int(w_shape[0]) // groups
        else:
            c_out, per_group_in = int(w_shape[0]), int(w_shape[1])
        if groups < 1 or c_in % groups or c_out % groups or per_group_in * groups != c_in:
            raise ValueError(
                f"asic: conv channels do not split into {groups} groups: x {tuple(x_shape)}, "
                f"w {tuple(w_shape)}"
            )
        geo = cls(
            batch=int(x_shape[0]),
            in_channels=c_in,
            out_channels=c_out,
            in_size=tuple(int(s) for s in x_shape[2:]),
            kernel=tuple(int(k) for k in w_shape[2:]),
            stride=per_dim(stride, spatial, "stride", minimum=1),
            padding=pads,
            dilation=per_dim(dilation, spatial, "dilation", minimum=1),
            groups=groups,
            transposed=transposed,
            output_padding=per_dim(output_padding, spatial, "output_padding"),
        )
        for op, s, d in zip(geo.output_padding, geo.stride, geo.dilation, strict=True):
            if op and (not transposed or op >= max(s, d)):
                raise ValueError(
                    f"asic: conv output_padding {geo.output_padding} must be 0, or (transposed) "
                    f"smaller than the stride or the dilation"
                )
        if any(s <= 0 for s in geo.out_size):
            raise ValueError(f"asic: conv output would be empty or negative: {geo.out_shape}")
        return geo

    @property
    def spatial(self) -> int:
        return len(self.kernel)

    @property
    def out_size(self) -> tuple[int, ...]:
        return tuple(
            conv_out_size(
                self.in_size[i],
                self.kernel[i],
                self.stride[i],
                self.padding[i],
                self.dilation[i],
                self.transposed,
                self.output_padding[i] if self.output_padding else 0,
            )
            for i in range(self.spatial)
        )

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.batch, self.out_channels, *self.out_size)

    @property
    def gemm(self) -> tuple[int, int, int]:
        """``(M, K, N)`` of each group's GEMM on the array."""
        kernel = math.prod(self.kernel)
        c_in_g, c_out_g = self.in_channels // self.groups, self.out_channels // self.groups
        if self.transposed:
            return self.batch * math.prod(self.in_size), c_in_g, c_out_g * kernel
        return self.batch * math.prod(self.out_size), c_in_g * kernel, c_out_g

    @property
    def macs(self) -> int:
        m, k, n = self.gemm
        return self.groups * m * k * n

    @property
    def reduction(self) -> int:
        """The most products one output value sums (bounds the accumulator)."""
        kernel = math.prod(self.kernel)
        return self.in_channels // self.groups * kernel


def conv_out_size(
    size: Any,
    kernel: Any,
    stride: int,
    padding: tuple[int, int],
    dilation: int,
    transposed: bool,
    output_padding: int = 0,
) -> Any:
    """One output dim of a convolution (ints or SymInts: the ops' fakes use it too)."""
    span = dilation * (kernel - 1)
    lo, hi = padding
    if transposed:
        return (size - 1) * stride - lo - hi + span + 1 + output_padding
    return (size + lo + hi - span - 1) // stride + 1


def _pairs(
    padding: int | Sequence[int] | Sequence[tuple[int, int]], spatial: int
) -> tuple[tuple[int, int], ...]:
    if isinstance(padding, int):
        return ((padding, padding),) * spatial
    items = list(padding)
    if len(items) == 1 and isinstance(items[0], int):
        items *= spatial
    if len(items) != spatial:
        raise ValueError(f"asic: conv padding must have {spatial} entries, got {padding!r}")
    pairs = []
    for item in items:
        lo, hi = (item, item) if isinstance(item, int) else tuple(item)  # type: ignore[arg-type]
        if lo < 0 or hi < 0:
            raise ValueError(f"asic: conv padding must be >= 0, got {padding!r}")
        pairs.append((int(lo), int(hi)))
    return tuple(pairs)


# -- im2col --------------------------------------------------------------------------------------


def im2col(x_q: torch.Tensor, geo: ConvGeometry, pad_value: int = 0) -> torch.Tensor:
    """The im2col matrix ``[groups, M, K]`` of a non-transposed conv, K ordered ``(*kernel, C/g)``.

    ``x_q`` is padded with ``pad_value`` (the activation zero-point, so padding adds nothing once
    it is folded). The channels go last first (one copy of the int8 input), so each patch row is
    gathered as contiguous channel runs by one strided copy.
    """
    n, c = geo.batch, geo.in_channels
    s = geo.spatial
    channels_last = x_q.permute(0, *range(2, s + 2), 1)
    pad = [0, 0]
    for lo, hi in reversed(geo.padding):
        pad += [lo, hi]
    padded = F.pad(channels_last, pad, value=pad_value).contiguous()
    strides = padded.stride()
    g = geo.groups
    cg = c // g
    window = padded.as_strided(
        (g, n, *geo.out_size, *geo.kernel, cg),
        (
            cg * strides[-1],
            strides[0],
            *(strides[1 + i] * geo.stride[i] for i in range(s)),
            *(strides[1 + i] * geo.dilation[i] for i in range(s)),
            strides[-1],
        ),
    )
    m, k, _ = geo.gemm
    # reshape copies, except where the patches do not overlap (1x1 convs): then it is a view,
    # and made contiguous as the GEMM needs it.
    return window.reshape(g, m, k).contiguous()


def _weight_rows(w_q: torch.Tensor, geo: ConvGeometry) -> torch.Tensor:
    """``w_q [C_out, C_in/g, *k]`` as ``[groups, C_out/g, K]`` with K in :func:`im2col`'s order."""
    s = geo.spatial
    rows = w_q.permute(0, *range(2, s + 2), 1)
    return rows.reshape(geo.groups, geo.out_channels // geo.groups, -1).contiguous()


# -- the accumulator ----------------------------------------------------------------------------


@functools.cache
def _float32_conv_is_exact() -> bool:
    """Whether this host's float32 convolution sums integers exactly up to 2^24.

    int8 values are exact in float32 (and in bf16/tf32), so only the accumulation can round: a
    reduction just below the bound, with worst-case magnitudes and mixed signs, shows it.
    """
    channels = (F32_EXACT // 2**14 - 1) // 9
    x = torch.arange(channels * 36, dtype=torch.float32).reshape(1, channels, 6, 6)
    w = torch.arange(4 * channels * 9, dtype=torch.float32).reshape(4, channels, 3, 3)
    x = torch.where(x % 3 == 0, 127.0, -128.0)
    w = torch.where(w % 2 == 0, -128.0, 127.0)
    return torch.equal(F.conv2d(x, w).double(), F.conv2d(x.double(), w.double()))


def _float_dtype(bound: int) -> torch.dtype:
    """The float dtype that computes an integer convolution exactly when |every partial sum| <
    ``bound``."""
    if bound < F32_EXACT and _fp32_ieee() and _float32_conv_is_exact():
        return torch.float32
    if bound < _F64_EXACT:
        return torch.float64
    raise ValueError(
        f"asic: a convolution summing partial sums up to {bound} is beyond the simulator's exact "
        "range (2^53)"
    )


def _fp32_ieee() -> bool:
    # A user may let oneDNN run float32 convolutions in bf16/tf32; those would round.
    conv = getattr(torch.backends.mkldnn, "conv", None)
    return getattr(conv, "fp32_precision", "none") in ("none", "ieee")


def conv_i32(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    geo: ConvGeometry,
    *,
    a_zp: int | torch.Tensor = 0,
    bias_i32: torch.Tensor | None = None,
    acc_overflow: AccOverflow = "wrap",
    allow_float32: bool = False,
) -> torch.Tensor:
    """The int32 accumulator of the convolution ``geo`` of int8 ``x_q`` by int8 ``w_q``.

    ``acc[n, c_out, *out] = Σ (x_q − a_zp[n])·w_q + bias_i32[c_out]`` over each window (padding
    adds nothing), exact, then narrowed once per ``acc_overflow``. ``a_zp`` is an int or an int32
    tensor ``[N]`` (one zero-point per sample). Where :func:`takes_float32` says so, ``x_q`` may
    be float32 holding the int8 values (as the quantization makes them: converting them to int8
    and back would be two passes). Returns a contiguous int32 ``geo.out_shape``;
    with ``allow_float32``, where the host computed it in float32 and it fits there exactly, the
    float32 tensor instead (for a caller that rescales it in float32: the int32 round trip
    would cost two passes and change no value).
    """
    numerics.check_acc_overflow(acc_overflow)
    zp = _sample_zp(a_zp, geo.batch)
    _check_conv_operands(x_q, w_q, bias_i32, geo, zp)
    if not isinstance(zp, torch.Tensor) and _takes_int8_gemm(geo):
        return _int8_gemm_conv(x_q, w_q, geo, zp, bias_i32, acc_overflow)
    has_zp = isinstance(zp, torch.Tensor) or zp != 0
    max_x = 255 if has_zp else 128
    bound = geo.reduction * max_x * 128 + (_abs_max(bias_i32) if bias_i32 is not None else 0)
    spans = sample_spans(geo)
    if len(spans) == 1:
        return _float_path(x_q, w_q, geo, zp, bias_i32, max_x, bound, acc_overflow, allow_float32)
    # Each chunk on the batch's bounds, so every chunk takes the same path and dtype; copied
    # into the result while still in the caches.
    out: torch.Tensor | None = None
    for lo, hi in spans:
        part = _float_path(
            x_q[lo:hi],
            w_q,
            dataclasses.replace(geo, batch=hi - lo),
            zp[lo:hi] if isinstance(zp, torch.Tensor) else zp,
            bias_i32,
            max_x,
            bound,
            acc_overflow,
            allow_float32,
        )
        if out is None:
            out = part.new_empty(geo.out_shape)
        out[lo:hi] = part
    assert out is not None
    return out


def _float_path(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    geo: ConvGeometry,
    zp: int | torch.Tensor,
    bias_i32: torch.Tensor | None,
    max_x: int,
    bound: int,
    acc_overflow: AccOverflow,
    allow_float32: bool,
) -> torch.Tensor:
    """:func:`conv_i32` off the int8 GEMM, its operands checked: float convolutions of the int8
    values, exact below ``bound`` (the largest |sum| with the bias)."""
    fits_int32 = bound <= numerics.INT32_MAX
    slices = _float32_slices(geo, max_x)
    if len(slices) > 1 and _one_conv_is_exact(w_q, geo.transposed, max_x):
        slices = [(0, geo.in_channels)]
    if len(slices) > 1:
        exact = _sliced_float32_conv(x_q, w_q, geo, zp, slices, fits_int32)
    else:
        dtype = torch.float32 if slices else _float_dtype(bound)
        xf = _shifted(x_q, zp, dtype, geo.spatial)
        exact = _float_conv(xf, host_gemm.float_weight(w_q, dtype), geo)
        if allow_float32 and slices and bias_i32 is None:
            return exact.contiguous()  # integers below 2^24: exactly the int32 values
    if bias_i32 is not None:
        bias_view = bias_i32.reshape(1, -1, *([1] * geo.spatial))
        if exact.dtype == torch.float32 and bound < F32_EXACT:
            # Every sum with the bias is an integer below 2^24: exact in float32, in place.
            exact = exact.add_(bias_view.to(torch.float32))
        else:
            exact = exact.to(torch.int64) if exact.is_floating_point() else exact
            exact = exact + bias_view.to(torch.int64)
    if fits_int32:
        return exact.to(torch.int32).contiguous()
    return numerics.narrow_i32(exact.to(torch.int64), acc_overflow).contiguous()


def takes_float32(geo: ConvGeometry, a_zp: int | torch.Tensor = 0) -> bool:
    """Whether :func:`conv_i32` computes ``geo`` as float32 convolutions of the int8 values, so
    it takes them as float32 too: the activation zero-point is 0 (nothing to subtract from the
    caller's tensor) and the host does not take it to an int8 GEMM (a grouped or depthwise
    conv; any conv off the ``int_mm`` kernel, or the ``int16`` one's that writes its im2col
    matrix with fewer than :data:`INT16_MIN_FILTERS` filters: :mod:`asic_backend.sim.host_gemm`).
    ``a_zp`` is as :func:`conv_i32` takes it (a tensor of equal values counts as that one
    value)."""
    zp = _sample_zp(a_zp, geo.batch) if isinstance(a_zp, torch.Tensor) else a_zp
    if isinstance(zp, torch.Tensor) or zp != 0 or _takes_int8_gemm(geo):
        return False
    return bool(_float32_slices(geo, 128))


# Where the host convolves in float32, a large batch goes in chunks of samples of about
# numerics.CHUNK_BYTES of float32 input, each through every host pass before the next (converted
# or quantized, convolved, given its bias or rescaled): a pass then reads what the last one left
# in the CPU's caches, where passes over a whole large batch each read it from memory. Chunks of
# one 1.6 MB sample did as well as chunks of two or better (figures here: batches of 8, one
# thread, AVX-512 host).
#: A batch goes by chunks only for a convolution of at most this many MACs per input value (a
#: depthwise 3x3 has 9, a dense 3x3 of 64 channels 576), where the memory passes are most of its
#: time: 8×128×56×56 depthwise, 9.0 to 7.7 ms (26.5 to 7.1 with glibc's default of returning
#: freed memory); a pointwise 256 -> 256, even; the dense 3x3, 4% slower, in oneDNN calls on
#: fewer rows.
CHUNK_MAX_MACS_PER_VALUE = 256
#: ... and in at least this many chunks: a batch of two fits the caches whole (8×128×28×28
#: depthwise, 3.2 MB: 1.29 ms whole, 1.51 in two chunks).
CHUNK_MIN_CHUNKS = 3


def samples_per_chunk(geo: ConvGeometry) -> int:
    """How many of ``geo``'s samples the host convolves at a time: a chunk of about
    :data:`asic_backend.sim.numerics.CHUNK_BYTES` where the conditions above hold and the host's
    kernel does not take ``geo`` to an int8 GEMM (one GEMM over the im2col matrix), else
    the whole batch."""
    values = geo.in_channels * math.prod(geo.in_size)
    per_chunk = max(1, numerics.CHUNK_BYTES // (4 * values))
    if (
        _takes_int8_gemm(geo)
        or geo.macs > CHUNK_MAX_MACS_PER_VALUE * geo.batch * values
        or geo.batch < CHUNK_MIN_CHUNKS * per_chunk
    ):
        return geo.batch
    return per_chunk


def sample_spans(geo: ConvGeometry) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` ranges of ``geo``'s samples the host convolves one after another
    (:func:`samples_per_chunk`): one range for the whole batch, or consecutive chunks."""
    return numerics.spans(geo.batch, samples_per_chunk(geo))


#: The fewest filters a dense conv whose im2col matrix is written (3-D, or a row stride above 2)
#: has for the ``int16`` kernel to take it (below, the float convolution): each im2col value feeds
#: one multiply-add a filter, and costs two passes of its own (im2col, the kernel's packing),
#: which the float convolution does not pay. Against fp32, int16 then float32 (AVX2 code on the
#: AVX-512 VNNI host, one thread, round robin): a 4x4 conv of stride 4 from 3 channels (K = 48)
#: with 96 filters 1.57x and 1.36x, with 192 filters 1.02x and 1.12x; ViT's 16x16 patches (768
#: filters) 0.89x and 1.07x; a 3x3 conv of stride 3 with 256 filters 0.83x and 1.17x. A conv of
#: a row stride of 1 or 2 (1-D, 2-D) packs from its input instead (:func:`int16_gemm.pack_conv`)
#: and takes int16 whatever its filters: at 3x3, stride 1, 4 filters 0.82x and 1.50x, 64 filters
#: 0.80x and 1.12x; stride 2, 32 filters 1.19x and 1.36x, 128 filters 0.82x and 1.18x.
INT16_MIN_FILTERS = 128


def _takes_int8_gemm(geo: ConvGeometry) -> bool:
    """Whether the accumulator is the host's int8 GEMM on the im2col matrix (see the module),
    given one zero-point for the batch."""
    if geo.transposed or geo.groups != 1 or geo.gemm[1] > INT_MM_MAX_K:
        return False
    name = host_gemm.kernel_for(geo.gemm[1])
    if name == "int16":
        # Where no im2col matrix is written (a 1x1 conv, one int16 packs from its input), at any
        # number of filters.
        return _is_pointwise(geo) or _packs_from_input(geo) or geo.out_channels >= INT16_MIN_FILTERS
    return name in ("int_mm", "amx")


def _shifted(
    x_q: torch.Tensor, zp: int | torch.Tensor, dtype: torch.dtype, spatial: int
) -> torch.Tensor:
    """``x_q − zp`` (one zero-point, or one per sample) as ``dtype``: a new tensor, or ``x_q``
    itself when it is that dtype and ``zp`` is 0. Zero padding of it is padding ``x_q`` with its
    zero-point: it adds nothing."""
    xf = x_q.to(dtype)
    if isinstance(zp, torch.Tensor):
        return xf.sub_(zp.to(dtype).reshape(-1, *([1] * (spatial + 1))))
    return xf.sub_(zp) if zp != 0 else xf


def _sliced_float32_conv(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    geo: ConvGeometry,
    zp: int | torch.Tensor,
    slices: list[tuple[int, int]],
    fits_int32: bool,
) -> torch.Tensor:
    """Float32 convolutions over input-channel slices, each exact, summed in int32 (int64 when
    the whole may not fit). Each slice is converted on its own (contiguous) and its weights are
    kept contiguous per slice: oneDNN would otherwise copy strided channel slices every call."""
    acc_dtype = torch.int32 if fits_int32 else torch.int64
    weights = _weight_channel_slices(w_q, geo.transposed, slices)
    exact: torch.Tensor | None = None
    for (lo, hi), wf in zip(slices, weights, strict=True):
        xf = _shifted(x_q[:, lo:hi], zp, torch.float32, geo.spatial)
        part = _float_conv(xf, wf, geo).to(acc_dtype)
        exact = part if exact is None else exact.add_(part)
    assert exact is not None
    return exact


def _weight_channel_slices(
    w_q: torch.Tensor, transposed: bool, slices: list[tuple[int, int]]
) -> list[torch.Tensor]:
    """``w_q``'s input-channel slices as contiguous float32 tensors, kept while it is unchanged."""
    version = stamp(w_q)
    dim = 0 if transposed else 1

    def make() -> list[torch.Tensor]:
        return [w_q.narrow(dim, lo, hi - lo).to(torch.float32) for lo, hi in slices]

    key = None if version is None else (*version, transposed, tuple(slices))
    return _channel_slices.get(w_q, key, make)


#: Conv weights as float32 input-channel slices (:func:`_sliced_float32_conv`).
_channel_slices = new_cache()


def _one_conv_is_exact(w_q: torch.Tensor, transposed: bool, max_x: int) -> bool:
    """Whether one float32 convolution by ``w_q`` is exact for any activations of magnitude at
    most ``max_x``, however long its reduction: every partial sum of an output channel is at
    most ``max_x · Σ |w|`` over that channel's weights, in any order, and float32 holds every
    integer within 2^24 (as :func:`asic_backend.sim.host_gemm.slice_length` reasons for a
    linear). The worst case geometry allows 1,024 values of K; a quantized layer's weights are
    mostly far smaller (a ResNet 3×3 of 256 channels, K = 2,304, fits whole: one convolution
    where slices took four). Kept while ``w_q`` is unchanged. Grouped convolutions do not ask
    (:func:`_float32_slices` slices only ungrouped ones)."""
    out_dim = 1 if transposed else 0

    def make() -> bool:
        sums = w_q.to(torch.int32).abs_().sum(dim=[d for d in range(w_q.dim()) if d != out_dim])
        return w_q.numel() == 0 or int(sums.max()) * max_x <= F32_EXACT

    version = stamp(w_q)
    key = None if version is None else (*version, transposed, max_x)
    return bool(_one_conv_exact.get(w_q, key, make))


#: Whether a conv weight's sums allow one float32 convolution (:func:`_one_conv_is_exact`).
_one_conv_exact = new_cache()


def _float32_slices(geo: ConvGeometry, max_x: int) -> list[tuple[int, int]]:
    """The input-channel ranges of float32 convolutions whose partial sums stay below 2^24 (one
    range when the whole convolution does), or none where float32 cannot be used.

    A float32 convolution (oneDNN) is as fast as the host's fp32 convolutions; an int8 one on
    the host is not where the CPU has no int8 dot-product unit, and float64 is several times
    slower. Grouped convolutions reduce within a group, so they are sliced only when whole.
    """
    if not (_fp32_ieee() and _float32_conv_is_exact()):
        return []
    if geo.reduction * max_x * 128 < F32_EXACT:
        return [(0, geo.in_channels)]
    per_channel = math.prod(geo.kernel) * max_x * 128
    channels = geo.in_channels
    longest = (F32_EXACT - 1) // per_channel
    if geo.groups != 1 or longest == 0:
        return []
    # A power of two: oneDNN's blocked kernels run such channel counts fastest (64 channels x4
    # took 6.2 ms where 113 x3 took 6.5, at 8x256x14x14 by 256x256x3x3).
    step = 1 << (longest.bit_length() - 1)
    return [(lo, min(lo + step, channels)) for lo in range(0, channels, step)]


def _float_conv(x: torch.Tensor, w: torch.Tensor, geo: ConvGeometry) -> torch.Tensor:
    pad = []
    symmetric = all(lo == hi for lo, hi in geo.padding)
    if not symmetric and not geo.transposed:
        for lo, hi in reversed(geo.padding):
            pad += [lo, hi]
        x = F.pad(x, pad)
    padding = [lo for lo, _ in geo.padding] if symmetric else [0] * geo.spatial
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[geo.spatial]
    if not geo.transposed:
        return conv(x, w, None, geo.stride, padding, geo.dilation, geo.groups)
    conv_t = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[geo.spatial]
    out = conv_t(
        x, w, None, geo.stride, 0, list(geo.output_padding), geo.groups, list(geo.dilation)
    )
    # Padding of a transposed conv crops the full output.
    index = [slice(None), slice(None)]
    for i, (lo, hi) in enumerate(geo.padding):
        index.append(slice(lo, out.shape[2 + i] - hi))
    return out[tuple(index)]


def _int8_gemm_conv(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    geo: ConvGeometry,
    zp: int,
    bias_i32: torch.Tensor | None,
    acc_overflow: AccOverflow,
) -> torch.Tensor:
    """A dense conv as the host's exact int8 GEMM (:mod:`asic_backend.sim.host_gemm`) on the im2col
    matrix, exact for K <= INT_MM_MAX_K.

    The product is taken filters-first, one ``[C_out, K] x [K, points]`` GEMM per sample, so it
    lands in ``[N, C_out, *out]`` order: as fast as the points-first GEMM, and the result needs
    no transposing pass. The zero-point is folded as :func:`numerics.linear_i32` folds it (the
    padding holds ``zp``, so it cancels there too).
    """
    points = math.prod(geo.out_size)
    acc = torch.empty((geo.batch, geo.out_channels, points), dtype=torch.int32)
    if _is_pointwise(geo):
        # The im2col matrix of a 1x1 conv is the input: a sample's [C, points], read by columns
        # (the copy took 5.7 of a ResNet-50 bottleneck conv's 13.3 ms: AVX-512 VNNI host, one
        # thread).
        rows = _weight_rows(w_q, geo)[0]  # [C_out, K]
        x_rows = x_q.reshape(geo.batch, geo.in_channels, points)
        for n in range(geo.batch):
            host_gemm.mm_i32(rows, x_rows[n].t(), out=acc[n])
    elif _packs_from_input(geo) and host_gemm.kernel_for(geo.gemm[1], x_q, w_q) == "int16":
        # int16 packs each sample's im2col matrix from the padded input, without writing it
        # (K in the weight's own order): the im2col pass took 2.4 of ResNet's stage-1 conv's
        # 18 ms, and now its whole conv takes 14 (AVX2 code on the AVX-512 VNNI host, one
        # thread).
        rows = w_q.reshape(geo.out_channels, -1)
        x4, padding = _as_2d(x_q, geo)
        padded = int16_gemm.conv_input(x4, padding, zp)
        shape = _pair(geo.kernel), _pair(geo.stride), _pair(geo.dilation)
        for n in range(geo.batch):
            int16_gemm.mm(rows, int16_gemm.pack_conv(padded[n], *shape), out=acc[n])
    else:
        rows = _weight_rows(w_q, geo)[0]  # [C_out, K]
        cols = im2col(x_q, geo, pad_value=zp)[0]  # [N·points, K]
        for n in range(geo.batch):
            host_gemm.mm_i32(rows, cols[n * points : (n + 1) * points], out=acc[n])
    corr = bias_i32.to(torch.int64) if bias_i32 is not None else None
    if zp != 0:
        folded = -zp * rows.sum(dim=1, dtype=torch.int64)
        corr = folded if corr is None else corr + folded
    if corr is not None:
        corr = corr.reshape(1, -1, 1)
        if geo.gemm[1] * numerics.MAX_INT8_PRODUCT + _abs_max(corr) <= numerics.INT32_MAX:
            acc.add_(corr.to(torch.int32))  # no partial result can leave int32
        else:
            acc = numerics.narrow_i32(acc.to(torch.int64).add_(corr), acc_overflow)
    return acc.reshape(geo.out_shape)


def _is_pointwise(geo: ConvGeometry) -> bool:
    """A dense 1x1 conv of stride 1 without padding: each output point is its input point."""
    return (
        geo.groups == 1
        and not geo.transposed
        and all(k == 1 for k in geo.kernel)
        and all(s == 1 for s in geo.stride)
        and all(lo == hi == 0 for lo, hi in geo.padding)
    )


def _packs_from_input(geo: ConvGeometry) -> bool:
    """A dense 1-D or 2-D conv whose im2col matrix ``int16`` packs from its input
    (:func:`int16_gemm.pack_conv`): one whose output rows read input bytes 1 or 2 apart."""
    return geo.spatial in (1, 2) and geo.stride[-1] in (1, 2)


def _as_2d(x_q: torch.Tensor, geo: ConvGeometry) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """A 1-D or 2-D conv's input and padding as a 2-D conv's (a 1-D conv is one of height 1)."""
    if geo.spatial == 2:
        return x_q, list(geo.padding)
    return x_q.unsqueeze(2), [(0, 0), geo.padding[0]]


def _pair(values: Sequence[int]) -> tuple[int, int]:
    """A 1-D or 2-D conv's per-dimension values as a 2-D conv's (1 for a 1-D conv's height)."""
    return (values[0], values[1]) if len(values) == 2 else (1, values[0])


def _sample_zp(a_zp: int | torch.Tensor, batch: int) -> int | torch.Tensor:
    if isinstance(a_zp, torch.Tensor):
        if a_zp.dtype != torch.int32 or a_zp.numel() not in (1, batch):
            raise ValueError(
                f"asic: a conv's activation zero-point must be an int or an int32 tensor of 1 or "
                f"N={batch} values, got {a_zp.dtype} of shape {tuple(a_zp.shape)}"
            )
        lo, hi = (int(v) for v in torch.aminmax(a_zp)) if a_zp.numel() else (0, 0)
        numerics.check_int8_qparams(lo, 0, -128, 127)
        numerics.check_int8_qparams(hi, 0, -128, 127)
        return lo if lo == hi else a_zp.reshape(-1)
    numerics.check_int8_qparams(a_zp, 0, -128, 127)
    return a_zp


def _check_conv_operands(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    bias_i32: torch.Tensor | None,
    geo: ConvGeometry,
    zp: int | torch.Tensor,
) -> None:
    float_ok = x_q.dtype == torch.float32 and takes_float32(geo, zp)
    if (x_q.dtype != torch.int8 and not float_ok) or w_q.dtype != torch.int8:
        also = " (or float32 int8 values, for this conv)" if takes_float32(geo, zp) else ""
        raise TypeError(
            f"asic: conv operands must be int8{also}, got x {x_q.dtype}, w {w_q.dtype}; "
            "quantize them"
        )
    if tuple(x_q.shape) != (geo.batch, geo.in_channels, *geo.in_size):
        raise ValueError(f"asic: conv input {tuple(x_q.shape)} does not match its geometry")
    if bias_i32 is not None and (
        bias_i32.dtype != torch.int32 or tuple(bias_i32.shape) != (geo.out_channels,)
    ):
        raise ValueError(
            f"asic: conv bias must be int32 [C_out]=({geo.out_channels},), got "
            f"{bias_i32.dtype} of shape {tuple(bias_i32.shape)}"
        )


def _abs_max(t: torch.Tensor) -> int:
    return int(t.to(torch.int64).abs().max()) if t.numel() else 0
