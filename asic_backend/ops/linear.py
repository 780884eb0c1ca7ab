"""The high-level ``asic::`` custom ops that the lowering puts in place of linears and matmuls.

Each op quantizes on the host exactly as the source of the graph would (TorchAO, PT2E, or the
backend's own dynamic int8 for float models), runs the integer GEMM on the simulated device
(:func:`asic_backend.sim.device.run_mm_i32` /
:func:`~asic_backend.sim.device.run_linear_requant`, which also record its cost), and rescales on
the host. They are ``torch.library`` ops (:mod:`asic_backend.ops.library`) with shape-only
fakes, so tracing never reads data; run-time scales are tensors, so new values never recompile.
The ``device`` argument is a device key (:func:`asic_backend.sim.device.get_device`).

>>> import torch
>>> import asic_backend.ops.linear
>>> from asic_backend.sim.device import get_device
>>> key = get_device("default").key
>>> y = torch.ops.asic.dyn_linear(torch.randn(4, 64), torch.randn(32, 64), None, False, True, key)
>>> y.shape
torch.Size([4, 32])
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from asic_backend.ops.library import dut_op
from asic_backend.sim import host_gemm, host_passes, kernel_choice, numerics
from asic_backend.sim.device import (
    get_device,
    record_mm,
    run_bmm_i32,
    run_linear_requant,
    run_mm_i32,
    run_static_mm,
)
from asic_backend.sim.host_gemm import scratch_i32
from asic_backend.sim.numerics import INT8_MAX, INT8_MIN
from asic_backend.sim.tensor_cache import new_cache, stamp

#: uint8 activations (PT2E x86) enter the int8 array shifted by this; exact, both ways.
UINT8_SHIFT = 128
#: The eps TorchAO's ``Int8Tensor`` clamps scales with, for every input dtype; the backend's own
#: dynamic quantization of float models uses it too.
F32_EPS = float(torch.finfo(torch.float32).eps)
#: Input dtypes the dynamic quantizers take (float64 is refused: it would silently lose precision).
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# Typed handles on two untyped torch helpers (mypy --strict).
_torch_check: Callable[[Any, Callable[[], str]], None] = torch._check
_broadcast_shapes: Callable[..., torch.Size] = torch.broadcast_shapes


# -- host-side quantization (bit-exact replicas of the sources' formulas) ----------------------


def choose_qparams_rows(
    x: Tensor,
    *,
    symmetric: bool,
    qmin: int = INT8_MIN,
    qmax: int = INT8_MAX,
    eps: float = F32_EPS,
    scale_dtype: torch.dtype | None = torch.float32,
    per_tensor: bool = False,
) -> tuple[Tensor, Tensor]:
    """Per-row (or per-tensor) int8 scale and zero point of a 2-D ``x``, as TorchAO computes them.

    The operation order is ``torchao.quantization.quant_primitives._choose_qparams_affine``'s:
    min/max in ``x``'s dtype, symmetric ``amax / ((qmax - qmin) / 2)`` (/127.5 for int8),
    asymmetric ``(max⁺ - min⁻) / (qmax - qmin)`` with ``zp = qmin - round(min⁻ / scale)``, the
    ``eps`` clamp, then the cast to ``scale_dtype`` (``None``: keep ``x.dtype``). Returns
    ``scale [M, 1]`` and an int32 ``zp [M, 1]`` (``[1, 1]`` when ``per_tensor``).
    """
    # TorchAO's amin / amax (exact, so any reduction gives the same values). Per row, two
    # reductions: torch's aminmax(dim=...) is ~50x slower than amin + amax on the CPU.
    if per_tensor:
        lo, hi = (t.reshape(1, 1) for t in torch.aminmax(x))
    else:
        lo, hi = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
    min_neg = torch.minimum(lo, torch.zeros_like(lo))
    max_pos = torch.maximum(hi, torch.zeros_like(hi))
    if symmetric:
        scale = torch.maximum(-min_neg, max_pos) / (float(qmax - qmin) / 2)
        scale = torch.clamp(scale, min=eps)
        zp = torch.full_like(scale, int((qmax + qmin + 1) / 2), dtype=torch.int32)
    else:
        scale = torch.clamp((max_pos - min_neg) / float(qmax - qmin), min=eps)
        zp = torch.clamp(qmin - torch.round(min_neg / scale), qmin, qmax).to(torch.int32)
    return scale.to(scale_dtype or x.dtype), zp


def quantize_rows(
    x: Tensor,
    scale: Tensor,
    zp: Tensor | None,
    qmin: int,
    qmax: int,
    *,
    consume: bool = False,
    out: Tensor | None = None,
) -> Tensor:
    """``clamp(round(x · (1/scale)) + zp)`` as int8: TorchAO's and PT2E's formula (a reciprocal
    multiply, ``torch.round`` is half to even). ``zp`` None: a zero zero-point (symmetric), which
    adds nothing; passing None rather than zeros spares a pass and a host sync per call.
    ``consume``: ``x`` (float32) is the caller's to give up, and is worked on in place. ``out``:
    a float32 tensor shaped as ``x`` that receives the same values instead, for a host kernel
    that computes in float32 (the int8 tensor and its conversion back would be two passes).

    A large ``x`` goes a chunk of rows at a time (:func:`asic_backend.sim.numerics.row_spans`):
    the same values, with each step after a chunk's first reading it from the CPU's caches."""
    chunks = numerics.row_spans(x.shape[0], x.shape[1])
    if len(chunks) == 1:
        # torch computes 1.0 / scale as reciprocal(scale) * 1.0: the same values, one kernel fewer.
        recip = torch.reciprocal(scale)
        return _quantize_block(x, recip, zp, qmin, qmax, consume=consume, out=out)
    q, _ = _quantize_by_chunks(
        x, chunks, lambda lo, hi: _rows(scale, lo, hi), zp, qmin, qmax, consume=consume, out=out
    )
    return q


def _quantize_block(
    x: Tensor,
    recip: Tensor,
    zp: Tensor | None,
    qmin: int,
    qmax: int,
    *,
    consume: bool = False,
    out: Tensor | None = None,
) -> Tensor:
    """:func:`quantize_rows` of one block of rows, given ``1/scale``."""
    if out is not None:
        q = torch.mul(x, recip, out=out)
    else:
        q = x.mul_(recip) if consume and x.dtype == torch.float32 else x * recip
    q.round_()
    if zp is not None:
        q.add_(zp)
    q.clamp_(qmin, qmax)
    return q if out is not None else q.to(torch.int8)


def _rows(t: Tensor, lo: int, hi: int) -> Tensor:
    """Rows ``[lo, hi)`` of a per-row ``[M, 1]`` operand, or a per-tensor ``[1, 1]`` one."""
    return numerics.row_slice(t, lo, hi, 2)  # type: ignore[return-value]


def _quantize_by_chunks(
    x: Tensor,
    chunks: list[tuple[int, int]],
    scale_of: Callable[[int, int], Tensor],
    zp: Tensor | None,
    qmin: int,
    qmax: int,
    *,
    consume: bool,
    out: Tensor | None,
) -> tuple[Tensor, list[Tensor]]:
    """:func:`quantize_rows` a chunk of rows at a time (:func:`numerics.row_spans`), with
    ``scale_of(lo, hi)`` the scales of rows ``[lo, hi)``; returns the result and each chunk's
    scales. A chunk is worked on where :func:`_quantize_block` would put it (``x``'s own rows
    to consume, ``out``'s, or one reused scratch of a chunk's size in the dtype
    ``x · (1/scale)`` has) and lands in the int8 result (its values are integers: exact), or
    stays in ``out``."""
    q = out if out is not None else torch.empty(x.shape, dtype=torch.int8)
    in_place = consume and x.dtype == torch.float32
    scratch: Tensor | None = None
    scales = []
    for lo, hi in chunks:
        scales.append(scale_of(lo, hi))
        if out is not None:
            work = out[lo:hi]
        elif in_place:
            work = x[lo:hi]
        else:
            if scratch is None:  # the first chunk is the largest
                dtype = torch.result_type(x, scales[-1])
                scratch = torch.empty((hi - lo, x.shape[1]), dtype=dtype)
            work = scratch[: hi - lo]
        zp_rows = None if zp is None else _rows(zp, lo, hi)
        recip = torch.reciprocal(scales[-1])
        block = _quantize_block(x[lo:hi], recip, zp_rows, qmin, qmax, out=work)
        if out is None:
            q[lo:hi].copy_(block)
    return q, scales


#: From this many elements on, :func:`quantize_sym_rows` takes ``max(amax, -amin)`` for ``max |x|``
#: (0.10 ms against 0.22 at 512×2048); below, the extra kernel costs more (1.5 µs at 1×2048).
TWO_REDUCTIONS_MIN_NUMEL = 1 << 15


def quantize_sym_rows(
    x: Tensor, *, consume: bool = False, out: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The backend's own dynamic int8 of a 2-D ``x``: symmetric per row, TorchAO's formula
    (``amax / 127.5``). ``(q int8, scale f32 [rows, 1])``. ``consume`` and ``out``: as
    :func:`quantize_rows` takes them (``x`` is overwritten; ``q`` is ``out``, float32).

    A row of one value (the operand of an outer product, K = 1, such as rotary angles) takes
    ``|v| / 127`` instead, so it becomes exactly ±127 and the product is exact: int8 rounding
    would shift every angle by up to 0.4%.

    It runs on every call of every dynamic layer, so it takes the fewest kernels that give
    :func:`choose_qparams_rows`' values exactly: ``max(|x|)`` is ``max(-min(x, 0), max(x, 0))``
    (``abs`` is exact), computed in ``x``'s dtype as TorchAO does, and nothing reads the data on
    the host, so it also traces (and fuses under Inductor) without a graph break. A large ``x``
    goes by chunks of rows as in :func:`quantize_rows`, each with its own rows' scales, so
    the whole quantization reads ``x`` from memory once. A float32 ``x`` takes the fused native
    pass (:mod:`asic_backend.sim.host_passes`) where it applies: the same values.
    """
    if x.dtype == torch.float32 and (fused := host_passes.quantize_sym(x, F32_EPS, out)):
        return fused
    chunks = numerics.row_spans(x.shape[0], x.shape[1])
    if len(chunks) == 1:
        scale = _sym_scale(x)
        recip = torch.reciprocal(scale)
        return _quantize_block(x, recip, None, INT8_MIN, INT8_MAX, consume=consume, out=out), scale
    q, scales = _quantize_by_chunks(
        x,
        chunks,
        lambda lo, hi: _sym_scale(x[lo:hi]),
        None,
        INT8_MIN,
        INT8_MAX,
        consume=consume,
        out=out,
    )
    return q, torch.cat(scales)


