"""The ``amx`` host kernel: the DUT's int8 × int8 → int32 GEMM in native code, on Intel AMX's
tile unit.

``amx_gemm.c`` multiplies with AMX's ``TDPBSSD`` (signed int8 products summed into int32
tiles): exact for every reduction length the int32 path takes, in any order, as
``torch._int_mm`` is. On the Xeon with AMX, oneDNN's ``torch._int_mm`` reorders its weight on
every call and writes its int32 product through memory; this kernel reads a weight packed once
(:func:`pack`; :mod:`asic_backend.sim.host_gemm` keeps it while the weight is unchanged) and
hands each 32 × 32 block of the product on while it is in L1: to the caller's int32 output
(:func:`mm`), or to a dynamic linear's rescale, the quantization writing its activations
(:func:`asic_backend.sim.host_passes.linear`). Its times against ``torch._int_mm``, fp32 and
TorchAO: ``docs/benchmarks.md`` ("The amx kernel").

The C file is built into the native host passes' library (:mod:`asic_backend.sim.host_passes`)
with ``-march=native``: on a CPU or a build without AMX, or where Linux does not grant the
process AMX's tile state (before 5.16: asked at the first :func:`available`, not at the
library's load), :func:`available` is False and the kernel is not used.

>>> available()                              # a C compiler, Linux and a CPU with AMX
True
>>> mm(a_q, pack(w_q)).dtype                 # a_q int8 [M, K], w_q int8 [N, K]
torch.int32
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import _disable_current_modes

from asic_backend.sim import host_passes
from asic_backend.sim.host import AMX_PACK_SLOT, amx_activations, operand
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
    "gemm_threads",
    "mm",
    "pack",
    "unavailable_reason",
]


class Packed(NamedTuple):
    """A weight ``[N, K]`` packed for the kernel (see ``amx_gemm.c``)."""

    #: int8, ``asic_amx_packed_bytes(N, K)`` long (``amx_gemm.c``).
    data: torch.Tensor
    n: int
    k: int


def available() -> bool:
    """Whether this process has the kernel: the native library built for a CPU with AMX, the
    tiles granted by the OS, and a first product exact (:func:`_exact`)."""
    native = _built()
    return native is not None and _exact(native)


def unavailable_reason() -> str:
    """Why :func:`available` is False ('' where it is True)."""
    if available():
        return ""
    native = host_passes.built()
    if native is None:
        return f"the native library is not available ({host_passes.build_detail()})"
    if not native.amx_built:
        return "the native library was built without AMX (this CPU or its compiler has none)"
    if not _granted(native):
        return "Linux does not grant this process AMX's tiles (it needs 5.16 or later)"
    return "its self-check product was not exact"


def _built() -> Any:
    """The library, where it has the kernel and this process may use AMX's tiles."""
    native = host_passes.built()
    return native if native is not None and native.amx_built and _granted(native) else None


def _granted(native: Any) -> bool:
    """Whether Linux grants this process AMX's tiles, asked once a library (one reloaded by
    :func:`asic_backend.sim.host_passes.reset` answers again)."""
    return _once("granted", native, lambda: bool(native.amx_request()))


def _exact(native: Any) -> bool:
    """Whether ``native``'s kernel multiplies a ragged product with the extreme values exactly,
    K in two chunks, checked once a library: a build or a CPU that gets it wrong is never
    used."""
    return _once("exact", native, lambda: _check(native))


#: :func:`_once`'s answers, by question and library: each with the library, held so that its
#: ``id`` is never another's.
_answers: dict[tuple[str, int], tuple[Any, bool]] = {}


def _once(question: str, native: Any, ask: Callable[[], bool]) -> bool:
    """``ask()``'s answer for this library, asked once (a library reloaded is another object,
    asked again). Keyed by ``id``: a library's entry points are not hashable, and
    :func:`available` is asked on every GEMM's kernel choice."""
    key = (question, id(native))
    got = _answers.get(key)
    if got is None:
        got = _answers[key] = (native, ask())
    return got[1]


def _check(native: Any) -> bool:
    with _disable_current_modes():  # real tensors, whatever mode the first use came in
        g = torch.Generator().manual_seed(0)
        a = torch.randint(-128, 128, (37, 2100), dtype=torch.int8, generator=g)
        w = torch.randint(-128, 128, (45, 2100), dtype=torch.int8, generator=g)
        a[0], w[0] = -128, -128  # the largest products, 2^14 each
        expected = (a.to(torch.int64) @ w.to(torch.int64).t()).to(torch.int32)
        return torch.equal(_mm(native, a, _pack(native, w, reuse=False)), expected)


def _library() -> Any:
    native = _built()
    if native is None or not _exact(native):
        raise RuntimeError(f"asic: the amx kernel is not available: {unavailable_reason()}")
    return native


def pack(w_q: torch.Tensor, *, reuse: bool = False) -> Packed:
    """The int8 ``w_q [N, K]`` (any strides: a transposed view of a ``[K, N]`` too) packed.
    ``reuse``: into this thread's reused buffer, for an operand of one call (a matmul's right
    operand, a convolution's im2col matrix): the packing is then only good until the next
    ``reuse``."""
    lib = _library()
    check_int8("amx", "a weight", w_q)
    return _pack(lib, w_q, reuse=reuse)


def _pack(lib: Any, w_q: torch.Tensor, *, reuse: bool) -> Packed:
    n, k = w_q.shape
    size = (int(lib.amx_packed_bytes(n, k)),)
    data = (
        operand(size, torch.int8, AMX_PACK_SLOT) if reuse else torch.empty(size, dtype=torch.int8)
    )
    if n and k:
        lib.amx_pack(
            w_q.data_ptr(), n, k, w_q.stride(0), w_q.stride(1), data.data_ptr(), gemm_threads(n * k)
        )
    return Packed(data, n, k)


def mm(a_q: torch.Tensor, w: Packed, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a_q [M, K] · wᵀ`` of int8 values as int32 ``[M, N]``, exactly (the caller guarantees
    ``K <= INT_MM_MAX_K``: no sum overflows int32): into ``out`` if given (int32 ``[M, N]``)."""
    lib = _library()
    check_product("amx", a_q, w.n, w.k, out)
    return _mm(lib, a_q, w, out=out)


def _mm(lib: Any, a_q: torch.Tensor, w: Packed, *, out: torch.Tensor | None = None) -> torch.Tensor:
    m, k = a_q.shape
    result = accumulator(out, m, w.n)
    if m and w.n:  # K = 0 too: the kernel writes zeros
        a = a_q if a_q.stride(1) == 1 else a_q.contiguous()
        buf = amx_activations(int(lib.amx_a_bytes(m, k)))
        failed = lib.amx_gemm(
            a.data_ptr(),
            m,
            k,
            a.stride(0),
            w.data.data_ptr(),
            w.n,
            result.data_ptr(),
            result.stride(0),
            buf.data_ptr(),
            gemm_threads(m * w.n * k),
        )
        if failed:  # available() held: only the sums of a long K can fail, finding no memory
            raise MemoryError(f"asic: the amx GEMM of [{m}, {k}] by [{w.n}, {k}] found no memory")
    return finished(out, result)
