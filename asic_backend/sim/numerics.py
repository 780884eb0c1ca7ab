"""The simulator's numeric contract, in one place, as vectorized torch.

``acc[m,n] = Σ_k a_q[m,k]·w_q[n,k] − zp_a·Σ_k w_q[n,k] + bias_i32[n]`` in an int32 accumulator,
then, for int8 outputs, TFLite/gemmlowp fixed-point requantization and saturation.

* Activations are int8 with a zero-point (per tensor, or per row for per-token quantization);
  weights are int8 with zero-point 0 (per-tensor or per-channel scales).
* Accumulator overflow, per :attr:`AsicConfig.acc_overflow`: ``"wrap"`` is two's complement
  int32 arithmetic (order-independent, so one whole-GEMM computation equals any tiling of the
  array);
  ``"saturate"`` clamps the exact result to int32 once, on readout (also order-independent).
* Requantization, per :attr:`AsicConfig.requant_rounding`: ``"tflite"`` is
  ``RDBPOT(SRDHM(sat32(acc << left), M), right)`` (gemmlowp), ``"float64_rne"`` applies the same
  fixed-point multiplier ``M·2^(shift−31)`` in float64 and rounds half to even.

The pure-Python integer golden model in ``tests/asic/golden.py`` defines "bit-exact": every function
here must equal it exactly. Shape/dtype checks (the ``check_*`` functions) touch no data, so the
custom ops' fake kernels use them too.
"""

from __future__ import annotations

import torch

from asic_backend.sim import host_gemm, host_passes

# Defined with the config fields they type; re-exported here, where the numerics use them.
from asic_backend.sim.config import ACC_OVERFLOWS, REQUANT_ROUNDINGS
from asic_backend.sim.config import AccOverflow as AccOverflow
from asic_backend.sim.config import RequantRounding as RequantRounding
from asic_backend.sim.tensor_cache import new_cache, stamp

INT8_MIN, INT8_MAX = -128, 127
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
#: The largest |a·w| of two int8 values: (−128)·(−128).
MAX_INT8_PRODUCT = 2**14
#: The largest K for which no int8 GEMM can overflow int32 (K·2^14 ≤ 2^31 − 1), so
#: ``torch._int_mm`` is exact. Static, so the fast path never has to look at the data.
INT_MM_MAX_K = INT32_MAX // MAX_INT8_PRODUCT
#: Bounds of a TFLite shift: at most 30 to the left, 31 to the right.
SHIFT_MIN, SHIFT_MAX = -31, 30

_I32_SPAN = 2**32


# -- input checks (shape and dtype only: safe on fake tensors) --------------------------------


def _describe(t: torch.Tensor) -> str:
    return f"{t.dtype} of shape {tuple(t.shape)}"


def check_gemm_operands(
    a_q: torch.Tensor, w_q: torch.Tensor, bias_i32: torch.Tensor | None = None
) -> None:
    """Raise a one-line error unless ``a_q [M,K] int8 · w_q [N,K] int8 (+ int32 bias [N])``."""
    if a_q.dtype != torch.int8 or a_q.dim() != 2:
        raise TypeError(
            f"asic: activations must be a 2-D int8 tensor [M, K], got {_describe(a_q)}; "
            "quantize them (uint8: subtract 128 from values and zero-point) and flatten to 2-D"
        )
    if w_q.dtype != torch.int8 or w_q.dim() != 2:
        raise TypeError(
            f"asic: weights must be a 2-D int8 tensor [N, K], got {_describe(w_q)}; "
            "quantize them symmetrically to int8 first"
        )
    if a_q.shape[1] != w_q.shape[1]:
        raise ValueError(
            f"asic: inner dimensions differ: activations [M, K]={tuple(a_q.shape)}, "
            f"weights [N, K]={tuple(w_q.shape)}; weights must be [out_features, in_features]"
        )
    if bias_i32 is not None:
        if bias_i32.dtype != torch.int32:
            raise TypeError(
                f"asic: bias must be an int32 tensor [N], got {_describe(bias_i32)}; "
                "quantize it with asic_backend.sim.numerics.quantize_bias"
            )
        if bias_i32.dim() != 1 or bias_i32.shape[0] != w_q.shape[0]:
            raise ValueError(
                f"asic: bias must have shape [N]=({w_q.shape[0]},), got {tuple(bias_i32.shape)}"
            )