def _sym_scale(x: Tensor) -> Tensor:
    """:func:`quantize_sym_rows`' float32 scales ``[rows, 1]`` of a 2-D ``x``."""
    if x.shape[-1] == 0:  # an empty row (a layer of no input features): max |x| is 0
        return torch.full((x.shape[0], 1), F32_EPS, dtype=torch.float32, device=x.device)
    if x.shape[-1] == 1:
        return torch.clamp(x.abs().to(torch.float32) / INT8_MAX, min=F32_EPS)
    # amax is a fresh tensor: the steps on it are in place (one allocation, not three).
    numel = x.numel()
    if (
        type(numel) is int
        and numel >= TWO_REDUCTIONS_MIN_NUMEL
        and not torch.compiler.is_compiling()
    ):
        # Two reads of x instead of abs's read, write and read: half the time at 512×2048.
        scale = torch.maximum(x.amax(dim=-1, keepdim=True), x.amin(dim=-1, keepdim=True).neg_())
    else:
        scale = x.abs().amax(dim=-1, keepdim=True)
    scale = scale.div_(float(INT8_MAX - INT8_MIN) / 2).clamp_(min=F32_EPS)
    return scale if scale.dtype == torch.float32 else scale.to(torch.float32)


@dataclasses.dataclass(slots=True)
class _Weight:
    """A float linear's weight as the DUT takes it: int8 ``q [N, K]``, its float32 scales
    ``[N]``, and what the host kernels read of it, made at their first call
    (:func:`asic_backend.sim.host_gemm.static_operand`; by kernel and form)."""

    q: Tensor
    scale: Tensor
    operands: dict[tuple[str, str], host_gemm.StaticOperand] = dataclasses.field(
        default_factory=dict
    )


