"""The host passes around a DUT GEMM, fused in native code: one loop where eager takes 4 to 9
aten kernels.

A dynamic int8 layer quantizes its activations before the DUT's GEMM (max |x| per row, a scale,
a multiply, rounding, clamping, a cast: nine kernels in eager) and rescales the int32 result
after it (a cast, two multiplies, the bias: four). Each kernel is a pass over the tensor and,
in a decode step, a dispatch whose code and data are out of the CPU's caches; together they
cost up to a fifth of the GEMM. ``host_passes.c`` does each side in one loop over a row, with
the aten formula's arithmetic in its order (bit for bit: the tests run both against each other
and against the golden model). A convolution's rescale is one loop a plane
(:func:`scale_planes`), and a depthwise 2-D convolution is quantized, convolved and rescaled in
one (:func:`depthwise_conv`), its quantized values never leaving the CPU's caches.

The C file is built with the system's C compiler the first time a process needs it (0.3 s
on the AVX-512 VNNI host), into one library with the int16 and amx host GEMMs
(:mod:`asic_backend.sim.int16_gemm`, :mod:`asic_backend.sim.amx_gemm`), and kept in
``$XDG_CACHE_HOME/asic_backend`` (``~/.cache/asic_backend``), one file per source, compiler,
flags and CPU (it is built for this CPU: ``-march=native``);
a build must round a row of halves, signed zeros and clamped values as torch does before it is
used.
``$ASIC_HOST_PASSES`` chooses: ``auto`` (the default: native if it builds, else the aten
kernels), ``native`` (a failed build is an error) or ``aten``. It is read at a process's first
pass and again after :func:`reset` (the pytest plugin resets at a run's start and end);
:func:`forced` overrides it in a block.

The fused passes take the common case: float32, two-dimensional (or a batch of matrices, for
the rescale of attention's scores), rows of unit stride, no tracing. Anything else returns
None and its caller runs the aten kernels, as it does for a row holding inf or NaN.

>>> mode()                                    # with a C compiler on the machine
'native'
>>> q, scale = quantize_sym(torch.randn(8, 64), eps=1e-7)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import math
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import _disable_current_modes

from asic_backend.sim.host import (
    Overrides,
    amx_activations,
    cpu_flags,
    int16_activations,
    plain,
    scratch,
)

__all__ = [
    "DEPTHWISE_MAX_TAPS",
    "ENV_VAR",
    "MODES",
    "PARALLEL_MIN_NUMEL",
    "NativeGemm",
    "TiledGemm",
    "build_detail",
    "built",
    "depthwise_conv",
    "describe",
    "forced",
    "linear",
    "mode",
    "quantize_sym",
    "reset",
    "scale_planes",
    "scale_rows",
]

#: The passes' implementations, by name.
MODES: tuple[str, ...] = ("native", "aten")
#: The environment variable that chooses one (or ``auto``).
ENV_VAR = "ASIC_HOST_PASSES"
#: From this many values on, a pass shares its rows among torch's threads; below, starting
#: them costs more than they save.
PARALLEL_MIN_NUMEL = 1 << 16

#: Always: IEEE float32 in the source's order (no fast math, whatever ``$CC`` says, and no fused
#: multiply-add: it rounds once where the aten formula rounds twice); an int32 accumulator
#: rescaled in its own memory is read through one pointer type and written through another.
_BASE_FLAGS = (
    "-O3",
    "-fno-fast-math",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-fPIC",
    "-shared",
)
#: Tried in order; the first that builds is used (a compiler may lack OpenMP or -march=native).
#: 512-bit vectors where the CPU has them (GCC's default is 256): the row quantization of a
#: 512 x 8192 prefill activation took 0.75x the time (Xeon with AMX, one thread); the values
#: are the same, each lane's IEEE operations in the same order.
_OPTIONAL_FLAGS = (
    ("-march=native", "-mprefer-vector-width=512", "-fopenmp"),
    ("-march=native", "-fopenmp"),
    ("-fopenmp",),
    ("-march=native",),
    (),
)
#: Built into one library: the passes, and the int16 and amx host GEMMs
#: (:mod:`asic_backend.sim.int16_gemm`, :mod:`asic_backend.sim.amx_gemm`).
_SOURCES = ("host_passes.c", "int16_gemm.c", "amx_gemm.c")
_BUILD_TIMEOUT_S = 120

_forced = Overrides()

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int


class _Native(NamedTuple):
    quantize_sym_f32: Callable[..., Any]
    quantize_sym_cols_f32: Callable[..., Any]
    scale_i32: Callable[..., Any]
    scale_f32: Callable[..., Any]
    depthwise_f32: Callable[..., Any]
    #: Whether the build has the int16 host GEMM (it targets AVX2).
    int16_available: bool
    int16_packed_bytes: Callable[..., Any]
    int16_pack: Callable[..., Any]
    int16_pack_conv: Callable[..., Any]
    int16_gemm: Callable[..., Any]
    linear_int16: Callable[..., Any]
    #: Whether the build has the amx host GEMM (the CPU has AMX); and the call that asks Linux
    #: for AMX's tiles, at the kernel's first use (1: granted; :mod:`asic_backend.sim.amx_gemm`).
    amx_built: bool
    amx_request: Callable[..., Any]
    amx_a_bytes: Callable[..., Any]
    amx_packed_bytes: Callable[..., Any]
    amx_pack: Callable[..., Any]
    amx_gemm: Callable[..., Any]
    linear_amx: Callable[..., Any]
    built_with: str


class _Build(NamedTuple):
    native: _Native | None
    detail: str  # how it was built, or why it was not


def mode() -> str:
    """``"native"`` or ``"aten"``: what this process uses (see the module docstring). A bad
    ``$ASIC_HOST_PASSES`` is a ``ValueError`` naming the allowed values; ``native`` that does
    not build is a ``RuntimeError`` with the compiler's message."""
    if (forced_name := _forced.current()) is not None:
        return forced_name
    return _configured()[1]