def check_a_zp_tensor(a_zp: torch.Tensor, m: int | torch.SymInt) -> None:
    """Raise unless ``a_zp`` is int32: per tensor ``[]``/``[1]``/``[1,1]`` or per row ``[M,1]``."""
    if a_zp.dtype != torch.int32:
        raise TypeError(
            f"asic: the activation zero-point must be an int32 tensor, got {_describe(a_zp)}; "
            "convert it with .to(torch.int32)"
        )
    per_tensor = a_zp.dim() == 0 or (a_zp.dim() == 1 and a_zp.shape[0] == 1)
    # [M, 1] per row, or [1, 1] (per tensor, kept 2-D); M first so a symbolic M is not guarded.
    per_row = a_zp.dim() == 2 and a_zp.shape[1] == 1 and (a_zp.shape[0] == m or a_zp.shape[0] == 1)
    if not (per_tensor or per_row):
        raise ValueError(
            f"asic: the activation zero-point must have shape [], [1], [1, 1] or [M, 1]=({m}, 1), "
            f"got {tuple(a_zp.shape)}"
        )


def check_requant_params(
    multiplier: torch.Tensor, shift: torch.Tensor, n: int | torch.SymInt
) -> None:
    """Raise unless multiplier/shift are int32, per tensor (``[]``/``[1]``) or channel (``[N]``)."""
    for label, t in (("multiplier", multiplier), ("shift", shift)):
        if t.dtype != torch.int32:
            raise TypeError(
                f"asic: the requantization {label} must be an int32 tensor, got {_describe(t)}; "
                "make it with asic_backend.sim.numerics.quantize_multiplier"
            )
        if not (t.dim() == 0 or (t.dim() == 1 and (t.shape[0] == 1 or t.shape[0] == n))):
            raise ValueError(
                f"asic: the requantization {label} must have shape [], [1] or [N]=({n},) "
                f"(per tensor or per output channel), got {tuple(t.shape)}"
            )


def check_int8_qparams(a_zp: int | None, out_zp: int, qmin: int, qmax: int) -> None:
    """Raise unless the zero-points and the output range lie in int8."""
    if a_zp is not None:
        _check_int8_zp("activation zero-point", a_zp)
    _check_int8_zp("output zero-point", out_zp)
    if not INT8_MIN <= qmin <= qmax <= INT8_MAX:
        raise ValueError(
            f"asic: the output range must satisfy {INT8_MIN} <= qmin <= qmax <= {INT8_MAX}, "
            f"got qmin={qmin}, qmax={qmax}"
        )


def _check_int8_zp(label: str, zp: int) -> None:
    if not INT8_MIN <= zp <= INT8_MAX:
        raise ValueError(
            f"asic: the {label} {zp} is outside int8 [{INT8_MIN}, {INT8_MAX}]; "
            "for uint8 data subtract 128 from both the values and the zero-point"
        )


def check_acc_overflow(acc_overflow: str) -> None:
    if acc_overflow not in ACC_OVERFLOWS:
        allowed = " or ".join(map(repr, ACC_OVERFLOWS))
        raise ValueError(f"asic: acc_overflow must be {allowed}, got {acc_overflow!r}")


#: Why a layer with a non-zero weight zero-point stays on the host (the lowering's reason).
ASYMMETRIC_WEIGHTS = (
    "asymmetric weights (a non-zero weight zero point): the DUT takes symmetric int8 weights"
)


def is_symmetric_weight_zp(w_zp: torch.Tensor | int | None) -> bool:
    """Whether the weight zero-point is absent or all zeros: the array has no weight offset.

    This one reads data; call it when the weight is prepared, not per GEMM.
    """
    return w_zp is None or not bool(torch.as_tensor(w_zp).ne(0).any())