def _quantize_weight(w: Tensor, transposed: bool) -> _Weight:
    w_nk = w.detach().t() if transposed else w.detach()
    q, scale = quantize_sym_rows(w_nk)
    return _Weight(q.contiguous(), scale.reshape(-1))


def _cached_weight(w: Tensor, transposed: bool) -> _Weight:
    key = stamp(w)
    return _quantize_weight(w, transposed) if key is None else _kept_weight(w, transposed, key)


def _kept_weight(w: Tensor, transposed: bool, key: tuple[Any, ...]) -> _Weight:
    """``w`` quantized, kept while its :func:`stamp` is ``key``."""

    def make() -> _Weight:
        # Normal tensors even under inference_mode: the host GEMM keys its own caches on them,
        # and an inference tensor has no version counter to key on.
        with torch.inference_mode(False):
            return _quantize_weight(w, transposed)

    return _weight_cache.get(w, (*key, transposed), make)


def _dut_weight(
    w: Tensor, w_transposed: bool, cache_weight: bool, k_x: int | torch.SymInt
) -> _Weight:
    """The int8 ``[N, K]`` weight of a float linear and its scales ``[N]``, checked against the
    activations' K."""
    weight = (_cached_weight if cache_weight else _quantize_weight)(w, w_transposed)
    _check_k("dyn_linear", k_x, weight.q.shape[-1])
    return weight


#: Quantized float weights (``asic::dyn_linear``).
_weight_cache = new_cache()
#: PT2E per-layer DUT parameters: checked weight zero point, requant multipliers, int32 bias.
_qparams_cache = new_cache()


def _out_shape(x: Tensor, n: int | torch.SymInt) -> list[int | torch.SymInt]:
    return [*x.shape[:-1], n]


def _as_rows(x: Tensor) -> Tensor:
    """``x [..., K]`` as the 2-D ``[rows, K]`` of its rows (a view where it can be): for a
    layer of no input features too, where ``reshape(-1, 0)`` cannot tell the rows."""
    if x.dim() == 2:
        return x
    return x.reshape(1, x.shape[0]) if x.dim() == 1 else x.flatten(0, -2)