def describe() -> str:
    """One line for report headers: the implementation and why."""
    forced_name = _forced.current()  # once: another thread's block may end meanwhile
    if forced_name is not None:
        return f"{forced_name} (forced)"
    spec, name = _configured()  # the reading mode() keeps, not the variable as it is now
    if spec != "auto":
        return f"{name} (${ENV_VAR}={spec})"
    return f"{name} (auto: {_build().detail})"


def built() -> _Native | None:
    """The native library, built (or loaded) at its first use; None where it does not build.
    Whatever :func:`mode` says: it also holds the int16 host GEMM."""
    return _build().native


def build_detail() -> str:
    """How the native library was built, or why it was not."""
    return _build().detail


def reset() -> None:
    """Forget the choice and the build: the next pass reads ``$ASIC_HOST_PASSES`` and looks for
    the build again (a built copy is loaded, not rebuilt). The host GEMM kernel, which may be
    the build's (``int16``), follows."""
    _configured.cache_clear()
    _build.cache_clear()


@contextlib.contextmanager
def forced(name: str) -> Iterator[None]:
    """Use ``name``'s passes in the block, in every thread (tests compare the two):
    :class:`~asic_backend.sim.host.Overrides`."""
    if name not in MODES:
        raise ValueError(f"unknown host passes {name!r}; known: {', '.join(MODES)}")
    if name == "native":
        _require_native()
    with _forced.held(name):
        yield


