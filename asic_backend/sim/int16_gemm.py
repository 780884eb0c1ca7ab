"""The ``int16`` host kernel: the DUT's int8 × int8 → int32 GEMM in native code, for a CPU
without an int8 dot-product unit (AVX2 alone).

``int16_gemm.c`` widens each int8 value to int16 and multiplies with AVX2's ``vpmaddwd``,
which adds the products of neighbouring pairs into int32: exact for every reduction length the
int32 path takes, in any order, as ``torch._int_mm`` is. On such a CPU ``torch._int_mm`` has no
fast kernel (10 to 30 times slower than a float32 GEMM), and the ``float32`` kernel reads a
float32 copy of each weight, 4 bytes a value where this one reads its int8 packing: at decode a
GEMV is as fast as its weight's bytes go by.

A weight is packed once (:func:`pack`; :mod:`asic_backend.sim.host_gemm` keeps it while the weight
is unchanged), the activations are widened into this thread's reused buffer on each call. The C
file is built into the native host passes' library (:mod:`asic_backend.sim.host_passes`), with
``-march=native``: on a CPU or a build without AVX2, :func:`available` is False and the kernel
is not used.

>>> available()                              # a C compiler and an AVX2 CPU
True
>>> mm(a_q, pack(w_q)).dtype                 # a_q int8 [M, K], w_q int8 [N, K]
torch.int32
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from asic_backend.sim import host_passes
from asic_backend.sim.host import INT16_PACK_SLOT, int16_activations, operand
from asic_backend.sim.native_gemm import (
    PARALLEL_MIN_MACS,
    accumulator,
    check_int8,
    check_product,
    finished,
    gemm_threads,
)

__all__ = [
    "PARALLEL_MIN_MACS",
    "Packed",
    "available",
    "conv_input",
    "gemm_threads",
    "mm",
    "pack",
    "pack_conv",
    "unavailable_reason",
]

#: Readable bytes :func:`pack_conv` needs before and after a padded input (it reads 32 at a time).
MARGIN = 32


class Packed(NamedTuple):
    """A weight ``[N, K]`` packed for the kernel (see ``int16_gemm.c``)."""

    #: int8, ``asic_int16_packed_bytes(N, K)`` long (``int16_gemm.c``).
    data: torch.Tensor
    n: int
    k: int


def available() -> bool:
    """Whether this process has the kernel: the native library built, for a CPU with AVX2."""
    return _built() is not None


def unavailable_reason() -> str:
    """Why :func:`available` is False ('' where it is True)."""
    if _built() is not None:
        return ""
    if host_passes.built() is None:
        return f"the native library is not available ({host_passes.build_detail()})"
    return "the native library was built without AVX2 (this CPU or its compiler has none)"


def _built() -> Any:
    native = host_passes.built()
    return native if native is not None and native.int16_available else None


def _library() -> Any:
    native = _built()
    if native is None:
        raise RuntimeError(f"asic: the int16 kernel is not available: {unavailable_reason()}")
    return native


def pack(w_q: torch.Tensor, *, reuse: bool = False) -> Packed:
    """The int8 ``w_q [N, K]`` (any strides: a transposed view of a ``[K, N]`` too) packed.
    ``reuse``: into this thread's reused buffer, for an operand of one call (an activation, a
    convolution's im2col matrix): the packing is then only good until the next ``reuse``."""
    lib = _library()
    check_int8("int16", "a weight", w_q)
    n, k = w_q.shape
    size = (int(lib.int16_packed_bytes(n, k)),)
    data = (
        operand(size, torch.int8, INT16_PACK_SLOT) if reuse else torch.empty(size, dtype=torch.int8)
    )
    if n and k:
        lib.int16_pack(
            w_q.data_ptr(), n, k, w_q.stride(0), w_q.stride(1), data.data_ptr(), gemm_threads(n * k)
        )
    return Packed(data, n, k)