def _weight_kn(w: Tensor, transposed: bool) -> tuple[int | torch.SymInt, int | torch.SymInt]:
    """``(K, N)`` of a float linear's weight: ``[N, K]``, or ``[K, N]`` when ``transposed``."""
    return (w.shape[0], w.shape[1]) if transposed else (w.shape[1], w.shape[0])


def _check_k(op: str, k_x: int | torch.SymInt, k_w: int | torch.SymInt) -> None:
    if type(k_x) is int and type(k_w) is int and k_x == k_w:  # a kernel's call: no more work
        return
    _torch_check(
        k_x == k_w,
        lambda: f"asic::{op}: the input's last dim ({k_x}) != the weight's in_features ({k_w})",
    )


# -- asic::dyn_qlinear: TorchAO converted weights ----------------------------------------------


@dut_op("asic::dyn_qlinear")
def dyn_qlinear(
    x: Tensor,
    w_q: Tensor,
    w_scale: Tensor,
    bias: Tensor | None,
    act_pre_scale: Tensor | None,
    act_symmetric: bool,
    act_per_token: bool,
    act_qmin: int,
    act_qmax: int,
    act_eps: float,
    act_scale_f32: bool,
    device: str,
) -> Tensor:
    """A TorchAO dynamic-activation int8 linear on the DUT.

    ``w_q [N, K]`` int8 and ``w_scale`` (``[N, 1]`` or one element) are the converted weight's
    ``qdata`` / ``scale``; its zero point is ignored, as TorchAO's own int8 path does. The
    activation is quantized as TorchAO does (``act_*`` come from the weight's
    ``act_quant_kwargs`` / ``activation_quantization``; ``act_scale_f32`` False keeps the scale in
    ``x.dtype``, as ``IntxUnpackedToInt8Tensor`` does); the activation zero point is folded on the
    DUT; the int32 result is scaled in ``Int8Tensor``'s order: ``((acc·s_x) → x.dtype)·s_w + b``.
    """
    out_dtype = x.dtype
    if act_pre_scale is not None:
        x = x * act_pre_scale
    x2 = _as_rows(x)
    n = w_q.shape[0]
    if x2.shape[0] == 0:
        return x.new_zeros(_out_shape(x, n), dtype=out_dtype)
    scale, zp = choose_qparams_rows(
        x2,
        symmetric=act_symmetric,
        qmin=act_qmin,
        qmax=act_qmax,
        eps=act_eps,
        scale_dtype=torch.float32 if act_scale_f32 else None,
        per_tensor=not act_per_token,
    )
    # A symmetric zero point is the constant (qmax + qmin + 1) // 2: 0 for int8, no pass.
    zero_zp = act_symmetric and int((act_qmax + act_qmin + 1) / 2) == 0
    xq = quantize_rows(x2, scale, None if zero_zp else zp, act_qmin, act_qmax)
    a_zp = 0 if act_symmetric else (zp if act_per_token else zp.reshape(1))
    out = scratch_i32(xq.shape[0], n)  # rescaled into a new tensor next
    acc = run_mm_i32(xq, w_q, a_zp=a_zp, device=get_device(device), out=out)
    work = torch.float32 if scale.dtype == torch.float16 else scale.dtype
    y = (acc.to(work) * scale.to(work)).to(out_dtype) * w_scale.flatten()
    if bias is not None:
        y = y + bias
    return y.to(out_dtype).reshape(_out_shape(x, n)).contiguous()


@dyn_qlinear.register_fake
def _(
    x: Tensor,
    w_q: Tensor,
    w_scale: Tensor,
    bias: Tensor | None,
    act_pre_scale: Tensor | None,
    act_symmetric: bool,
    act_per_token: bool,
    act_qmin: int,
    act_qmax: int,
    act_eps: float,
    act_scale_f32: bool,
    device: str,
) -> Tensor:
    _check_k("dyn_qlinear", x.shape[-1], w_q.shape[-1])
    return x.new_empty(_out_shape(x, w_q.shape[0]))


# -- asic::int_mm: an int8 GEMM already quantized by the program --------------------------------


@dut_op("asic::int_mm")
def int_mm(a: Tensor, b: Tensor, device: str) -> Tensor:
    """``torch._int_mm(a, b)`` on the DUT: ``a [M, K]`` int8 (or uint8) by ``b [K, N]`` int8,
    the int32 accumulator ``[M, N]`` (with the device's accumulator). What a TorchAO int8
    layer becomes in an exported program, whose graph holds the layer's ops, not its weight
    subclass.

    A uint8 ``a`` (TorchAO's x86 form of asymmetric activations: ``q + 128``) goes to the
    int8 array as ``a - 128`` with the zero point -128 the array already folds in:
    ``(a - 128)·b + 128·colsum(b)`` is ``a·b`` exactly.
    """
    if a.shape[0] == 0:  # nothing to issue
        return a.new_zeros((0, b.shape[1]), dtype=torch.int32)
    # A view, not a copy: the host kernel keeps what it needs of b (its float copy, or b itself
    # as the row-major [K, N] int_mm reads) under b, where a fresh copy each call was a new key.
    w = b.t()
    if a.dtype == torch.uint8:
        shifted = (a.to(torch.int16) - 128).to(torch.int8)
        return run_mm_i32(shifted, w, a_zp=-128, device=get_device(device))
    return run_mm_i32(a, w, device=get_device(device))


