"""Which exact host kernel computes the DUT's int8 × int8 → int32 products.

The simulated DUT's numbers do not depend on how the host computes them, only that it does so
exactly. Five kernels are exact for every reduction length the int32 fast path takes
(``K <= INT_MM_MAX_K``):

- ``int_mm``: ``torch._int_mm``, fast where the CPU has an int8 dot-product unit (AVX-512 VNNI,
  AVX-VNNI, AMX), and 10-30x slower than a float GEMM where it has not (AVX2 alone);
- ``amx``: the project's own native GEMM on Intel AMX's tile unit
  (:mod:`asic_backend.sim.amx_gemm`), by a packed int8 copy of the weight, each block of the
  product handed on while it is in L1 (a dynamic linear rescales it there): faster than
  ``torch._int_mm`` at every linear shape of ``docs/benchmarks.md`` ("The amx kernel"). It
  computes the products by kept weights; the others take ``int_mm`` where that is exact
  (:func:`kernel_for`);
- ``int16``: the project's own native GEMM (:mod:`asic_backend.sim.int16_gemm`), for AVX2
  alone: the int8 values widened to int16, multiplied and summed in pairs into int32, by a
  packed int8 copy of the weight. A DUT linear with it, AVX2 code on the AVX-512 VNNI host,
  took 0.21x to 0.39x fp32's ``F.linear`` at decode (1 and 8 rows: it reads a byte a weight,
  fp32 four) and 0.48x to 0.61x at prefill (128 to 512 rows), one thread;
- ``float32``: float32 GEMMs over slices of K, summed in int32: every product of two int8
  values is at most 2^14 in magnitude, so a slice of :data:`FLOAT32_SLICE` keeps every partial
  sum an integer within 2^24, which float32 holds exactly, in any summation order; a weight
  whose values are smaller allows longer slices (:func:`slice_length`), and operands whose rows
  are short enough (:func:`one_gemm_is_exact`: by Cauchy–Schwarz, no partial sum of a row's dot
  product with a column exceeds the product of their L2 norms) take one GEMM over all of K;
- ``float64``: one float64 GEMM, exact while K·2^14 < 2^53. Measured never faster than
  ``float32`` (1.3-1.8x slower at each of the int8 benchmark's layer shapes, on an AVX-512
  host), so only forcing it picks it.

:func:`kernel` picks one: ``$ASIC_HOST_GEMM`` (``int_mm``, ``amx``, ``float32``, ``float64``,
``int16`` or ``auto``), else ``auto``: ``amx`` where it is available (the native library built
for a CPU with AMX, the tiles granted by the OS), else ``int_mm`` on a CPU with an int8
dot-product unit (where ``torch._int_mm`` is exact: :func:`int_mm_is_exact`), else
``int16`` where it is available (the native library built, with AVX2), else ``float32``. The
CPU is read once per process; the variable on each use (a dictionary lookup), so a test or a
benchmark can set it. Under ``int_mm``, a GEMM ``torch._int_mm`` would get wrong (K <
:data:`INT_MM_MIN_K`, or a host whose int8 kernel saturates) takes ``float32``; under ``auto``'s
``int_mm``, a GEMM of 1 to :data:`CHOICE_ROWS` rows by a kept weight takes ``int16`` where a
short trial on that shape found it faster by a tenth (:func:`static_choice`).
:func:`mm_i32` and :func:`bmm_i32` are the products every DUT GEMM goes through; the kernels
keep their copy of a weight (``w_static``: float, or packed) while it is unchanged, since
making it costs as much as the GEMM.

>>> kernel()                                  # on an AVX2-only host with a C compiler
'int16'
>>> mm_i32(a_q, w_q).dtype                    # a_q int8 [M, K], w_q int8 [N, K]
torch.int32
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import _disable_current_modes

from asic_backend.sim import amx_gemm, host_passes, int16_gemm, kernel_choice
from asic_backend.sim.host import Overrides, cpu_flags, operand, plain, scratch
from asic_backend.sim.tensor_cache import new_cache, stamp

__all__ = [
    "CHOICE_ROWS",
    "ENV_VAR",
    "F32_EXACT",
    "FLOAT32_SLICE",
    "INT_MM_LAYOUTS",
    "INT_MM_MIN_K",
    "INT_MM_TILE",
    "INT_MM_TILE_MIN_COLUMNS",
    "INT_MM_TILE_MIN_ROWS",
    "KERNELS",
    "LAYOUT_ENV_VAR",
    "STATIC_KERNELS",
    "StaticOperand",
    "available_kernels",
    "bmm_i32",
    "cpu_flags",
    "describe",
    "float_weight",
    "forced",
    "has_int8_unit",
    "int_mm_is_exact",
    "int_mm_layout",
    "int_mm_tiles",
    "kernel",
    "kernel_for",
    "layout_setting",
    "mm_i32",
    "native_linear_gemm",
    "one_gemm_is_exact",
    "scratch",
    "scratch_i32",
    "slice_length",
    "static_choice",
    "static_form",
    "static_mm",
    "static_operand",
    "untiled",
]

#: The kernels, by name.
KERNELS: tuple[str, ...] = ("int_mm", "float32", "float64", "int16", "amx")
#: The project's native kernels, by name: modules of the same functions (``available``,
#: ``unavailable_reason``, ``pack``, ``mm``, ``gemm_threads``) and a ``Packed`` weight each.
_NATIVE: dict[str, Any] = {"int16": int16_gemm, "amx": amx_gemm}
#: Their packed weights.
_PACKED = (int16_gemm.Packed, amx_gemm.Packed)
#: The environment variable that forces one (or ``auto``).
ENV_VAR = "ASIC_HOST_GEMM"
#: float32's last exact integer step: every partial sum of a float32 GEMM slice stays within it.
F32_EXACT = 1 << 24
#: The slice of K a float32 GEMM of any int8 operands reduces exactly: 1024 · 2^14 = 2^24.
FLOAT32_SLICE = F32_EXACT // 2**14
#: The smallest K given to ``torch._int_mm``: on CPU (torch 2.13, oneDNN) K = 1 with N >= 2 returns
#: uninitialized memory, silently (found by the property tests); such GEMMs take ``float32``.
INT_MM_MIN_K = 2
#: CPU flags of an int8 dot-product unit (Linux ``/proc/cpuinfo`` names).
_INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")

_forced = Overrides()
#: :func:`untiled` blocks.
_untiled = Overrides()


def kernel() -> str:
    """The kernel this process uses (see the module docstring); a bad ``$ASIC_HOST_GEMM`` is
    a ``ValueError`` naming the allowed values, ``int16`` or ``amx`` where it is not available
    a ``RuntimeError`` saying why."""
    return _chosen(_forced.current())


def _chosen(forced_name: str | None) -> str:
    """:func:`kernel`, given the forced kernel read once (None: none)."""
    if forced_name is not None:
        return forced_name
    spec = _kernel_setting()
    # Whether int16 is there is the native library's build, which host_passes.reset() may
    # redo: asked on each use (a cached lookup), never kept here.
    if spec == "auto":
        if has_int8_unit() and amx_gemm.available():  # AMX's int8 tiles are such a unit
            return "amx"
        if has_int8_unit() and int_mm_is_exact():
            return "int_mm"
        return "int16" if int16_gemm.available() else "float32"
    if spec in _NATIVE:
        _require_native(spec, f"${ENV_VAR}={spec}")
    return spec


def _kernel_setting() -> str:
    return _setting(ENV_VAR, KERNELS, os.environ.get(ENV_VAR, "auto"))


@functools.cache
def _setting(name: str, allowed: tuple[str, ...], raw: str) -> str:
    """The value ``raw`` of ``$name``, one of ``allowed`` or ``auto`` (blank: ``auto``), else a
    ``ValueError`` naming them."""
    value = raw.strip().lower() or "auto"
    if value != "auto" and value not in allowed:
        raise ValueError(f"${name}={value!r} is not one of {', '.join((*allowed, 'auto'))}")
    return value


def available_kernels() -> tuple[str, ...]:
    """The kernels this process can use (:func:`forced`): all but a native one (``int16``,
    ``amx``) where it is not available."""
    return tuple(name for name in KERNELS if name not in _NATIVE or _NATIVE[name].available())


def _require_native(name: str, asked: str) -> None:
    module = _NATIVE[name]
    if not module.available():
        reason = module.unavailable_reason()
        raise RuntimeError(f"asic: {asked}, but the {name} kernel is not available: {reason}")


def describe() -> str:
    """One line for report headers: the kernel and why it was chosen."""
    forced_name = _forced.current()  # once: another thread's block may end meanwhile
    name = _chosen(forced_name)
    reason = "forced" if forced_name is not None else _reason(name)
    inexact = (
        "; torch._int_mm is not exact on this host: float32 computes every GEMM"
        if name == "int_mm" and not int_mm_is_exact()
        else ""
    )
    kept_only = (
        "; int_mm for products without a kept weight (attention, convolutions)"
        if name == "amx" and int_mm_is_exact()
        else ""
    )
    return f"{name} ({reason}){inexact}{kept_only}{_layout_note(name)}{_choice_note(name)}"


def _reason(name: str) -> str:
    spec = _kernel_setting()
    if spec != "auto":
        return f"${ENV_VAR}={spec}"
    if name == "amx":
        return "auto: AMX's int8 tiles on this CPU"
    unit = "an int8 dot-product unit" if has_int8_unit() else "no int8 dot-product unit"
    reason = f"auto: {unit} on this CPU"
    if has_int8_unit() and not int_mm_is_exact():
        reason += ", whose torch._int_mm is not exact"
    if name == "float32":
        reason += f"; int16: {int16_gemm.unavailable_reason()}"
    return reason


def _layout_note(name: str) -> str:
    """How ``int_mm`` reads weights, for :func:`describe`: measured here if not yet (10 to
    20 ms), so an xdist controller's header shows its own measurement, as each worker makes
    its own; nothing where ``int_mm`` hands every GEMM to ``float32``."""
    if name != "int_mm" or not int_mm_is_exact():
        return ""
    spec = layout_setting()
    how = "measured" if spec == "auto" else f"${LAYOUT_ENV_VAR}={spec}"
    return f", weights as {_LAYOUT_SHAPES[int_mm_layout()]} ({how})"


def _choice_note(name: str) -> str:
    """Where :func:`static_choice` may put ``int16`` in ``int_mm``'s place, for
    :func:`describe`."""
    if name != "int_mm" or not _choosing():
        return ""
    return f"; int16 at 1 to {CHOICE_ROWS} rows where timed faster, by weight shape"


@functools.cache
def has_int8_unit() -> bool:
    """Whether this CPU has an int8 dot-product unit ``torch._int_mm``'s kernels use: a flag of
    ``_INT8_FLAGS`` in Linux's ``/proc/cpuinfo``, else in torch's own reading of the CPU. Where
    neither tells, no: a wrong no runs the exact kernels ``auto`` takes instead, a few times
    slower than ``int_mm`` on such a unit, where a wrong yes would run ``int_mm`` without one
    (10 to 30 times slower than they on an AVX2-only EPYC, where it is exact)."""
    flags = cpu_flags() or _torch_cpu_flags()
    return any(flag in flags for flag in _INT8_FLAGS)


def _torch_cpu_flags() -> tuple[str, ...]:
    """The features torch's cpuinfo reads in this CPU (off Linux), where they are named as in
    ``_INT8_FLAGS``; none where torch cannot tell."""
    try:
        read = getattr(torch.cpu, "get_capabilities", None)  # not in every torch supported
        if read is not None:
            return tuple(name for name, value in read().items() if value is True)
        # An older torch's probes: VNNI of AVX-512 only, and AMX tiles (which come with int8).
        probes = (("avx512_vnni", "_is_vnni_supported"), ("amx_int8", "_is_amx_tile_supported"))
        return tuple(flag for flag, probe in probes if getattr(torch.cpu, probe, lambda: False)())
    except Exception:  # a reading that fails tells nothing: no unit, the safe answer
        return ()


@contextlib.contextmanager
def forced(name: str) -> Iterator[None]:
    """Use kernel ``name`` in the block, in every thread (tests run the numerics under each
    one): :class:`~asic_backend.sim.host.Overrides`."""
    if name not in KERNELS:
        raise ValueError(f"unknown host GEMM kernel {name!r}; known: {', '.join(KERNELS)}")
    if name in _NATIVE:
        _require_native(name, f"the {name} host GEMM was forced")
    with _forced.held(name):
        yield


@contextlib.contextmanager
def untiled() -> Iterator[None]:
    """Run a linear's ``int_mm`` GEMM in one call in the block, never in tiles
    (:func:`int_mm_tiles`): what a prefill linear ran before, so a benchmark compares the two in
    one run. The same bits either way. Like :func:`forced`, it holds for the whole process
    while the block runs, in every thread."""
    with _untiled.held("untiled"):
        yield


def mm_i32(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    w_static: bool = False,
    allow_float32: bool = False,
) -> torch.Tensor:
    """``a_q [M, K] · w_q [N, K]ᵀ`` of int8 operands as int32 ``[M, N]``, exactly.

    The caller guarantees ``K <= INT_MM_MAX_K`` (no int32 overflow). ``w_static``: ``w_q`` is a
    long-lived operand (a weight), so a float kernel keeps its float copy while it is unchanged
    (:mod:`asic_backend.sim.tensor_cache`) instead of converting it on every call.
    ``allow_float32`` (with ``w_static``): where a float32 GEMM computed the result in one
    slice (every value an integer within 2^24, exactly what int32 → float32 gives), return that
    float32 tensor, new (``out`` unused), for a caller that rescales it in float32: the round
    trip through int32 would cost two passes and change no value.
    """
    name = kernel_for(a_q.shape[1], a_q, w_q, kept=w_static)
    if w_static and name in STATIC_KERNELS:
        name, timing = static_choice(name, w_q, a_q.shape[0], a_q)
        kept = static_operand(name, w_q, a_q.shape[0])
        if timing is None:
            return static_mm(a_q, kept, out=out)
        timing.start()
        acc = static_mm(a_q, kept, out=out)
        timing.stop()
        return acc
    if name == "int_mm":
        a, w = _row_major(a_q), _as_kn(w_q)
        return torch._int_mm(a, w, out=out) if out is not None else torch._int_mm(a, w)
    if name in _NATIVE:
        module = _NATIVE[name]
        product: torch.Tensor = module.mm(a_q, module.pack(w_q, reuse=True), out=out)
        return product
    dtype = torch.float64 if name == "float64" else torch.float32
    if dtype == torch.float32 and w_static:
        return _float32_weight_gemm(a_q, w_q, out, allow_float32)
    w = float_weight(w_q, dtype) if w_static else w_q.to(dtype)
    result = _float_mm(a_q.to(dtype), w)
    return result if out is None else out.copy_(result)


#: The kernels that read a static operand (a weight) in a form of their own, kept while it is
#: unchanged (:func:`static_operand`).
STATIC_KERNELS: tuple[str, ...] = ("int_mm", "int16", "amx")


class StaticOperand(NamedTuple):
    """A static ``w_q [N, K]`` as kernel ``kernel`` reads it (:func:`static_operand`)."""

    kernel: str
    #: ``int_mm``: the ``[K, N]`` view ``torch._int_mm`` takes; ``int16``, ``amx``: the packed
    #: weight.
    data: torch.Tensor | int16_gemm.Packed | amx_gemm.Packed


def static_form(name: str, rows: int) -> str:
    """The form kernel ``name`` reads a static weight in to multiply ``rows`` rows by it: for
    ``int_mm``, ``rows`` or ``columns`` (:func:`int_mm_layout`; a single row always by its rows,
    oneDNN's GEMV), else the kernel's own. A caller that keeps operands keys them by it."""
    if name != "int_mm":
        return name
    return "columns" if rows > 1 and int_mm_layout() == "columns" else "rows"


def static_operand(
    name: str, w_q: torch.Tensor, rows: int, form: str | None = None
) -> StaticOperand:
    """What kernel ``name`` (one of :data:`STATIC_KERNELS`) reads of the static ``w_q [N, K]``
    to multiply ``rows`` rows by it, in ``form`` (:func:`static_form`'s, which a caller that
    already has it passes), made once while ``w_q`` is unchanged. A caller that keeps it (a
    dynamic linear's weight, :mod:`asic_backend.ops.linear`) passes it to :func:`static_mm` on
    every call without looking it up again: a lookup is a handful of Python objects, each a
    cache miss once a model's other layers have run.

    A ``[K, N]`` weight with nowhere to keep a copy (an inference tensor: no stamp) is read as
    it lies from two rows on, whatever the layout: the ``rows`` copy each call would cost more
    than the GEMM."""
    if name == "int_mm":
        form = form or static_form(name, rows)
        by_rows = form == "rows" and (rows == 1 or _is_row_major(w_q) or stamp(w_q) is not None)
        return StaticOperand(name, _rows(w_q).t() if by_rows else _columns(w_q))
    if name in _NATIVE:
        return StaticOperand(name, _packed(name, w_q))
    raise ValueError(f"asic: the {name} kernel keeps no static operand; {STATIC_KERNELS} do")


#: From this many rows and :data:`INT_MM_TILE_MIN_COLUMNS` columns on, a linear's ``int_mm``
#: GEMM runs in tiles of at most :data:`INT_MM_TILE` rows and columns, each rescaled while it is
#: in the CPU's cache (:class:`asic_backend.sim.host_passes.TiledGemm`). oneDNN's AMX
#: ``_int_mm`` of a whole prefill layer writes its int32 product through memory, and the
#: rescale reads it back. On the Intel Xeon with AMX, 512 rows, the layer in tiles took 0.75x to
#: 0.90x its time in one call at 6144 and 8192 columns with one thread, 0.73x to 1.10x with two
#: (``DUT/whole``, ``benchmarks/test_int8_path.py``). The two cut-offs come from scratch runs
#: with other work between the calls: 0.81x to 0.94x from 3072 columns, but 0.95x to 1.03x at
#: 2048 (and 1.16x to 1.22x in the benchmark), where the product is small and the tiles only
#: read the activations again; at 128 rows with two threads the tiles took 1.28x to 1.85x the
#: bare GEMM, against 1.11x to 1.45x in one call. 256-wide tiles were slower than 512-wide
#: ones, 1024-wide no faster.
INT_MM_TILE_MIN_ROWS = 256
INT_MM_TILE_MIN_COLUMNS = 3072
INT_MM_TILE = 512


def int_mm_tiles(rows: int, n: int) -> bool:
    """Whether a linear of ``rows`` rows and ``n`` outputs runs its ``int_mm`` GEMM in tiles
    (:data:`INT_MM_TILE_MIN_ROWS`, :data:`INT_MM_TILE_MIN_COLUMNS`)."""
    return rows >= INT_MM_TILE_MIN_ROWS and n >= INT_MM_TILE_MIN_COLUMNS


def native_linear_gemm(
    w: StaticOperand, rows: int, record: Callable[[], None]
) -> host_passes.NativeGemm | host_passes.TiledGemm | None:
    """The GEMM of ``rows`` rows by the kept operand ``w`` as
    :func:`asic_backend.sim.host_passes.linear` runs it, with ``record`` recording it on the
    device: inside its own native call where ``w``'s kernel is native (``int16``, ``amx``), in tiles
    where ``int_mm``'s product is large (:func:`int_mm_tiles`, unless in an :func:`untiled`
    block); None where it is one call of :func:`static_mm`."""
    if isinstance(w.data, _PACKED):
        packed = w.data
        threads = _NATIVE[w.kernel].gemm_threads(rows * packed.n * packed.k)
        return host_passes.NativeGemm(w.kernel, packed.data, packed.n, packed.k, threads, record)
    kn = w.data  # [K, N], as torch._int_mm takes it
    n = kn.shape[1]
    if not int_mm_tiles(rows, n) or _untiled:
        return None

    def tile(q: torch.Tensor, j0: int, j1: int) -> torch.Tensor:
        return torch._int_mm(q, kn[:, j0:j1], out=scratch_i32(q.shape[0], j1 - j0))

    return host_passes.TiledGemm(tile, n, INT_MM_TILE, INT_MM_TILE, record)


def static_mm(
    a_q: torch.Tensor, w: StaticOperand, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``a_q [M, K]`` int8 by the static operand ``w`` (:func:`static_operand`, made for as
    many rows) as int32 ``[M, N]``, exactly, into ``out`` where given: :func:`mm_i32` of the
    weight it was made from, with ``w_static``. The caller guarantees ``K <= INT_MM_MAX_K``,
    and that ``w``'s kernel is the one :func:`kernel_for` gives, or :func:`static_choice` in
    its place."""
    if isinstance(w.data, _PACKED):
        acc: torch.Tensor = _NATIVE[w.kernel].mm(a_q, w.data, out=out)
        return acc
    a = _row_major(a_q)
    return torch._int_mm(a, w.data, out=out) if out is not None else torch._int_mm(a, w.data)


# -- a few rows by a kept weight: the kernel timed per shape ------------------------------------

#: The most rows of a GEMM by a kept weight at which ``auto``, where it takes ``int_mm``, times
#: ``int16`` against it (:func:`static_choice`). In a decode step of 16 DUT linears on the Intel
#: Xeon with AMX (``benchmarks/test_int8_path.py::test_decode_step``), ``int16`` took 0.66x to
#: 0.91x ``int_mm``'s time from 1 to 4 rows with one thread (0.72x to 1.23x with two), and
#: 1.58x to 1.66x at 8.
CHOICE_ROWS = 4


def static_choice(
    name: str, w_q: torch.Tensor, rows: int, *operands: torch.Tensor, path: str = "gemm"
) -> tuple[str, kernel_choice.Timing | None]:
    """The kernel that multiplies ``rows`` rows (of ``operands``, where not already checked:
    :func:`plain`) by the kept weight ``w_q [N, K]``, where :func:`kernel_for` gave ``name``,
    and the :class:`~asic_backend.sim.kernel_choice.Timing` to start and stop around the call
    where it is one of a trial's.

    ``name``, except where ``auto`` took ``int_mm`` and ``int16`` is built, at 1 to
    :data:`CHOICE_ROWS` rows, for plain operands and a weight with a version (no inference
    tensor, whose ``int16`` packing could not be kept): there, the kernel a trial kept
    (``int16`` only where it was faster by a tenth) for these rows, K, N, threads and ``path``
    (:mod:`asic_backend.sim.kernel_choice`: the ``linear`` path times a whole native linear,
    ``gemm`` the GEMM alone)."""
    if (
        name != "int_mm"
        or type(rows) is not int  # a traced call's symbolic rows: no guard on them
        or not 1 <= rows <= CHOICE_ROWS
        or w_q.is_inference()
        or not _choosing()
    ):
        return name, None
    n, k = w_q.shape
    key = (rows, k, n, torch.get_num_threads(), path)
    chosen = kernel_choice.chosen(key)
    if chosen == "int_mm":
        return chosen, None
    if not all(plain(t) for t in (w_q, *operands)):
        return name, None  # int16 reads data a fake, meta or traced operand has not
    if chosen is not None:
        return chosen, None
    weight = w_q if w_q._base is None else w_q._base  # a fresh view of it each call: the same
    return kernel_choice.trial_call(key, weight, name, _release_int16)


def _choosing() -> bool:
    """Whether ``auto``'s ``int_mm`` may give way to ``int16`` (:func:`static_choice`)."""
    return (
        not _forced and _kernel_setting() == "auto" and int16_gemm.available() and int_mm_is_exact()
    )


def _release_int16(weight: torch.Tensor) -> None:
    _weight_copies["int16"].discard(weight)


#: The most float32 partial products (slices × rows × columns) one batched GEMM of
#: :func:`_float32_weight_gemm` holds at once: 128 MiB.
_PARTIALS_MAX = 1 << 25


def _float32_weight_gemm(
    a_q: torch.Tensor, w_q: torch.Tensor, out: torch.Tensor | None, allow_float32: bool = False
) -> torch.Tensor:
    """``a_q · w_qᵀ`` by a static weight in float32, exactly: one GEMM where the weight allows
    it for any activations (:func:`slice_length`: usually) or these activations' rows are short
    enough (:func:`one_gemm_is_exact`: for quantized layers, nearly always); else K's slices as
    one batched GEMM whose ``[S, M, N]`` partial sums are added in int32 (a loop of slice GEMMs
    is 15% slower, measured at 256×4096×4096), in blocks of rows when they would pass
    :data:`_PARTIALS_MAX`. The batched GEMM and the int32 sum cost about 5% more than one GEMM
    (the benchmark MLP's two 256×4096×4096, whose weights alone allow slices of 1,024; one
    thread, AVX-512 VNNI host)."""
    m, k = a_q.shape
    if k == 0 or w_q.shape[0] == 0:  # an empty sum, or no columns
        result = torch.zeros((m, w_q.shape[0]), dtype=torch.int32, device=a_q.device)
        return result if out is None else out.copy_(result)
    weight = _sliced_weight(w_q)
    n, width = weight.matrix.shape
    slices, length = width // weight.length, weight.length
    a = a_q.to(torch.float32)
    if slices == 1 or _norms_allow_one_gemm(_max_row_norm(a), weight.norm):
        product = a @ (weight.matrix if width == k else weight.matrix[:, :k]).t()
        if allow_float32:
            return product
        return product.to(torch.int32) if out is None else out.copy_(product)
    if width != k:
        padded = torch.zeros((m, width), dtype=torch.float32, device=a_q.device)
        padded[:, :k] = a
        a = padded
    if out is None:
        out = torch.empty((m, n), dtype=torch.int32, device=a_q.device)
    rows = max(1, _PARTIALS_MAX // (slices * n))
    w_t = weight.matrix.view(n, slices, length).permute(1, 2, 0)  # [S, L, N], a view
    for lo in range(0, m, rows):
        block = a[lo : lo + rows]
        parts = torch.bmm(block.view(-1, slices, length).transpose(0, 1), w_t)
        torch.sum(parts.to(torch.int32), 0, dtype=torch.int32, out=out[lo : lo + rows])
    return out


def one_gemm_is_exact(a: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether one float32 GEMM ``a · wᵀ`` over all of K is exact for these integer-valued
    float32 operands (``[..., M, K]`` and ``[..., N, K]``, int8 values), whatever its length.

    Every partial sum of a row ``a_m``'s dot product with a row ``w_n`` is at most
    ``Σ|a_mk·w_nk| <= ‖a_m‖·‖w_n‖`` (Cauchy–Schwarz), in any summation order: while the longest
    rows' norms multiply to within 2^24, float32 holds every partial sum exactly. The worst case
    (every value -128) allows K = 1,024 only, but the rows of quantized activations and weights
    are far shorter: 256 quantized Gaussian tokens by a quantized ``nn.Linear(4096, ...)`` come
    to about three quarters of the bound, where the bound on ``Σ|w|`` alone
    (:func:`slice_length`) allows slices of 1,024.

    >>> one_gemm_is_exact(torch.full((1, 1000), -128.0), torch.full((1, 1000), -128.0))
    True
    >>> one_gemm_is_exact(torch.full((1, 1025), -128.0), torch.full((1, 1025), -128.0))
    False

    The smaller operand is asked first whether its rows alone allow it: every partial sum is
    also at most ``128 · Σ|a_mk|``, and its sums cost a pass over the small operand only, where
    the norms read the large one (decode attention's V: 11 ms of a 2048-token step).
    """
    small = a if a.numel() <= w.numel() else w
    if _max_row_l1(small) * 128 * _NORM_MARGIN <= F32_EXACT:
        return True
    return _norms_allow_one_gemm(_max_row_norm(a), _max_row_norm(w))


def _norms_allow_one_gemm(a_norm: float, w_norm: float) -> bool:
    """:func:`one_gemm_is_exact` from the operands' largest row norms (:func:`_max_row_norm`)."""
    return a_norm * w_norm * _NORM_MARGIN <= F32_EXACT


#: What a float32 norm of a row of up to ``INT_MM_MAX_K`` (2^17) values may fall short by: in
#: any summation order, the sum of squares by at most ``2^17 · 2^-24`` of itself, the norm by
#: half that, and its square root by one rounding. 2^-6 covers all of it with room.
_NORM_MARGIN = 1 + 2**-6


def _max_row_norm(x: torch.Tensor) -> float:
    """The largest L2 norm of a row (the last dimension) of ``x``, in float32: one pass, no
    temporary (a float64 sum of squares costs 40x as much at 512×8192, AVX-512 VNNI host); within
    :data:`_NORM_MARGIN` of the exact value."""
    if x.numel() == 0:
        return 0.0
    return float(torch.linalg.vector_norm(x, dim=-1).max())


def _max_row_l1(x: torch.Tensor) -> float:
    """The largest ``Σ|x|`` of a row (the last dimension) of integer-valued float ``x``, in
    float32: within :data:`_NORM_MARGIN` of the exact value, as :func:`_max_row_norm`."""
    if x.numel() == 0:
        return 0.0
    return float(torch.linalg.vector_norm(x, ord=1, dim=-1).max())


def slice_length(w_q: torch.Tensor) -> int:
    """The longest slice of K (all of it, or :data:`FLOAT32_SLICE` times a power of two) over
    which a float32 GEMM by the int8 weight ``w_q [N, K]`` is exact for any int8 activations.

    A partial sum is at most ``128 · Σ |w|`` over the slice, in any order: while that stays
    within 2^24 float32 holds it exactly. The worst case (every weight ±128) allows 1,024; the
    weights of a quantized layer are mostly far smaller: 2,048 to 4,096 for Gaussian weights
    quantized per channel (all of K = 2048, half of K = 8192).
    """
    n, k = w_q.shape
    if k <= FLOAT32_SLICE or n == 0:
        return max(k, 1)
    bound = F32_EXACT // 128
    sums = w_q.to(torch.int32).abs_().cumsum(dim=1)  # |Σ| <= 128 · K fits int32
    if int(sums[:, -1].max()) <= bound:
        return k
    length = FLOAT32_SLICE
    while length * 2 < k and _largest_slice_sum(sums, length * 2) <= bound:
        length *= 2
    return length


def _largest_slice_sum(sums: torch.Tensor, length: int) -> int:
    """The largest sum over one slice of ``length`` (the last one may be shorter), from row-wise
    prefix sums ``[N, K]``."""
    k = sums.shape[1]
    ends = sums[:, [*range(length - 1, k - 1, length), k - 1]]
    starts = torch.nn.functional.pad(ends[:, :-1], (1, 0))
    return int((ends - starts).max())


class _SlicedWeight(NamedTuple):
    """A static int8 weight ``[N, K]`` as the ``float32`` kernel keeps it."""

    #: float32 ``[N, S·L]``: K zero-padded to whole slices of :func:`slice_length` ``L``; a
    #: batched GEMM reads the slices as a view, one GEMM ``[:, :K]``.
    matrix: torch.Tensor
    #: ``L``.
    length: int
    #: The largest L2 norm of a row (:func:`one_gemm_is_exact`).
    norm: float


def _sliced_weight(w_q: torch.Tensor) -> _SlicedWeight:
    """``w_q`` as :class:`_SlicedWeight`, kept while ``w_q`` is unchanged."""

    def make() -> _SlicedWeight:
        n, k = w_q.shape
        length = slice_length(w_q)
        width = -(-k // length) * length
        if width == k:
            matrix = w_q.to(torch.float32)
        else:
            matrix = torch.zeros((n, width), dtype=torch.float32, device=w_q.device)
            matrix[:, :k] = w_q
        return _SlicedWeight(matrix, length, _max_row_norm(matrix))

    return _weight_copies["slices"].get(w_q, stamp(w_q), make)


def bmm_i32(a_q: torch.Tensor, w_q: torch.Tensor, *, allow_float32: bool = False) -> torch.Tensor:
    """``a_q [B, M, K] · w_q[b] [N, K]ᵀ`` per ``b``, int8 operands, as int32 ``[B, M, N]``,
    exactly (the caller guarantees ``K <= INT_MM_MAX_K``). ``allow_float32``: as
    :func:`mm_i32` takes it (one float32 slice: that float32 tensor, the same values)."""
    batch, m, k = a_q.shape
    name = kernel_for(k, a_q, w_q)
    if name == "int_mm":
        acc = torch.empty((batch, m, w_q.shape[1]), dtype=torch.int32, device=a_q.device)
        for i in range(batch):
            torch._int_mm(_row_major(a_q[i]), _as_kn(w_q[i]), out=acc[i])
        return acc
    if name in _NATIVE:
        module = _NATIVE[name]
        acc = torch.empty((batch, m, w_q.shape[1]), dtype=torch.int32, device=a_q.device)
        for i in range(batch):
            module.mm(a_q[i], module.pack(w_q[i], reuse=True), out=acc[i])
        return acc
    # One batched float GEMM (per K slice) instead of B small ones.
    dtype = torch.float64 if name == "float64" else torch.float32
    a, w = _as_float(a_q, dtype, 0), _as_float(w_q, dtype, 1)
    return _float_mm(a, w, allow_float32=allow_float32)


def _as_float(x: torch.Tensor, dtype: torch.dtype, slot: int) -> torch.Tensor:
    """A batched GEMM's int8 operand ``[B, R, K]`` as ``dtype`` in this thread's reused buffer
    (:func:`scratch`), laid out as ``x`` is (a transposed view stays one): a new tensor would
    start on fresh pages the OS must fault in, 15 of a 2048-token decode attention's V
    conversion's 16 ms (32 heads, one thread, AVX-512 host). A new tensor where the buffer would
    pass :data:`asic_backend.sim.host.SCRATCH_OPERAND_MAX_BYTES` (:func:`operand`), and for any
    tensor but a plain CPU one (a fake or meta tensor has no data to copy)."""
    if not plain(x):
        return x.to(dtype)
    if x.dim() == 3 and not x.is_contiguous() and x.mT.is_contiguous():
        return operand(tuple(x.mT.shape), dtype, slot).copy_(x.mT).mT
    return operand(tuple(x.shape), dtype, slot).copy_(x)


def scratch_i32(m: int, n: int) -> torch.Tensor:
    """An int32 ``[m, n]`` accumulator this thread reuses from call to call, for a caller that
    consumes it before its next GEMM (a dequantizing linear): :func:`scratch`.

    A fresh accumulator of a prefill layer is megabytes the OS must fault in and zero on every
    call: 1.8 ms of a 6 ms 512×2048×8192 GEMM, measured.
    """
    return scratch((m, n), torch.int32)


def kernel_for(k: int, *operands: torch.Tensor, kept: bool = False) -> str:
    """The kernel that computes a reduction of length ``k`` (of ``operands``, where given;
    ``kept``: by a weight the kernel keeps its form of): :func:`kernel`, except that under
    ``amx`` a product without a kept weight takes ``int_mm`` where that is exact, under
    ``int_mm`` a GEMM ``torch._int_mm`` would get wrong takes ``float32``, and so does a native
    kernel (``int16``, ``amx``) of an operand without data of its own (a fake or meta tensor:
    :func:`plain`)."""
    name = kernel()
    # amx packs a right operand that is new on every call (attention's, a convolution's im2col
    # matrix) each time: such products took up to 1.4x int_mm's DUT time (a ResNet 3x3 conv at
    # stage 3), 1.5x (a 1x1 conv) and 1.6x (decode attention), against 0.58x for Whisper's
    # 1-D conv (Xeon with AMX, one thread, benchmarks/test_conv_attention.py).
    if name == "amx" and not kept and k >= INT_MM_MIN_K and int_mm_is_exact():
        name = "int_mm"
    if name == "int_mm" and (k < INT_MM_MIN_K or not int_mm_is_exact()):
        return "float32"
    if name in _NATIVE and not all(plain(t) for t in operands):
        return "float32"
    return name


def _float_mm(a: torch.Tensor, w: torch.Tensor, *, allow_float32: bool = False) -> torch.Tensor:
    """``a · wᵀ`` over the last two dimensions of integer-valued float operands, as int32; in
    float32, one GEMM where it is exact (:func:`one_gemm_is_exact`), else summed over K slices
    short enough to stay exact. ``allow_float32``: a float32 product of one GEMM is returned as
    it is (the same values)."""
    k = a.shape[-1]
    if a.dtype == torch.float64 or k <= FLOAT32_SLICE or one_gemm_is_exact(a, w):
        product = a @ w.mT
        return (
            product if allow_float32 and product.dtype == torch.float32 else product.to(torch.int32)
        )
    acc: torch.Tensor | None = None
    for start in range(0, k, FLOAT32_SLICE):
        stop = start + FLOAT32_SLICE
        part = (a[..., start:stop] @ w[..., start:stop].mT).to(torch.int32)
        acc = part if acc is None else acc.add_(part)
    assert acc is not None
    return acc


def float_weight(w_q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``w_q`` as ``dtype``, kept while the int8 tensor ``w_q`` (a weight) is unchanged."""
    form = "float64" if dtype == torch.float64 else "float32"
    return _weight_copies[form].get(w_q, stamp(w_q), lambda: w_q.to(dtype))


def _columns(w_q: torch.Tensor) -> torch.Tensor:
    """``w_q [N, K]`` as a contiguous ``[K, N]`` for ``torch._int_mm``, kept while the weight
    is unchanged: the ``columns`` layout (:func:`int_mm_layout`). Without a stamp (an inference
    tensor) a copy per call would cost more than it saves: the view, then."""
    # w_q.t() is row-major (w_q a view of a [K, N] already): nothing to keep (a kept view of the
    # key would keep the key alive in the weak-keyed cache). Read off w_q's strides: the view
    # is one more dispatch, which a cached copy does not need.
    if w_q.stride(0) == 1 and w_q.stride(1) >= w_q.shape[0]:
        return w_q.t()
    version = stamp(w_q)
    if version is None:
        return _row_major(w_q).t()
    return _weight_copies["columns"].get(w_q, version, lambda: _row_major(w_q.t().contiguous()))


def _rows(w_q: torch.Tensor) -> torch.Tensor:
    """``w_q [N, K]`` row-major, as ``torch._int_mm``'s GEMV reads it, and its GEMM in the
    ``rows`` layout (:func:`int_mm_layout`): itself, or a row-major copy kept while the weight
    is unchanged (a program's own ``[K, N]`` weight,
    ``w_q`` its transposed view: a copy each call took 10x the GEMV at 1×2048×2048, one
    thread, AVX-512 VNNI host)."""
    if _is_row_major(w_q):
        return w_q
    version = stamp(w_q)
    if version is None:
        return _row_major(w_q)
    return _weight_copies["rows"].get(w_q, version, lambda: _row_major(w_q.contiguous()))


def _packed(name: str, w_q: torch.Tensor) -> int16_gemm.Packed | amx_gemm.Packed:
    """``w_q [N, K]`` packed for the native kernel ``name``, kept while the weight is
    unchanged."""
    packed: int16_gemm.Packed | amx_gemm.Packed = _weight_copies[name].get(
        w_q, stamp(w_q), lambda: _NATIVE[name].pack(w_q)
    )
    return packed


#: How ``torch._int_mm`` may read a kept weight from two rows on (:func:`int_mm_layout`).
INT_MM_LAYOUTS: tuple[str, ...] = ("rows", "columns")
#: The environment variable that forces one (or ``auto``, measured).
LAYOUT_ENV_VAR = "ASIC_INT_MM_LAYOUT"
_LAYOUT_SHAPES = {"rows": "[N, K] rows", "columns": "[K, N] columns"}
#: The GEMM that decides ``auto``: 8 rows by a 2048-square weight, where the layouts' times
#: differ 2x to 5x on every host measured, either way. ``columns`` must be faster by a quarter,
#: best of :data:`_PROBE_ROUNDS`: two threads sharing two busy cores (a CI run beside it) once
#: timed every round of ``rows`` late out of five.
_PROBE_SHAPE = (8, 2048, 2048)
_PROBE_ROUNDS = 10
_PROBE_MARGIN = 0.75


def int_mm_layout() -> str:
    """How ``torch._int_mm`` reads a weight kept for two or more rows: ``rows``, the weight's
    own row-major ``[N, K]`` (passed as its transposed view), or ``columns``, a kept row-major
    ``[K, N]`` copy. Same bits, and which is faster depends on the oneDNN kernel this CPU gets,
    not on its flags: ``columns`` took 0.2x to 0.6x the time of ``rows`` from 2 to 32 rows and
    0.75x to 0.97x from 128 on an AMD EPYC with AVX-512 VNNI, while on an Intel Xeon with AMX
    ``rows`` took 0.35x to 0.5x the time of ``columns`` at 8 rows and 0.5x to 0.9x at 128
    (and was the faster there too with oneDNN held to AVX-512 VNNI), 2048 to 8192 wide, one or
    two threads; at 512 rows the two were within 0.8x to 1.2x of each other there, by shape.
    So ``auto`` measures it once per process (:data:`_PROBE_SHAPE`, 10 to 20 ms);
    ``$ASIC_INT_MM_LAYOUT`` (``rows``, ``columns`` or ``auto``) forces it, read on each use.
    A single row always reads ``rows`` (oneDNN's GEMV: 2x to 5x faster on both hosts).

    >>> int_mm_layout()                        # on the Xeon with AMX
    'rows'
    """
    spec = layout_setting()
    return _measured_layout() if spec == "auto" else spec


def layout_setting() -> str:
    """``$ASIC_INT_MM_LAYOUT`` (:func:`int_mm_layout`): ``rows``, ``columns`` or ``auto``; any
    other value is a ``ValueError`` naming the allowed ones."""
    return _setting(LAYOUT_ENV_VAR, INT_MM_LAYOUTS, os.environ.get(LAYOUT_ENV_VAR, "auto"))


@functools.cache
def _measured_layout() -> str:
    """``columns`` where its GEMM takes under :data:`_PROBE_MARGIN` of the time of ``rows`` at
    :data:`_PROBE_SHAPE`, best of :data:`_PROBE_ROUNDS` rounds run in turn (the best, so a cold
    first call does not count), else ``rows`` (no copy to keep)."""
    m, k, n = _PROBE_SHAPE
    # Real CPU tensors whatever the caller runs under (a fake-tensor or tracing mode, a functorch
    # transform): the answer is kept for the process. The values do not change the time.
    with _disable_current_modes(), torch._C._DisableFuncTorch(), torch.no_grad():
        a = torch.ones((m, k), dtype=torch.int8, device="cpu")
        w = torch.ones((n, k), dtype=torch.int8, device="cpu")
        layouts = {"rows": w.t(), "columns": w.t().contiguous()}
        best = dict.fromkeys(layouts, float("inf"))
        for _ in range(_PROBE_ROUNDS):
            for name, b in layouts.items():
                start = time.perf_counter()
                torch._int_mm(a, b)
                best[name] = min(best[name], time.perf_counter() - start)
    return "columns" if best["columns"] < _PROBE_MARGIN * best["rows"] else "rows"


#: The forms the kernels keep of static int8 operands (weights), one cache per form.
_weight_copies = {
    form: new_cache()
    for form in ("float32", "float64", "slices", "columns", "rows", "int16", "amx")
}


def _as_kn(w_q: torch.Tensor) -> torch.Tensor:
    """A dynamic ``w_q [N, K]`` as the ``[K, N]`` ``torch._int_mm`` reads: its transposed view
    where that is row-major (a matmul's right operand quantized per column where it lies, a 1x1
    conv's input), which oneDNN takes as it is, where a packed ``[N, K]`` copy first took 7x the
    GEMMs (decode attention's PV, 32 heads of 2048); else a row-major copy, transposed."""
    wt = w_q.t()
    return wt if _is_row_major(wt) else _row_major(w_q).t()


def _row_major(x: torch.Tensor) -> torch.Tensor:
    """``x`` if oneDNN reads it right as a row-major matrix, else a packed copy.

    ``torch._int_mm`` takes BLAS leading dimensions from the strides, but a size-1 dimension may
    have any stride (Inductor emits 0) and oneDNN then silently skips the GEMM (pytorch#195066).
    """
    return x if _is_row_major(x) else x.clone(memory_format=torch.contiguous_format)


def _is_row_major(x: torch.Tensor) -> bool:
    return x.stride(1) == 1 and x.stride(0) >= x.shape[1]


@functools.cache
def int_mm_is_exact() -> bool:
    """Whether ``torch._int_mm`` computes worst-case int8 products exactly on this host.

    Some x86 int8 kernels go through u8·s8 pairs summed in int16 (vpmaddubsw) and saturate there;
    on such a host ``auto`` takes another kernel, and a forced ``int_mm`` hands every GEMM to
    ``float32``, with a warning; the header says so (:func:`describe`).
    """
    k = 64
    vals = torch.tensor([-128, 127, -1, 1], dtype=torch.int8)
    a = vals.repeat_interleave(k).reshape(4, k)
    a = torch.cat([a, a.roll(1, dims=1), vals.repeat(k).reshape(4, k)])
    w = torch.cat([a, a.flip(0)])
    expected = a.double() @ w.double().t()
    exact = all(  # both layouts of the second operand the kernel passes (_columns)
        torch.equal(torch._int_mm(a, b).double(), expected) for b in (w.t(), w.t().contiguous())
    )
    if not exact:
        warnings.warn(
            "asic: torch._int_mm is not exact on this host; the simulator computes its int8 "
            "GEMMs on another exact kernel (correct, slower; the report header names it)",
            RuntimeWarning,
            stacklevel=3,
        )
    return exact