def conv_input(x_q: torch.Tensor, padding: list[tuple[int, int]], value: int) -> torch.Tensor:
    """The int8 ``x_q [N, C, H, W]`` padded with ``value`` (``padding``: (before, after) for H
    and W), contiguous, with :data:`MARGIN` bytes on either side: what :func:`pack_conv` reads."""
    n, c, h, w = x_q.shape
    (top, bottom), (left, right) = padding
    hp, wp = h + top + bottom, w + left + right
    buffer = torch.full((n * c * hp * wp + 2 * MARGIN,), value, dtype=torch.int8)
    padded = buffer[MARGIN : MARGIN + n * c * hp * wp].view(n, c, hp, wp)
    padded[:, :, top : top + h, left : left + w] = x_q
    return padded


def pack_conv(
    plane: torch.Tensor,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    dilation: tuple[int, int],
) -> Packed:
    """The im2col matrix ``[OH·OW, C·KH·KW]`` of one sample of a 2-D conv (K in a weight's own
    order: channel, kernel row, kernel column), packed straight from the sample's padded input
    ``plane`` (int8 ``[C, Hp, Wp]`` of :func:`conv_input`): the matrix is never written (a row
    stride of 1 or 2 takes the vector path). Into this thread's reused buffer, as :func:`pack`
    with ``reuse``."""
    lib = _library()
    if plane.dtype != torch.int8 or plane.dim() != 3 or not plane.is_contiguous():
        layout = "" if plane.is_contiguous() else "non-contiguous "
        raise ValueError(
            f"asic: the int16 conv packing takes a contiguous 3-D int8 input, got {layout}"
            f"{plane.dtype} {list(plane.shape)}"
        )
    start = plane.storage_offset()
    if plane.numel() and (
        start < MARGIN or plane.untyped_storage().nbytes() < start + plane.numel() + MARGIN
    ):
        raise ValueError(
            f"asic: the int16 conv packing reads {MARGIN} bytes on either side of its input: "
            "pad it with int16_gemm.conv_input"
        )
    c, hp, wp = plane.shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    if min(kh, kw, sh, sw, dh, dw) < 1 or hp < dh * (kh - 1) + 1 or wp < dw * (kw - 1) + 1:
        raise ValueError(
            f"asic: a {kh}x{kw} kernel of dilation {dh}x{dw} and stride {sh}x{sw} does not fit "
            f"a {hp}x{wp} input"
        )
    oh, ow = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    n, k = oh * ow, c * kh * kw
    data = operand((int(lib.int16_packed_bytes(n, k)),), torch.int8, INT16_PACK_SLOT)
    if not k:  # no channels: an empty sum, whose GEMM writes zeros
        return Packed(data, n, k)
    failed = lib.int16_pack_conv(
        plane.data_ptr(),
        c,
        hp,
        wp,
        kh,
        kw,
        sh,
        sw,
        dh,
        dw,
        oh,
        ow,
        data.data_ptr(),
        gemm_threads(n * k),
    )
    if failed:
        raise MemoryError(f"asic: the int16 conv packing could not allocate {k} offsets")
    return Packed(data, n, k)


def mm(a_q: torch.Tensor, w: Packed, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a_q [M, K] · wᵀ`` of int8 values as int32 ``[M, N]``, exactly (the caller guarantees
    ``K <= INT_MM_MAX_K``: no sum overflows int32): into ``out`` if given (int32 ``[M, N]``)."""
    lib = _library()
    check_product("int16", a_q, w.n, w.k, out)
    m, k = a_q.shape
    result = accumulator(out, m, w.n)
    if m and w.n:  # K = 0: the kernel writes zeros
        a = a_q if a_q.stride(1) == 1 else a_q.contiguous()
        a16 = int16_activations(m, k)
        lib.int16_gemm(
            a.data_ptr(),
            m,
            k,
            a.stride(0),
            w.data.data_ptr(),
            w.n,
            result.data_ptr(),
            result.stride(0),
            a16.data_ptr(),
            gemm_threads(m * w.n * k),
        )
    return finished(out, result)