@int_mm.register_fake
def _(a: Tensor, b: Tensor, device: str) -> Tensor:
    _check_k("int_mm", a.shape[-1], b.shape[0])
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.int32)


# -- asic::dyn_linear: float linears, dynamic int8 ---------------------------------------------


@dut_op("asic::dyn_weight_mm")
def dyn_weight_mm(
    x_q: Tensor, w: Tensor, w_transposed: bool, cache_weight: bool, device: str
) -> tuple[Tensor, Tensor]:
    """The DUT GEMM of a float linear: ``x_q [M, K]`` int8 by the float weight ``w``, quantized
    symmetric per output channel with TorchAO's formula (and cached while unchanged when
    ``cache_weight``). Returns the int32 accumulator ``[M, N]`` and the weight scales ``[N]``
    (float32). ``w_transposed``: ``w`` is ``[K, N]`` instead of ``[N, K]``.
    """
    weight = _dut_weight(w, w_transposed, cache_weight, x_q.shape[-1])
    name = _static_kernel(x_q.shape[1], x_q) if cache_weight and x_q.shape[0] else None
    if x_q.shape[0] == 0:  # nothing to issue
        acc = x_q.new_zeros((0, weight.q.shape[0]), dtype=torch.int32)
    elif name is not None:  # the fewest layers (host="inductor" calls it once a layer)
        numerics.check_gemm_operands(x_q, weight.q)
        rows = x_q.shape[0]
        name, timing = host_gemm.static_choice(name, weight.q, rows, x_q)
        operand = _call_operand(weight, name, rows, timing)
        acc = run_static_mm(x_q, operand, device=get_device(device))
        if timing is not None:
            timing.stop()
    else:
        acc = run_mm_i32(x_q, weight.q, device=get_device(device))
    # A copy: the cached scales must not be an output a compiler may reuse as a buffer.
    return acc, weight.scale.clone()


def _weight_mm(
    x_q: Tensor, w: Tensor, w_transposed: bool, cache_weight: bool, device: str
) -> tuple[Tensor, Tensor]:
    """:func:`dyn_weight_mm` with the weight scales as cached (not copied) and the accumulator
    in this thread's scratch buffer (or as float32 where the host computed it so): for
    :func:`dyn_linear`'s rescale, which only reads them before the next GEMM."""
    weight = _dut_weight(w, w_transposed, cache_weight, x_q.shape[-1])
    if x_q.shape[0] == 0:  # nothing to issue
        return x_q.new_zeros((0, weight.q.shape[0]), dtype=torch.int32), weight.scale
    out = scratch_i32(x_q.shape[0], weight.q.shape[0])
    acc = run_mm_i32(x_q, weight.q, device=get_device(device), out=out, allow_float32=True)
    return acc, weight.scale


@dyn_weight_mm.register_fake
def _(
    x_q: Tensor, w: Tensor, w_transposed: bool, cache_weight: bool, device: str
) -> tuple[Tensor, Tensor]:
    k_w, n = _weight_kn(w, w_transposed)
    _check_k("dyn_linear", x_q.shape[-1], k_w)
    return x_q.new_empty((x_q.shape[0], n), dtype=torch.int32), w.new_empty(
        (n,), dtype=torch.float32
    )


def _dyn_linear(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    w_transposed: bool,
    cache_weight: bool,
    device: str,
    gemm: Callable[[Tensor, Tensor, bool, bool, str], tuple[Tensor, Tensor]],
) -> Tensor:
    xq, x_scale = quantize_sym_rows(_as_rows(x))
    acc, w_scale = gemm(xq, w, w_transposed, cache_weight, device)
    y = numerics.dequantize_acc(acc, x_scale, w_scale, bias)  # new, contiguous, float32
    # Each no-op step would still be a dispatch: a cache miss or more in a model's decode step.
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    return y if x.dim() == 2 else y.reshape(_out_shape(x, acc.shape[-1]))


@dut_op("asic::dyn_linear")
def dyn_linear(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    w_transposed: bool,
    cache_weight: bool,
    device: str,
) -> Tensor:
    """A float linear ``x @ Wᵀ + b`` run as dynamic int8 on the DUT.

    Weights are quantized symmetric per output channel (and cached while unchanged when
    ``cache_weight``), activations symmetric per token, both with TorchAO's formula; the int32
    result is scaled on the host. ``w_transposed``: ``w`` is ``[K, N]`` (``x @ w``, GPT-2's
    ``Conv1D``) instead of ``[N, K]``.
    """
    x2 = _as_rows(x)  # a copy at most once
    y = _native_dyn_linear(x2, w, bias, w_transposed, device) if cache_weight else None
    if y is None:
        y = _dyn_linear(x2, w, bias, w_transposed, cache_weight, device, _weight_mm)
    return y if x.dim() == 2 else y.reshape(_out_shape(x, y.shape[-1]))