def quantize_sym(
    x: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``quantize_sym_rows(x, out=out)`` of a float32 ``[M, K]`` ``x`` (K ≥ 2, rows of unit
    stride) in one loop a row, scales floored at ``eps``: ``(q, scale [M, 1])``, ``q`` int8 or,
    with ``out`` (float32, contiguous, ``x``'s shape), ``out`` holding the same values. None
    where the fused pass does not apply (the caller runs the aten kernels)."""
    native = _rows_native(x)
    if native is None:
        return None
    if out is None:
        q = torch.empty(x.shape, dtype=torch.int8)
    elif _f32(out, tuple(x.shape)):
        q = out
    else:
        return None
    return _quantize(native, x, q, eps)


class NativeGemm(NamedTuple):
    """A linear's GEMM by a weight packed for a native kernel (``int16``:
    :func:`asic_backend.sim.int16_gemm.pack`; ``amx``: :func:`asic_backend.sim.amx_gemm.pack`),
    which :func:`linear` runs inside its own native call, between the quantization and the
    rescale."""

    #: ``int16`` or ``amx``.
    kernel: str
    #: The packing's bytes, of a weight ``[n, k]``.
    packed: torch.Tensor
    n: int
    k: int
    #: The threads the kernel shares the GEMM among.
    threads: int
    #: Records the GEMM on the device, once it ran.
    record: Callable[[], None]


class TiledGemm(NamedTuple):
    """A linear's GEMM by a kept weight in tiles of its output, which :func:`linear` rescales
    each while it is still in the CPU's cache: the int32 product is never written whole to
    memory and read back. Same values as the GEMM in one call."""

    #: ``tile(q, j0, j1)``: the int32 product of int8 rows ``q`` (contiguous) by the weight's
    #: output columns ``j0:j1``, contiguous, valid until the next call.
    tile: Callable[[torch.Tensor, int, int], torch.Tensor]
    n: int
    #: The most rows and columns of a tile.
    rows: int
    columns: int
    #: Records the whole GEMM on the device, once it ran.
    record: Callable[[], None]


def linear(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    prepare: Callable[
        [],
        tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor] | NativeGemm | TiledGemm] | None,
    ],
) -> torch.Tensor | None:
    """A dynamic int8 linear's host passes around its GEMM, each operand checked once:
    :func:`quantize_sym` of ``x`` (int8), the GEMM, then :func:`scale_rows` by the rows'
    scales, the weight's and ``bias`` (float32 ``[N]``, or None): float32 ``[M, N]``, new.
    ``prepare()``, called once ``x`` passes (so a declined call spares the caller's weight
    lookups), gives the weight's float32 scales (``[N]``, one a column) and the GEMM:
    ``gemm(q)`` is the int32 ``[M, N]`` of the int8 ``q`` (contiguous, or float32 holding those
    values), or a :class:`NativeGemm`: then the three steps are one native call, the
    quantization writing the kernel's activations itself, or a :class:`TiledGemm`: then
    each tile of the product is rescaled as soon as it is computed. None, without calling
    ``gemm``, where they do not apply, or where ``prepare`` gives None: the caller runs its
    general path, with the same values.

    A decode step runs one linear after another, each streaming its weight through the CPU's
    caches, so each Python object and each torch function a linear touches on the way is a
    cache miss: the two passes' own checks, apart, cost more than the passes."""
    native = _rows_native(x)
    prepared = None if native is None else prepare()
    if native is None or prepared is None:
        return None
    w_scale, gemm = prepared
    n = w_scale.shape[0] if w_scale.dim() == 1 else -1
    w_step = _step(w_scale, n, (n,)) if n >= 0 else None
    if w_step is None or (bias is not None and not _f32(bias, (n,))):
        return None
    if isinstance(gemm, NativeGemm):
        return _linear_native(native, x, gemm, w_scale, w_step, bias, eps)
    quantized = _quantize(native, x, torch.empty(x.shape, dtype=torch.int8), eps)
    if quantized is None:
        return None
    q, x_scale = quantized
    if isinstance(gemm, TiledGemm):
        return _linear_tiled(native, q, x_scale, gemm, w_scale, w_step, bias)
    acc = gemm(q)
    run = _scale_kernel(native, acc.dtype)
    if run is None or not acc.is_contiguous() or tuple(acc.shape) != (x.shape[0], n):
        raise TypeError(f"asic: a linear's GEMM gave {acc.dtype} {list(acc.shape)}")
    y = torch.empty(acc.shape, dtype=torch.float32)
    _scale(run, acc, x_scale, 1, w_scale, w_step, 0, bias, y)
    return y


def _linear_tiled(
    native: _Native,
    q: torch.Tensor,
    x_scale: torch.Tensor,
    gemm: TiledGemm,
    w_scale: torch.Tensor,
    w_step: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`linear`'s GEMM and rescale tile by tile (:class:`TiledGemm`): each tile's rows'
    scales, columns' scales and bias are the whole layer's from the tile's first row and
    column on, and its rescale writes into the output's rows, ``n`` values apart."""
    rows, n = q.shape[0], gemm.n
    if n != w_scale.numel():
        raise TypeError(
            f"asic: a linear's tiled GEMM has {n} columns where the weight has"
            f" {w_scale.numel()} scales"
        )
    y = torch.empty((rows, n), dtype=torch.float32)
    # Blocks of equal rows: a last block of a few rows would run the GEMM at its worst.
    blocks = -(-rows // gemm.rows)
    block = -(-rows // blocks)
    f32 = torch.float32.itemsize  # the offsets below are into float32 arrays
    for j0 in range(0, n, gemm.columns):
        j1 = min(n, j0 + gemm.columns)
        for r0 in range(0, rows, block):
            r1 = min(rows, r0 + block)
            acc = gemm.tile(q[r0:r1], j0, j1)
            if (
                acc.dtype != torch.int32
                or not acc.is_contiguous()
                or acc.shape != (r1 - r0, j1 - j0)
            ):
                raise TypeError(f"asic: a linear's GEMM tile gave {acc.dtype} {list(acc.shape)}")
            native.scale_i32(
                acc.data_ptr(),
                r1 - r0,
                j1 - j0,
                x_scale.data_ptr() + f32 * r0,
                1,
                w_scale.data_ptr() + f32 * j0 * w_step,
                w_step,
                0,
                None if bias is None else bias.data_ptr() + f32 * j0,
                0,
                1,
                y.data_ptr() + f32 * (r0 * n + j0),
                n,
                _threads(acc.numel()),
            )
    gemm.record()
    return y


def _linear_native(
    native: _Native,
    x: torch.Tensor,
    gemm: NativeGemm,
    w_scale: torch.Tensor,
    w_step: int,
    bias: torch.Tensor | None,
    eps: float,
) -> torch.Tensor | None:
    """:func:`linear` by a weight packed for a native kernel, its operands checked: one native
    call (``asic_linear_int16``, ``asic_linear_amx``), so a decode step's linear touches one
    Python frame and one foreign call where the steps apart took three of each, and the
    activations are never written as int8 to be read again. None for a row of inf or NaN, the
    GEMM not run, or where the build has not the kernel."""
    rows, k = x.shape
    if gemm.k != k or gemm.n != w_scale.shape[0]:
        return None
    x_scale = torch.empty((rows, 1), dtype=torch.float32)
    y = torch.empty((rows, gemm.n), dtype=torch.float32)
    bias_ptr = None if bias is None else bias.data_ptr()
    if gemm.kernel == "amx":
        if not native.amx_built:
            return None
        a = amx_activations(int(native.amx_a_bytes(rows, k)))
        bad = native.linear_amx(
            *(x.data_ptr(), rows, k, x.stride(0), gemm.packed.data_ptr(), gemm.n),
            *(w_scale.data_ptr(), w_step, bias_ptr, eps, x_scale.data_ptr(), a.data_ptr()),
            *(y.data_ptr(), _threads(x.numel()), gemm.threads),
        )
    else:
        if not native.int16_available:
            return None
        a16 = int16_activations(rows, k)
        acc = scratch((rows, gemm.n), torch.int32)
        bad = native.linear_int16(
            *(x.data_ptr(), rows, k, x.stride(0), gemm.packed.data_ptr(), gemm.n),
            *(w_scale.data_ptr(), w_step, bias_ptr, eps, x_scale.data_ptr(), a16.data_ptr()),
            *(acc.data_ptr(), y.data_ptr(), _threads(x.numel()), gemm.threads),
            _threads(y.numel()),
        )
    if bad:
        return None
    gemm.record()
    return y


def quantize_sym_cols(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each column of each matrix of a contiguous float32 ``[B, K, N]`` ``x`` quantized as
    :func:`quantize_sym` quantizes a row (``quantize_sym_rows`` of ``x.mT``), in one pass over
    ``x`` as it lies: ``(q int8 [B, K, N] in x's layout, scale [B, 1, N])``. A matmul's right
    operand is quantized per column (attention's V); a row-major pass would first copy it
    transposed, which took 26 of a 2048-token decode attention's 35 ms (one thread, AVX-512
    host). None where the fused pass does not apply."""
    if x.dtype != torch.float32 or x.dim() != 3 or not x.is_contiguous() or not plain(x):
        return None
    native = _active()  # after the checks: a traced call never loads the library
    if native is None:
        return None
    batch, k, n = x.shape
    if k < 2 or batch * n == 0:
        return None
    q = torch.empty((batch, k, n), dtype=torch.int8)
    scale = torch.empty((batch, 1, n), dtype=torch.float32)
    bad = native.quantize_sym_cols_f32(
        x.data_ptr(), batch, k, n, q.data_ptr(), scale.data_ptr(), eps, _threads(x.numel())
    )
    return None if bad else (q, scale)


def scale_rows(
    acc: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    in_place: bool,
) -> torch.Tensor | None:
    """``numerics.scale_acc(acc, a_scale, b_scale, bias=bias)`` of a contiguous ``[M, N]``
    int32 or float32 ``acc`` in one loop a row: float32, in ``acc``'s own memory if
    ``in_place``, else new. ``a_scale``: float32, one a row (``[M, 1]``) or one for all;
    ``b_scale``: float32, one a column (``[N]``, ``[1, N]``) or one for all; ``bias``: float32
    ``[N]``. A batch ``[B, M, N]`` (attention's scores, ``dyn_matmul``) takes one scale a row
    (``[B, M, 1]``) and one a column of each matrix (``[B, 1, N]``), without a bias. None where
    the fused pass does not apply."""
    if acc.dim() not in (2, 3) or not acc.is_contiguous() or not plain(acc):
        return None
    native = _active()  # after the checks: a traced call never loads the library
    if native is None:
        return None
    run = _scale_kernel(native, acc.dtype)
    *batch, m, n = acc.shape
    if batch:
        rows, b_rows = batch[0] * m, m
        a_step = _step(a_scale, rows, (batch[0], m, 1))
        b_step = _step(b_scale, batch[0] * n, (batch[0], 1, n))
        ok = bias is None and a_step == 1 and b_step == 1
    else:
        b_rows = 0
        a_step = _step(a_scale, m, (m, 1))
        b_step = _step(b_scale, n, (n,), (1, n))
        ok = bias is None or _f32(bias, (n,))
    if run is None or not ok or a_step is None or b_step is None:
        return None
    if not in_place:
        y = torch.empty(acc.shape, dtype=torch.float32)
    else:
        y = acc if acc.dtype == torch.float32 else acc.view(torch.float32)
    _scale(run, acc, a_scale, a_step, b_scale, b_step, b_rows, bias, y)
    return y


def scale_planes(
    acc: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, *, out: torch.Tensor | None
) -> torch.Tensor | None:
    """A convolution's rescale, ``acc·scale[n, c] + bias[c]`` in float32 (rounded after the
    product and after the sum), of a contiguous ``[N, C, *size]`` int32 or float32 ``acc`` in
    one loop a plane: into ``out`` (float32, contiguous, ``acc``'s shape) if given, else in
    ``acc``'s own memory if float32, else new. ``scale``: float32 ``[N, C, 1, ...]``, contiguous;
    ``bias``: float32 ``[C]``. None where the fused pass does not apply."""
    if acc.dim() < 3 or not acc.is_contiguous() or not plain(acc):
        return None
    native = _active()  # after the checks: a traced call never loads the library
    if native is None:
        return None
    run = _scale_kernel(native, acc.dtype)
    batch, channels = acc.shape[0], acc.shape[1]
    planes = batch * channels
    a_step = _step(scale, planes, (batch, channels, *[1] * (acc.dim() - 2)))
    if run is None or planes == 0 or a_step is None:
        return None
    if bias is not None and not _f32(bias, (channels,)):
        return None
    if out is None:
        y = acc if acc.dtype == torch.float32 else torch.empty(acc.shape, dtype=torch.float32)
    elif _f32(out, tuple(acc.shape)):
        y = out
    else:
        return None
    # One bias a plane: a [N·C] vector, N·C values (a row of the loop is a plane).
    bias_rows = None if bias is None else bias.repeat(batch)
    bias_ptr = None if bias_rows is None else bias_rows.data_ptr()
    size = acc.numel() // planes
    run(
        acc.data_ptr(),
        planes,
        size,
        scale.data_ptr(),
        a_step,
        None,
        0,
        0,
        bias_ptr,
        1,
        0,
        y.data_ptr(),
        size,
        _threads(acc.numel()),
    )
    return y


#: The largest kernel area :func:`depthwise_conv` takes: its float32 sums of at most this many
#: products of 2^14 stay within 2^24, exact in any order.
DEPTHWISE_MAX_TAPS = 1024


def depthwise_conv(
    x: torch.Tensor,
    w_f32: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    stride: tuple[int, int],
    padding: tuple[tuple[int, int], tuple[int, int]],
    dilation: tuple[int, int],
    out_size: tuple[int, int],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A depthwise 2-D convolution's whole host side in one loop a plane: ``x`` (float32
    ``[N, C, H, W]``, contiguous) quantized per sample as :func:`quantize_sym` quantizes its
    rows, each channel convolved with its int8 weights ``w_f32`` (float32 ``[C, 1, kh, kw]``,
    contiguous, holding the int8 values), the exact sums rescaled by ``x_scale[n]·w_scale[c]``
    and ``bias[c]`` (float32 ``[C]``) as ``ops.conv`` rescales an accumulator. Returns
    ``(y [N, C, *out_size], x_scale [N, 1])``, or None where it does not apply: the caller runs
    the quantization, the convolution and the rescale apart, with the same values. Each plane's
    quantized values stay in the CPU's caches from quantization to rescale, where apart they
    make three passes over memory."""
    if x.dtype != torch.float32 or x.dim() != 4 or not plain(x):
        return None
    native = _active()  # after the checks: a traced call never loads the library
    if native is None:
        return None
    n, c, h, w = x.shape
    kh, kw = w_f32.shape[2:]
    if n == 0 or c == 0 or not x.is_contiguous() or kh * kw > DEPTHWISE_MAX_TAPS:
        return None
    if not _f32(w_f32, (c, 1, kh, kw)) or _step(w_scale, c, (c,)) != 1:
        return None
    if bias is not None and not _f32(bias, (c,)):
        return None
    (sh, sw), ((pt, _), (pl, _)), (dh, dw), (oh, ow) = stride, padding, dilation, out_size
    threads = _threads(x.numel())
    padded = ((oh - 1) * sh + (kh - 1) * dh + 1) * ((ow - 1) * sw + (kw - 1) * dw + 1)
    scratch = torch.empty(threads * (padded + ow), dtype=torch.float32)
    y = torch.empty((n, c, oh, ow), dtype=torch.float32)
    x_scale = torch.empty((n, 1), dtype=torch.float32)
    bias_ptr = None if bias is None else bias.data_ptr()
    bad = native.depthwise_f32(
        x.data_ptr(), n, c, h, w, w_f32.data_ptr(), kh, kw, sh, sw, dh, dw, pt, pl, oh, ow,
        w_scale.data_ptr(), bias_ptr, eps, x_scale.data_ptr(), y.data_ptr(), scratch.data_ptr(),
        threads,
    )  # fmt: skip
    return None if bad else (y, x_scale)


# -- when the fused passes apply ------------------------------------------------------------------


def _active() -> _Native | None:
    if mode() != "native":
        return None
    return _build().native


def _rows_native(x: torch.Tensor) -> _Native | None:
    """The library, where the native passes are on and ``x`` is a matrix the row passes take:
    float32 ``[M, K]``, M ≥ 1, K ≥ 2, rows of unit stride, :func:`plain`."""
    if x.dtype != torch.float32 or x.dim() != 2 or not plain(x):
        return None
    native = _active()  # after the checks: a traced call never loads the library
    rows, k = x.shape
    if native is None or k < 2 or rows == 0 or x.stride(1) != 1:
        return None
    return native


def _quantize(
    native: _Native, x: torch.Tensor, q: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The row quantization of ``x`` (checked: :func:`_rows_native`) into ``q`` (int8, or
    float32: contiguous, ``x``'s shape): ``(q, scale [M, 1])``, None for a row of inf or NaN."""
    rows, k = x.shape
    scale = torch.empty((rows, 1), dtype=torch.float32)
    q_int8, q_f32 = (q.data_ptr(), None) if q.dtype == torch.int8 else (None, q.data_ptr())
    bad = native.quantize_sym_f32(
        x.data_ptr(),
        rows,
        k,
        x.stride(0),
        q_int8,
        q_f32,
        scale.data_ptr(),
        eps,
        _threads(x.numel()),
    )
    return None if bad else (q, scale)


def _scale(
    run: Callable[..., Any],
    acc: torch.Tensor,
    a_scale: torch.Tensor,
    a_step: int,
    b_scale: torch.Tensor,
    b_step: int,
    b_rows: int,
    bias: torch.Tensor | None,
    y: torch.Tensor,
) -> None:
    """The rescale loop ``run`` of a contiguous ``acc`` (its last dim the columns) into ``y``,
    the operands checked (:func:`scale_rows`)."""
    n = acc.shape[-1]
    run(
        acc.data_ptr(),
        acc.numel() // n if n else 0,
        n,
        a_scale.data_ptr(),
        a_step,
        b_scale.data_ptr(),
        b_step,
        b_rows,
        None if bias is None else bias.data_ptr(),
        0,
        1,
        y.data_ptr(),
        n,
        _threads(acc.numel()),
    )


def _f32(t: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """Whether ``t`` is a plain contiguous float32 tensor of ``shape``: an operand (a bias, a
    weight) or an output the native loops read or write as a flat array."""
    return plain(t) and t.dtype == torch.float32 and tuple(t.shape) == shape and t.is_contiguous()


def _scale_kernel(native: _Native, dtype: torch.dtype) -> Callable[..., Any] | None:
    """The rescale loop for an accumulator of ``dtype`` (int32, or float32 holding its values)."""
    return {torch.int32: native.scale_i32, torch.float32: native.scale_f32}.get(dtype)


def _step(t: torch.Tensor, length: int, *shapes: tuple[int, ...]) -> int | None:
    """1 if float32 ``t`` holds one value per index (one of ``shapes``, contiguous), 0 if one
    for all, None otherwise."""
    if not plain(t) or t.dtype != torch.float32:
        return None
    if t.numel() == 1:
        return 0
    if tuple(t.shape) in shapes and t.numel() == length and t.is_contiguous():
        return 1
    return None


def _threads(numel: int) -> int:
    return torch.get_num_threads() if numel >= PARALLEL_MIN_NUMEL else 1


# -- choosing and building ---------------------------------------------------------------------


def _spec() -> str:
    return os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"


@functools.cache
def _configured() -> tuple[str, str]:
    """``$ASIC_HOST_PASSES`` as read, and the passes it gives."""
    spec = _spec()
    if spec == "auto":
        return spec, "native" if _build().native is not None else "aten"
    if spec not in MODES:
        raise ValueError(f"${ENV_VAR}={spec!r} is not one of {', '.join((*MODES, 'auto'))}")
    if spec == "native":
        _require_native()
    return spec, spec


def _require_native() -> None:
    build = _build()
    if build.native is None:
        raise RuntimeError(f"asic: the native host passes are not available: {build.detail}")


@functools.cache
def _build() -> _Build:
    """Load the native passes, building them first if this machine has no copy yet; a failure
    of any kind is the reason the aten kernels run (or, asked for native, the error)."""
    try:
        return _try_build()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return _Build(None, f"{type(exc).__name__}: {exc}")


def _try_build() -> _Build:
    compiler = _compiler()
    if compiler is None:
        return _Build(None, "no C compiler found ($CC, cc, gcc, clang)")
    package = resources.files("asic_backend.sim")
    sources = {name: package.joinpath(name).read_bytes() for name in _SOURCES}
    cache = _cache_dir()
    errors = []
    for optional in _OPTIONAL_FLAGS:
        flags = (*_BASE_FLAGS, *optional)
        target = cache / f"host_passes-{_key(sources, compiler, flags)}.so"
        if not target.exists():
            error = _compile(compiler, flags, sources, target)
            if error is not None:
                errors.append(error)
                continue
        try:
            native = _load(target, f"{Path(compiler[0]).name} {' '.join(flags)}")
        except OSError as exc:
            errors.append(f"{target}: {exc}")
            continue
        wrong = _self_check(native)
        if wrong:
            errors.append(f"{shlex.join([*compiler, *flags])}: its self-check failed ({wrong})")
            continue
        return _Build(native, f"built with {native.built_with}")
    return _Build(None, f"the build failed: {errors[0]}")


def _compiler() -> list[str] | None:
    candidates = [shlex.split(os.environ.get("CC", ""))] + [
        [name] for name in ("cc", "gcc", "clang")
    ]
    for words in candidates:
        if words and (path := shutil.which(words[0])):
            return [path, *words[1:]]
    return None


def _cache_dir() -> Path:
    """The user's cache, else a directory of this user's own in the temporary directory (made
    private, and trusted only if it is: a library loaded from it runs as this user)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    home = Path(root) / "asic_backend"
    with contextlib.suppress(OSError):
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return home
    private = Path(tempfile.gettempdir()) / f"asic_backend-{os.getuid()}"
    with contextlib.suppress(OSError):
        private.mkdir(mode=0o700, exist_ok=True)
        info = private.stat()
        if info.st_uid == os.getuid() and not info.st_mode & 0o022:
            return private
    raise RuntimeError("no writable cache directory of this user's for the native host passes")


def _key(sources: dict[str, bytes], compiler: list[str], flags: tuple[str, ...]) -> str:
    """A build's identity: the sources, the compiler, the flags and, for -march=native, the CPU
    (a cache shared among machines must not hand one CPU's instructions to another)."""
    digest = hashlib.sha256()
    for name, text in sorted(sources.items()):
        digest.update(name.encode() + b"\0" + text)
    cpu = " ".join(cpu_flags()) or f"{platform.machine()} {platform.processor()}"
    for part in (*compiler, *flags, cpu):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:16]


def _compile(
    compiler: list[str], flags: tuple[str, ...], sources: dict[str, bytes], target: Path
) -> str | None:
    """Build ``target``; None, or the compiler's complaint. The file appears whole or not at
    all (parallel test workers build at once)."""
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        for name, text in sources.items():
            (Path(work) / name).write_bytes(text)
        built = Path(work) / target.name
        command = [*compiler, *flags, *(str(Path(work) / name) for name in sources)]
        command += ["-o", str(built)]
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{shlex.join(command)}: {exc}"
        if run.returncode != 0:
            lines = (run.stderr or run.stdout).strip().splitlines() or [f"exit {run.returncode}"]
            return f"{shlex.join(command)}: {lines[0]}"
        os.replace(built, target)
    return None


#: A row whose maximum, 127.5, makes the scale exactly 1: every value is its own
#: ``x · (1/scale)``, so the rounding is seen bare: halves to even, the signs of zeros, the
#: clamp at both ends. The expected int8 and float32 results are the aten kernels'.
_CHECK_ROW = (127.5, -127.5, 0.5, -0.5, 1.5, 2.5, -2.5, -0.0, -0.25, 3.49999976, 126.5, -1e-45)
_CHECK_Q = (127, -128, 0, 0, 2, 2, -2, 0, 0, 3, 126, 0)
_CHECK_Q_F32 = (127.0, -128.0, 0.0, -0.0, 2.0, 2.0, -2.0, -0.0, -0.0, 3.0, 126.0, -0.0)


def _self_check(native: _Native) -> str | None:
    """What the build gets wrong of :data:`_CHECK_ROW`'s quantization (a compiler that folds
    ``(v + 1.5·2^23) - 1.5·2^23`` or rounds otherwise), or None."""
    with _disable_current_modes():  # real tensors, whatever mode the first use came in
        return _check_rows(native)


def _check_rows(native: _Native) -> str | None:
    x = torch.tensor([_CHECK_ROW], dtype=torch.float32)
    k = x.shape[1]
    q = torch.empty((1, k), dtype=torch.int8)
    q_f32 = torch.empty((1, k), dtype=torch.float32)
    scale = torch.empty((1, 1), dtype=torch.float32)
    native.quantize_sym_f32(x.data_ptr(), 1, k, k, q.data_ptr(), None, scale.data_ptr(), 1e-7, 1)
    native.quantize_sym_f32(
        x.data_ptr(), 1, k, k, None, q_f32.data_ptr(), scale.data_ptr(), 1e-7, 1
    )
    if scale.item() != 1.0 or tuple(q[0].tolist()) != _CHECK_Q:
        return f"int8 {q[0].tolist()}, scale {scale.item()}"
    got = [(v, math.copysign(1.0, v)) for v in q_f32[0].tolist()]
    if got != [(v, math.copysign(1.0, v)) for v in _CHECK_Q_F32]:
        return f"float32 {q_f32[0].tolist()}"
    return None


def _load(path: Path, built_with: str) -> _Native:
    lib = ctypes.CDLL(str(path))
    quantize = lib.asic_quantize_sym_f32
    quantize.argtypes = [_P, _I64, _I64, _I64, _P, _P, _P, ctypes.c_float, _INT]
    quantize.restype = _I64
    quantize_cols = lib.asic_quantize_sym_cols_f32
    quantize_cols.argtypes = [_P, _I64, _I64, _I64, _P, _P, ctypes.c_float, _INT]
    quantize_cols.restype = _I64
    scales = []
    for name in ("asic_scale_i32", "asic_scale_f32"):
        fn = getattr(lib, name)
        fn.argtypes = [_P, _I64, _I64, _P, _I64, _P, _I64, _I64, _P, _I64, _I64, _P, _I64, _INT]
        fn.restype = None
        scales.append(fn)
    depthwise = lib.asic_depthwise_f32
    depthwise.argtypes = [
        _P,
        *[_I64] * 4,
        _P,
        *[_I64] * 10,
        _P,
        _P,
        ctypes.c_float,
        _P,
        _P,
        _P,
        _INT,
    ]
    depthwise.restype = _I64
    available = lib.asic_int16_available
    available.argtypes = []
    available.restype = _INT
    has_int16 = bool(available())
    packed_bytes = lib.asic_int16_packed_bytes
    packed_bytes.argtypes = [_I64, _I64]
    packed_bytes.restype = _I64
    pack = lib.asic_int16_pack
    pack.argtypes = [_P, _I64, _I64, _I64, _I64, _P, _INT]
    pack.restype = None
    pack_conv = lib.asic_int16_pack_conv
    pack_conv.argtypes = [_P, *[_I64] * 11, _P, _INT]
    pack_conv.restype = _INT
    gemm = lib.asic_int16_gemm
    gemm.argtypes = [_P, _I64, _I64, _I64, _P, _I64, _P, _I64, _P, _INT]
    gemm.restype = _I64
    linear_int16 = lib.asic_linear_int16
    linear_int16.argtypes = [
        _P,
        _I64,
        _I64,
        _I64,
        _P,
        _I64,
        _P,
        _I64,
        _P,
        ctypes.c_float,
        *[_P] * 4,
        *[_INT] * 3,
    ]
    linear_int16.restype = _I64
    amx_built, amx_request = lib.asic_amx_built, lib.asic_amx_available
    for fn in (amx_built, amx_request):
        fn.argtypes = []
        fn.restype = _INT
    has_amx = bool(amx_built())
    amx_a_bytes = lib.asic_amx_a_bytes
    amx_packed_bytes = lib.asic_amx_packed_bytes
    for fn in (amx_a_bytes, amx_packed_bytes):
        fn.argtypes = [_I64, _I64]
        fn.restype = _I64
    amx_pack = lib.asic_amx_pack
    amx_pack.argtypes = [_P, _I64, _I64, _I64, _I64, _P, _INT]
    amx_pack.restype = None
    amx_gemm = lib.asic_amx_gemm
    amx_gemm.argtypes = [_P, _I64, _I64, _I64, _P, _I64, _P, _I64, _P, _INT]
    amx_gemm.restype = _I64
    linear_amx = lib.asic_linear_amx
    linear_amx.argtypes = [
        _P,
        _I64,
        _I64,
        _I64,
        _P,
        _I64,
        _P,
        _I64,
        _P,
        ctypes.c_float,
        *[_P] * 3,
        *[_INT] * 2,
    ]
    linear_amx.restype = _I64
    return _Native(
        quantize,
        quantize_cols,
        scales[0],
        scales[1],
        depthwise,
        has_int16,
        packed_bytes,
        pack,
        pack_conv,
        gemm,
        linear_int16,
        has_amx,
        amx_request,
        amx_a_bytes,
        amx_packed_bytes,
        amx_pack,
        amx_gemm,
        linear_amx,
        built_with,
    )