def check_weight_zp(w_zp: torch.Tensor | int | None) -> None:
    """Raise unless :func:`is_symmetric_weight_zp`: the one check of a weight zero-point."""
    if not is_symmetric_weight_zp(w_zp):
        raise ValueError(
            "asic: weights must be quantized symmetrically (zero-point 0); got a non-zero weight "
            "zero-point. Use a symmetric weight config or leave this layer on the host"
        )


# -- the int32 accumulator --------------------------------------------------------------------


def int_mm_applies(k: int) -> bool:
    """Whether the int32 fast path (:func:`asic_backend.sim.host_gemm.mm_i32`) computes a reduction
    of length ``k`` exactly: no int8 GEMM of that length can overflow int32."""
    return k <= INT_MM_MAX_K


def _exact_gemm_i64(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    # Every partial sum is an integer below K·2^14, exact in float64 while K < 2^39.
    return (a_q.double() @ w_q.double().t()).to(torch.int64)


def _rowsum_w(w_q: torch.Tensor, fast: bool) -> torch.Tensor:
    """Σ_k w_q[n,k] as an exact int64 [N], kept while ``w_q`` (a weight) is unchanged."""
    version = stamp(w_q)
    key = None if version is None else (*version, fast)
    return _rowsums.get(w_q, key, lambda: _rowsum(w_q, fast))


def _rowsum(w_q: torch.Tensor, fast: bool) -> torch.Tensor:
    if fast:
        # An int8 reduction in torch is ~100x slower than a 1-row GEMM; |Σ| ≤ 128·K fits int32.
        ones = torch.ones((1, w_q.shape[1]), dtype=torch.int8, device=w_q.device)
        return host_gemm.mm_i32(ones, w_q, w_static=True)[0].to(torch.int64)
    return w_q.sum(dim=1, dtype=torch.int64)


#: Σ_k w_q[n,k] of the weights the zero-point correction multiplies.
_rowsums = new_cache()


def narrow_i32(exact: torch.Tensor, acc_overflow: AccOverflow) -> torch.Tensor:
    """Narrow an exact int64 accumulator to int32: two's complement wrap, or saturate."""
    if acc_overflow == "saturate":
        return exact.clamp_(INT32_MIN, INT32_MAX).to(torch.int32)
    # Explicit modular reduction: an int64 -> int32 cast is not a documented wrap in torch.
    return exact.add_(2**31).bitwise_and_(_I32_SPAN - 1).sub_(2**31).to(torch.int32)


def _normalize_zp(a_zp: int | torch.Tensor, m: int) -> int | torch.Tensor:
    """The zero-point as a Python int (per tensor) or an int64 [M,1] tensor (per row)."""
    if isinstance(a_zp, torch.Tensor):
        check_a_zp_tensor(a_zp, m)
        lo, hi = (int(v) for v in torch.aminmax(a_zp)) if a_zp.numel() else (0, 0)
        _check_int8_zp("activation zero-point", lo)
        _check_int8_zp("activation zero-point", hi)
        if lo == hi:  # per tensor in disguise (or M = 0): the cheaper path, same numbers
            return lo
        return a_zp.to(torch.int64)
    if isinstance(a_zp, bool) or not isinstance(a_zp, int):
        raise TypeError(
            f"asic: the activation zero-point must be an int or an int32 tensor, got {a_zp!r}"
        )
    _check_int8_zp("activation zero-point", a_zp)
    return a_zp


def gemm_i32(
    a_q: torch.Tensor, w_q: torch.Tensor, acc_overflow: AccOverflow = "wrap"
) -> torch.Tensor:
    """``a_q [M,K] int8 · w_q [N,K]ᵀ int8`` accumulated in int32 (wrapping or saturating)."""
    return linear_i32(a_q, w_q, acc_overflow=acc_overflow)


def linear_i32(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    a_zp: int | torch.Tensor = 0,
    bias_i32: torch.Tensor | None = None,
    acc_overflow: AccOverflow = "wrap",
    *,
    out: torch.Tensor | None = None,
    allow_float32: bool = False,
) -> torch.Tensor:
    """The int32 accumulator ``a_q·w_qᵀ − a_zp·rowsum(w_q) + bias_i32``, shape [M,N], contiguous.

    ``a_zp`` is an int, or an int32 tensor: ``[]``/``[1]``/``[1,1]`` per tensor, ``[M,1]`` per row.
    The result is exact then wrapped or saturated per ``acc_overflow``; it never aliases an input.
    ``out``: a contiguous int32 [M,N] the int32 path may write the result into (such as
    :func:`asic_backend.sim.host_gemm.scratch_i32`); the returned tensor is the result either way.
    ``allow_float32``: without a zero-point or bias, the result may be float32 holding the same
    values (:func:`asic_backend.sim.host_gemm.mm_i32`), for a caller that rescales it in float32.

    >>> a = torch.tensor([[1, -2, 3]], dtype=torch.int8)
    >>> w = torch.tensor([[4, 5, 6], [-1, 0, 1]], dtype=torch.int8)
    >>> linear_i32(a, w), linear_i32(a, w, a_zp=1)
    (tensor([[12,  2]], dtype=torch.int32), tensor([[-3,  2]], dtype=torch.int32))
    """
    check_gemm_operands(a_q, w_q, bias_i32)
    check_acc_overflow(acc_overflow)
    m, k = a_q.shape
    zp = _normalize_zp(a_zp, m)
    fast = int_mm_applies(k)
    has_zp = isinstance(zp, torch.Tensor) or zp != 0

    # acc is int32 on the fast path, else exact int64 (narrowed at the end).
    if fast:
        plain = allow_float32 and not has_zp and bias_i32 is None
        acc = host_gemm.mm_i32(a_q, w_q, out=out, w_static=True, allow_float32=plain)
    else:
        acc = _exact_gemm_i64(a_q, w_q)
    if not has_zp and bias_i32 is None:
        return acc if fast else narrow_i32(acc, acc_overflow)

    bias = bias_i32.to(torch.int64) if bias_i32 is not None else None
    if isinstance(zp, int):
        # Per tensor: fold the zero-point and the bias into one int64 vector [N].
        corr = bias if bias is not None else w_q.new_zeros(w_q.shape[0], dtype=torch.int64)
        if zp != 0:
            corr = corr - zp * _rowsum_w(w_q, fast)
        if fast and k * MAX_INT8_PRODUCT + _abs_max(corr) <= INT32_MAX:
            # No partial result can leave int32, so plain int32 arithmetic is exact.
            return acc.add_(corr.to(torch.int32))
        return narrow_i32(acc.to(torch.int64).add_(corr), acc_overflow)

    # Per row: the correction zp[m]·rowsum[n] is a rank-1 [M,N] term.
    rowsum = _rowsum_w(w_q, fast)
    bias_max = _abs_max(bias) if bias is not None else 0
    if fast and k * MAX_INT8_PRODUCT + _abs_max(zp) * _abs_max(rowsum) + bias_max <= INT32_MAX:
        if bias is not None:
            acc.add_(bias.to(torch.int32))
        return acc.addcmul_(zp.to(torch.int32), rowsum.to(torch.int32), value=-1)
    exact = acc.to(torch.int64).addcmul_(zp, rowsum, value=-1)
    if bias is not None:
        exact.add_(bias)
    return narrow_i32(exact, acc_overflow)


def bmm_i32(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    acc_overflow: AccOverflow = "wrap",
    *,
    allow_float32: bool = False,
) -> torch.Tensor:
    """A batch of GEMMs ``a_q[b] · w_q[b]ᵀ`` (int8 ``[B, M, K]`` by ``[B, N, K]``): int32
    ``[B, M, N]``, contiguous, each equal to :func:`linear_i32` of its pair. ``allow_float32``:
    the result may be float32 holding the same values, where the host computed it so."""
    if a_q.dim() != 3 or w_q.dim() != 3 or a_q.shape[0] != w_q.shape[0]:
        raise ValueError(
            f"asic: a batched GEMM takes [B, M, K] and [B, N, K], got {_describe(a_q)} and "
            f"{_describe(w_q)}"
        )
    batch, m, k = a_q.shape
    if batch == 0 or not int_mm_applies(k):
        out = [linear_i32(a_q[i], w_q[i], acc_overflow=acc_overflow) for i in range(batch)]
        return torch.stack(out) if out else a_q.new_zeros((0, m, w_q.shape[1]), dtype=torch.int32)
    check_gemm_operands(a_q[0], w_q[0])
    # exact: no int8 reduction of length k can leave int32
    return host_gemm.bmm_i32(a_q, w_q, allow_float32=allow_float32)


def _abs_max(t: torch.Tensor) -> int:
    return int(t.abs().max()) if t.numel() else 0


# -- requantization ---------------------------------------------------------------------------


def quantize_multiplier(real: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TFLite ``QuantizeMultiplier``, vectorized: ``real ≈ multiplier · 2^(shift − 31)``.

    Returns int32 tensors shaped like ``real``, with ``multiplier`` in ``[2^30, 2^31)`` (or 0).
    Multipliers below 2^-31 flush to zero; shifts above 30 saturate to ``(2^31 − 1, 30)``.

    >>> mult, shift = quantize_multiplier(0.25)       # 0.25 = 2^30 · 2^(−1 − 31)
    >>> int(mult), int(shift)
    (1073741824, -1)
    """
    r = torch.as_tensor(real, dtype=torch.float64)
    bad = r[~(torch.isfinite(r) & (r >= 0))]
    if bad.numel():
        raise ValueError(
            "asic: a requantization multiplier (s_in·s_w/s_out) must be finite and >= 0, "
            f"got {bad.flatten()[0].item()}"
        )
    mantissa, exponent = torch.frexp(r)
    # mantissa·2^31 < 2^31 is exact in float64, so +0.5 and floor round half away from zero.
    q = torch.floor(mantissa * 2**31 + 0.5).to(torch.int64)
    shift = exponent.to(torch.int64)
    carry = q == 2**31
    q = torch.where(carry, q // 2, q)
    shift = torch.where(carry, shift + 1, shift)
    tiny = shift < SHIFT_MIN
    q = torch.where(tiny, 0, q)
    shift = torch.where(tiny, 0, shift)
    huge = shift > SHIFT_MAX
    q = torch.where(huge, INT32_MAX, q)
    shift = torch.where(huge, SHIFT_MAX, shift)
    return q.to(torch.int32), shift.to(torch.int32)


def _check_requant_values(multiplier: torch.Tensor, shift: torch.Tensor) -> None:
    # Data checks, on the tiny parameter vectors: a negative multiplier would need the gemmlowp
    # INT32_MIN·INT32_MIN saturation case and an out-of-range shift would overflow the int64 math.
    if multiplier.numel() and int(multiplier.min()) < 0:
        raise ValueError("asic: requantization multipliers must be >= 0 (see quantize_multiplier)")
    if shift.numel():
        lo, hi = (int(v) for v in torch.aminmax(shift))
        if lo < SHIFT_MIN or hi > SHIFT_MAX:
            raise ValueError(
                f"asic: requantization shifts must lie in [{SHIFT_MIN}, {SHIFT_MAX}], "
                f"got [{lo}, {hi}] (see quantize_multiplier)"
            )


def multiply_by_quantized_multiplier(
    x: torch.Tensor, multiplier: torch.Tensor, shift: torch.Tensor
) -> torch.Tensor:
    """gemmlowp ``RDBPOT(SRDHM(sat32(x << left), M), right)`` of int32 ``x``, as exact int64.

    ``multiplier``/``shift`` broadcast along the last dimension. The left shift saturates
    (gemmlowp's ``ShiftLeft``) where TFLite's ``x * (1 << left)`` would overflow int32.
    """
    _check_requant_values(multiplier, shift)
    mult = multiplier.to(torch.int64).reshape(-1)
    sh = shift.to(torch.int64).reshape(-1)
    out = x.to(torch.int64, copy=True)  # every step below is in place
    left = sh.clamp(min=0)
    if bool(left.any()):
        out = out.bitwise_left_shift_(left).clamp_(INT32_MIN, INT32_MAX)
    # SRDHM = trunc((a·b + nudge) / 2^31), nudge = 2^30 if a·b >= 0 else 1 − 2^30. For both signs
    # that equals floor((a·b + 2^30) / 2^31): one add and an arithmetic shift. (The INT32_MIN²
    # saturation case needs a negative multiplier, which is rejected above.)
    out.mul_(mult).add_(1 << 30).bitwise_right_shift_(31)
    right = (-sh).clamp(min=0)
    if bool(right.any()):
        # RDBPOT rounds half away from zero: (x + 2^(e−1) − [x < 0]) >> e for e > 0, x for e = 0.
        half = (torch.ones_like(right) << right) >> 1
        negative = out >> 63  # −1 where x < 0, else 0
        if not bool((right > 0).all()):
            negative.bitwise_and_(-(right > 0).to(torch.int64))
        out.add_(negative).add_(half).bitwise_right_shift_(right)
    return out


def requantize(
    acc: torch.Tensor,
    multiplier: torch.Tensor,
    shift: torch.Tensor,
    out_zp: int,
    qmin: int,
    qmax: int,
    rounding: RequantRounding = "tflite",
) -> torch.Tensor:
    """int32 accumulator [M,N] -> int8: scale by ``multiplier·2^(shift−31)``, add ``out_zp``, clamp.

    ``multiplier``/``shift`` are int32, per tensor (``[]``/``[1]``) or per channel (``[N]``).
    ``rounding="tflite"`` is gemmlowp fixed point; ``"float64_rne"`` multiplies in float64 by the
    same (exactly representable) multiplier and rounds half to even.

    >>> mult, shift = quantize_multiplier(0.25)
    >>> requantize(torch.tensor([[100, -7]], dtype=torch.int32), mult, shift, 0, -128, 127)
    tensor([[25, -2]], dtype=torch.int8)
    """
    if acc.dtype != torch.int32 or acc.dim() != 2:
        raise TypeError(
            f"asic: requantize expects an int32 [M, N] accumulator, got {_describe(acc)}"
        )
    check_requant_params(multiplier, shift, acc.shape[1])
    check_int8_qparams(None, out_zp, qmin, qmax)
    if rounding == "tflite":
        scaled = multiply_by_quantized_multiplier(acc, multiplier, shift)
    elif rounding == "float64_rne":
        _check_requant_values(multiplier, shift)
        real = multiplier.to(torch.float64).reshape(-1) * torch.exp2(
            shift.to(torch.float64).reshape(-1) - 31
        )
        scaled = acc.to(torch.float64).mul_(real).round_()
    else:
        allowed = " or ".join(map(repr, REQUANT_ROUNDINGS))
        raise ValueError(f"asic: rounding must be {allowed}, got {rounding!r}")
    return scaled.add_(out_zp).clamp_(qmin, qmax).to(torch.int8)


def linear_requant(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    *,
    a_zp: int,
    bias_i32: torch.Tensor | None,
    multiplier: torch.Tensor,
    shift: torch.Tensor,
    out_zp: int,
    qmin: int,
    qmax: int,
    acc_overflow: AccOverflow = "wrap",
    rounding: RequantRounding = "tflite",
) -> torch.Tensor:
    """The int8-out pipeline: :func:`linear_i32` then :func:`requantize`. [M,N] int8, contiguous."""
    check_gemm_operands(a_q, w_q, bias_i32)
    check_requant_params(multiplier, shift, w_q.shape[0])
    check_int8_qparams(a_zp, out_zp, qmin, qmax)
    acc = linear_i32(a_q, w_q, a_zp, bias_i32, acc_overflow)
    return requantize(acc, multiplier, shift, out_zp, qmin, qmax, rounding)


# -- host-side helpers of the contract --------------------------------------------------------


def quantize_bias(bias: torch.Tensor, acc_scale: float | torch.Tensor) -> torch.Tensor:
    """``bias_i32 = round_half_even(bias / acc_scale)`` in float64, saturated to int32.

    ``acc_scale`` is the accumulator's scale ``s_a · s_w[n]``: a float, or a [N] (or [1]) tensor.
    """
    denom = torch.as_tensor(acc_scale, dtype=torch.float64).reshape(-1)
    q = torch.round(bias.to(torch.float64) / denom)
    return q.clamp_(INT32_MIN, INT32_MAX).to(torch.int32)


#: From this many accumulator entries on, :func:`scale_acc` casts before it multiplies.
CAST_FIRST_MIN_NUMEL = 1 << 16

#: A host pass over a large tensor (quantize, rescale) goes a chunk of its rows of about this many
#: bytes of float32 at a time, so each chunk's steps after its first read what the last left in
#: the caches instead of the whole tensor from memory (:func:`row_spans`); the convolutions'
#: chunks of samples take the same size (:func:`asic_backend.sim.conv.samples_per_chunk`).
CHUNK_BYTES = 2 << 20
#: ... from this many bytes on: past the last level of cache, where each extra pass is one from
#: memory. The rescale of 512×8192 (16 MB), 5.7 to 2.9 ms; its quantization, 4.1 to 2.6; at
#: 8 MB, 5 to 15% less; at 4 MB, up to 5% more (one thread, AVX-512 host, 32 MB L3).
CHUNKED_MIN_BYTES = 8 << 20


def spans(total: int, step: int) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` ranges of ``range(total)`` in steps of ``step``: ``[(0, total)]`` when one
    step holds it all.

    >>> spans(5, 2)
    [(0, 2), (2, 4), (4, 5)]
    """
    if step >= total:
        return [(0, total)]
    return [(lo, min(lo + step, total)) for lo in range(0, total, step)]


def row_spans(rows: int, row_values: int, chunk_bytes: int | None = None) -> list[tuple[int, int]]:
    """The chunks of rows a host pass over ``rows`` rows of ``row_values`` values each goes by:
    one for the whole tensor below :data:`CHUNKED_MIN_BYTES` of float32 (and while tracing:
    a compiler fuses the passes), else chunks of about ``chunk_bytes`` (:data:`CHUNK_BYTES`)."""
    # Sizes first: a decode step's small tensors never ask (each call is a cache miss or more
    # there), and symbolic sizes while tracing are no plain ints.
    small = (
        type(rows) is int and type(row_values) is int and 4 * rows * row_values < CHUNKED_MIN_BYTES
    )
    if small or torch.compiler.is_compiling():
        return [(0, rows)]
    per_chunk = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    return spans(rows, max(1, per_chunk // (4 * row_values)))


def row_slice(t: float | torch.Tensor, lo: int, hi: int, ndim: int) -> float | torch.Tensor:
    """Rows ``[lo, hi)`` of ``t`` as an operand broadcast over a tensor of ``ndim`` dims: its own
    rows where it has them, ``t`` itself where it broadcasts along the first dim (a float, fewer
    dims, or a first dim of one)."""
    if isinstance(t, torch.Tensor) and t.dim() == ndim and t.shape[0] != 1:
        return t[lo:hi]
    return t


def scale_acc(
    acc: torch.Tensor,
    a_scale: float | torch.Tensor,
    b_scale: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    consume: bool = False,
) -> torch.Tensor:
    """``(acc·a_scale)·b_scale (+ bias)`` in float32, rounded after each step: the scaling of
    every int32-out GEMM, each operand already shaped to broadcast over ``acc`` (a row's, a
    column's). ``acc`` is int32, or float32 holding the same values (scaled in place).
    ``consume``: ``acc`` is the caller's to give up, and a large contiguous int32 one is converted
    in its own memory (a new tensor as large is a pass over fresh pages). A 2-D ``acc``, or a
    batch ``[B, M, N]`` with scales ``[B, M, 1]`` and ``[B, 1, N]``, with float32 scales takes
    the fused native pass (:mod:`asic_backend.sim.host_passes`) where it applies: the same
    values, in the same memory.

    >>> acc = torch.tensor([[3, -7], [100, 0]], dtype=torch.int32)
    >>> scale_acc(acc, torch.tensor([[0.5], [0.25]]), torch.tensor([[0.1, 0.3]]))
    tensor([[ 0.1500, -1.0500],
            [ 2.5000,  0.0000]])
    """
    if acc.dim() in (2, 3) and isinstance(a_scale, torch.Tensor):
        # In acc's memory exactly where the aten kernels below would put it too.
        large = acc.numel() >= CAST_FIRST_MIN_NUMEL
        in_place = consume or (large and acc.dtype == torch.float32)
        fused = host_passes.scale_rows(acc, a_scale, b_scale, bias, in_place=in_place)
        if fused is not None:
            return fused
    b_scale = b_scale if b_scale.dtype == torch.float32 else b_scale.to(torch.float32)
    # The values of acc * a_scale (int32 x float32 computes in float32), the rest in place: each
    # temporary as large as acc costs a pass. On a large accumulator the cast first and in-place
    # multiplies take a third less time than the mixed-dtype multiply, whose fresh output is at
    # times 5x slower again (18 against 2 ms at 16×512×512, attention's scores, measured); on a
    # small one the extra kernel costs more than it saves (a traced graph takes the small form:
    # its compiler fuses all of it).
    if acc.numel() < CAST_FIRST_MIN_NUMEL or torch.compiler.is_compiling():
        y = acc * a_scale
    else:
        chunks = row_spans(acc.shape[0], acc.numel() // acc.shape[0])
        if len(chunks) > 1:
            return _scale_acc_by_chunks(acc, a_scale, b_scale, bias, consume, chunks)
        if consume and acc.dtype == torch.int32 and acc.is_contiguous():
            # Each element is read before it is written over: same size, same place.
            y = acc.view(torch.float32).copy_(acc)
        else:
            y = acc.to(torch.float32)
        y.mul_(a_scale)
    y.mul_(b_scale)
    return y if bias is None else y.add_(bias)


def _scale_acc_by_chunks(
    acc: torch.Tensor,
    a_scale: float | torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None,
    consume: bool,
    chunks: list[tuple[int, int]],
) -> torch.Tensor:
    """:func:`scale_acc` of a large accumulator, each chunk of rows through every step before
    the next, each operand's own rows with it."""
    if acc.dtype == torch.float32:
        y = acc
    elif consume and acc.dtype == torch.int32 and acc.is_contiguous():
        y = acc.view(torch.float32)
    else:
        y = torch.empty_like(acc, dtype=torch.float32)
    ndim = acc.dim()
    for lo, hi in chunks:
        part = y[lo:hi]
        if y is not acc:
            part.copy_(acc[lo:hi])
        part.mul_(row_slice(a_scale, lo, hi, ndim)).mul_(row_slice(b_scale, lo, hi, ndim))
        if bias is not None:
            part.add_(row_slice(bias, lo, hi, ndim))
    return y


def dequantize_acc(
    acc: torch.Tensor,
    a_scale: float | torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The int32-out mode's host scaling: ``(acc·s_a[m])·s_w[n] + bias`` in float32.

    The order of operations is TorchAO's, so per-token dynamic layers match it to float32 rounding.
    ``a_scale`` is a float or a float32 [M,1] tensor; ``w_scale`` is [N], [N,1] or [1].

    >>> acc = torch.tensor([[3, -7], [100, 0]], dtype=torch.int32)
    >>> dequantize_acc(acc, torch.tensor([[0.5], [0.25]]), torch.tensor([0.1, 0.3]))
    tensor([[ 0.1500, -1.0500],
            [ 2.5000,  0.0000]])
    """
    # A [N] scale broadcasts over [M, N] as it is: a reshape would be one more dispatch a call.
    w_row = w_scale if w_scale.dim() == 1 else w_scale.reshape(1, -1)
    return scale_acc(acc, a_scale, w_row, bias=bias)