def _static_kernel(k: int, *operands: Tensor) -> str | None:
    """The host kernel that multiplies activations of K ``k`` (``operands``, where not already
    checked: :func:`asic_backend.sim.host_gemm.kernel_for`) by a weight, where it keeps an
    operand of the weight (:data:`asic_backend.sim.host_gemm.STATIC_KERNELS`); None where it
    keeps nothing (``float32``, ``float64``) or K takes the exact int64 path."""
    if not numerics.int_mm_applies(k):
        return None
    name = host_gemm.kernel_for(k, *operands, kept=True)
    return name if name in host_gemm.STATIC_KERNELS else None


def _kept_operand(weight: _Weight, name: str, rows: int) -> host_gemm.StaticOperand:
    """What kernel ``name`` reads of ``weight`` to multiply ``rows`` rows by it, made at its
    first use and kept on it (:func:`asic_backend.sim.host_gemm.static_operand`)."""
    form = host_gemm.static_form(name, rows)
    operand = weight.operands.get((name, form))
    if operand is None:
        operand = host_gemm.static_operand(name, weight.q, rows, form)
        weight.operands[(name, form)] = operand
    return operand


def _call_operand(
    weight: _Weight, name: str, rows: int, timing: kernel_choice.Timing | None
) -> host_gemm.StaticOperand:
    """:func:`_kept_operand`, or in a call of a kernel trial (``timing``:
    :func:`asic_backend.sim.host_gemm.static_choice`) the operand of kernel ``name`` as the
    host GEMM keeps it, not on ``weight`` (the trial releases the loser's), then ``timing``
    started: its making is not timed."""
    if timing is None:
        return _kept_operand(weight, name, rows)
    operand = host_gemm.static_operand(name, weight.q, rows)
    timing.start()
    return operand


def _native_dyn_linear(
    x: Tensor, w: Tensor, bias: Tensor | None, w_transposed: bool, device: str
) -> Tensor | None:
    """:func:`dyn_linear` of a 2-D ``x`` by a kept weight in its fewest steps: the native
    quantization and rescale around the GEMM on the operand the weight keeps for the host
    kernel (:func:`asic_backend.sim.host_passes.linear`, :func:`run_static_mm`; with ``int16``,
    the three in one native call, and with ``int_mm`` at prefill shapes, the GEMM and rescale
    tile by tile: :func:`asic_backend.sim.host_gemm.native_linear_gemm`). None where they do not
    apply: the general path, the same values.

    The general path asks its questions again at each layer (the passes' checks, the weight's
    caches, the kernel), and at decode shapes, with the CPU's caches cold from the layers
    before, those layers cost more than the passes: about 70 µs over the GEMM against 50 µs
    at 8×2048×2048, run round robin with other layers (two threads, ``int_mm``, AVX-512 VNNI
    host). The weight is looked up only once ``x`` passes, and after the kernel, so a call
    the native path declines (bfloat16, the aten passes, ``float32``) pays its checks (3 to
    5 µs, warm), not a second lookup."""
    rows, k = x.shape
    trial: list[kernel_choice.Timing] = []  # this call's, where it is one of a kernel trial's

    def prepare() -> (
        tuple[Tensor, Callable[[Tensor], Tensor] | host_passes.NativeGemm | host_passes.TiledGemm]
        | None
    ):
        name = _static_kernel(k)  # x is plain: host_passes.linear checked it before asking
        key = None if name is None else stamp(w)
        if name is None or key is None:
            return None
        weight = _kept_weight(w, w_transposed, key)
        if weight.q.shape[1] != k:
            return None  # the general path says so
        name, timing = host_gemm.static_choice(name, weight.q, rows, path="linear")
        if timing is not None:
            trial.append(timing)
        operand = _call_operand(weight, name, rows, timing)
        n, dut = weight.q.shape[0], get_device(device)
        fused = host_gemm.native_linear_gemm(
            operand, rows, functools.partial(record_mm, rows, k, n, device=dut)
        )
        if fused is not None:
            return weight.scale, fused

        def gemm(q: Tensor) -> Tensor:
            return run_static_mm(q, operand, device=dut, out=scratch_i32(rows, n))

        return weight.scale, gemm

    y = host_passes.linear(x, bias, F32_EPS, prepare)
    # A declined call (a row of inf or NaN) times nothing here: the general path's GEMM is a
    # call of the "gemm" path's own trial.
    if trial and y is not None:
        trial[0].stop()
    return y


@dyn_linear.register_fake
def _(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    w_transposed: bool,
    cache_weight: bool,
    device: str,
) -> Tensor:
    k_w, n = _weight_kn(w, w_transposed)
    _check_k("dyn_linear", x.shape[-1], k_w)
    return x.new_empty(_out_shape(x, n))


def _dyn_linear_fusable(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    w_transposed: bool,
    cache_weight: bool,
    device: str,
) -> Tensor:
    gemm = torch.ops.asic.dyn_weight_mm.default
    return _dyn_linear(x, w, bias, w_transposed, cache_weight, device, gemm)


# asic::dyn_linear as the host compiler should see it: CompositeImplicitAutograd, so AOTAutograd
# traces through it (functionalizing the in-place steps) and the graph holds the activation
# quantization and the rescale as aten ops around the one opaque DUT GEMM: Inductor fuses each
# side into one kernel, with its neighbours. Same numbers as asic::dyn_linear.
torch.library.define(
    "asic::dyn_linear_fusable", torch.library.infer_schema(_dyn_linear_fusable, mutates_args=())
)
torch.library.impl("asic::dyn_linear_fusable", "CompositeImplicitAutograd", _dyn_linear_fusable)


# -- asic::dyn_matmul: activation x activation -------------------------------------------------


def dut_matmul(
    a: Tensor, b: Tensor, device: str, alpha: float = 1.0, *, consume_a: bool = False
) -> Tensor:
    """``alpha · (a @ b)`` of two float activations on the DUT, as float32: ``[..., M, K] @
    [..., K, N]``, batch dims broadcast, ``a`` quantized symmetric per row and ``b`` per column;
    one DUT GEMM per batch element. ``alpha`` is folded into the rescale (no extra pass).
    ``consume_a``: ``a`` is the caller's float32 temporary, quantized in place (attention's
    probabilities: a new tensor as large is a pass over fresh pages)."""
    batch = _broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if batch.numel() * m * k * n == 0:  # nothing to multiply (an empty sum is 0)
        return a.new_zeros((*batch, m, n), dtype=torch.float32)
    a3 = a.expand(*batch, m, k).reshape(batch.numel(), m, k)
    b3 = b.expand(*batch, k, n).reshape(batch.numel(), k, n)
    aq, a_scale = quantize_sym_rows(a3.reshape(-1, k), consume=consume_a and a3.is_contiguous())
    # b per column: in one pass over a row-major b (attention's V), else as rows of bᵀ (a copy
    # unless b is a transposed view, as attention's Kᵀ is).
    cols = host_passes.quantize_sym_cols(b3, F32_EPS) if b3.is_contiguous() else None
    if cols is not None:
        bq_cols, b_scale = cols
        bq = bq_cols.transpose(1, 2)  # [B, N, K], a view
    else:
        bq, b_scale = quantize_sym_rows(b3.transpose(1, 2).reshape(-1, k))
        bq = bq.reshape(-1, n, k)
    acc = run_bmm_i32(aq.reshape(-1, m, k), bq, device=get_device(device), allow_float32=True)
    if alpha != 1.0:
        a_scale = a_scale * alpha
    y = numerics.scale_acc(acc, a_scale.reshape(-1, m, 1), b_scale.reshape(-1, 1, n), consume=True)
    return y.reshape(*batch, m, n)


@dut_op("asic::dyn_matmul")
def dyn_matmul(a: Tensor, b: Tensor, device: str) -> Tensor:
    """``a @ b`` of two activations (``[..., M, K] @ [..., K, N]``, batch dims broadcast), both
    quantized dynamically: ``a`` symmetric per row, ``b`` symmetric per column; one DUT GEMM per
    batch element (:func:`dut_matmul`)."""
    return dut_matmul(a, b, device).to(a.dtype).contiguous()


@dyn_matmul.register_fake
def _(a: Tensor, b: Tensor, device: str) -> Tensor:
    _check_k("dyn_matmul", a.shape[-1], b.shape[-2])
    batch = _broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.new_empty((*batch, a.shape[-2], b.shape[-1]))


# -- asic::qlinear: PT2E (quantized_decomposed) linears ----------------------------------------


@dut_op("asic::qlinear")
def qlinear(
    x_q: Tensor,
    x_scale: Tensor,
    x_zp: Tensor,
    w_q: Tensor,
    w_scale: Tensor,
    w_zp: Tensor,
    bias: Tensor | None,
    y_scale: float,
    y_zp: int,
    y_qmin: int,
    y_qmax: int,
    out_dtype: torch.dtype,
    device: str,
) -> Tensor:
    """A PT2E ``dequantize_per_tensor → linear(·, dequantize_per_channel(W), b)`` on the DUT.

    ``x_q`` is int8 or uint8 (shifted to int8 exactly), with a one-element ``x_scale``/``x_zp``
    (static ones are constants, dynamic ones come from ``choose_qparams``); ``w_q [N, K]`` int8
    with ``w_scale``/``w_zp`` per channel or per tensor (the zero point must be 0).
    ``out_dtype`` int8/uint8: the following ``quantize_per_tensor(y_scale, y_zp, y_qmin,
    y_qmax)`` is fused (a folded ReLU raises ``y_qmin`` to ``y_zp``): the bias is quantized to
    int32, and the DUT requantizes with a fixed-point multiplier per channel. Otherwise the
    int32 result is scaled on the host into ``out_dtype``.
    """
    dev = get_device(device)
    k = x_q.shape[-1]
    n = w_q.shape[0]
    x2, a_zp, s_x = pt2e_activation(x_q.reshape(-1, k), x_scale, x_zp)
    requant = out_dtype in (torch.int8, torch.uint8)
    params = qlinear_params(w_scale, w_zp, bias, s_x, y_scale if requant else None)
    if x2.shape[0] == 0:
        return x_q.new_zeros(_out_shape(x_q, n), dtype=out_dtype)
    if requant:
        window = Pt2eOutput.of(out_dtype, y_zp, y_qmin, y_qmax)
        assert params.multiplier is not None
        assert params.shift is not None
        y = run_linear_requant(
            x2,
            w_q,
            a_zp=a_zp,
            bias_i32=params.bias_i32,
            multiplier=params.multiplier,
            shift=params.shift,
            out_zp=window.zp,
            qmin=window.qmin,
            qmax=window.qmax,
            device=dev,
        )
        y = window.to_dtype(y)
    else:
        acc = run_mm_i32(x2, w_q, a_zp=a_zp, device=dev)
        y = numerics.dequantize_acc(acc, s_x, params.w_scale, bias).to(out_dtype)
    return y.reshape(_out_shape(x_q, n)).contiguous()


def pt2e_activation(x_q: Tensor, x_scale: Tensor, x_zp: Tensor) -> tuple[Tensor, int, float]:
    """A PT2E per-tensor activation as the int8 array takes it: ``(x int8, zero-point,
    scale)``; uint8 data (x86) is shifted by :data:`UINT8_SHIFT`, values and zero-point, exactly."""
    a_zp = int(x_zp.reshape(-1)[0])
    if x_q.dtype == torch.uint8:
        x_q = (x_q.to(torch.int16) - UINT8_SHIFT).to(torch.int8)
        a_zp -= UINT8_SHIFT
    return x_q, a_zp, float(x_scale.reshape(-1)[0])


@dataclasses.dataclass(frozen=True)
class Pt2eOutput:
    """A fused ``quantize_per_tensor``'s zero-point and range in the array's int8 domain: a
    uint8 output is produced as int8 shifted down by ``offset``, then shifted back."""

    dtype: torch.dtype
    offset: int
    zp: int
    qmin: int
    qmax: int

    @classmethod
    def of(cls, dtype: torch.dtype, zp: int, qmin: int, qmax: int) -> Pt2eOutput:
        offset = UINT8_SHIFT if dtype == torch.uint8 else 0
        return cls(dtype, offset, zp - offset, qmin - offset, qmax - offset)

    def to_dtype(self, y: Tensor) -> Tensor:
        """The array's int8 result as the output dtype."""
        return (y.to(torch.int16) + self.offset).to(self.dtype) if self.offset else y


class QParams:
    """A PT2E layer's DUT parameters, derived once per (weights, static scales)."""

    __slots__ = ("bias_i32", "multiplier", "shift", "w_scale")

    def __init__(
        self, w_scale: Tensor, w_zp: Tensor, bias: Tensor | None, s_x: float, y_scale: float | None
    ) -> None:
        numerics.check_weight_zp(w_zp)
        self.w_scale = w_scale.detach().to(torch.float32).reshape(-1)
        self.bias_i32: Tensor | None = None
        self.multiplier: Tensor | None = None
        self.shift: Tensor | None = None
        if y_scale is not None:
            s_w = w_scale.detach().to(torch.float64).reshape(-1)
            if bias is not None:
                self.bias_i32 = numerics.quantize_bias(bias.detach(), s_x * s_w)
            self.multiplier, self.shift = numerics.quantize_multiplier(s_x * s_w / y_scale)


def qlinear_params(
    w_scale: Tensor, w_zp: Tensor, bias: Tensor | None, s_x: float, y_scale: float | None
) -> QParams:
    stamps = (stamp(w_scale), stamp(w_zp), stamp(bias))
    key = None if None in stamps else (*stamps, s_x, y_scale)
    return _qparams_cache.get(w_scale, key, lambda: QParams(w_scale, w_zp, bias, s_x, y_scale))


@qlinear.register_fake
def _(
    x_q: Tensor,
    x_scale: Tensor,
    x_zp: Tensor,
    w_q: Tensor,
    w_scale: Tensor,
    w_zp: Tensor,
    bias: Tensor | None,
    y_scale: float,
    y_zp: int,
    y_qmin: int,
    y_qmax: int,
    out_dtype: torch.dtype,
    device: str,
) -> Tensor:
    _check_k("qlinear", x_q.shape[-1], w_q.shape[-1])
    return x_q.new_empty(_out_shape(x_q, w_q.shape[0]), dtype=out_dtype)
