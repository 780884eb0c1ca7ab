"""The integer golden model of the simulator's numerics: plain Python ints and lists, no torch.

It is written from the reference definitions (TFLite ``QuantizeMultiplier``, gemmlowp
``SaturatingRoundingDoublingHighMul`` and ``RoundingDivideByPOT``), literally and slowly, so that it
shares no shortcut with the vectorized implementation in ``asic_backend.numerics``. "Bit-exact"
means equal to this.
"""

from __future__ import annotations

import math
from fractions import Fraction

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
Matrix = list[list[int]]


def wrap32(x: int) -> int:
    """Two's complement int32 of ``x``."""
    return (x + 2**31) % 2**32 - 2**31


def sat32(x: int) -> int:
    return min(max(x, INT32_MIN), INT32_MAX)


def narrow(x: int, acc_overflow: str) -> int:
    return wrap32(x) if acc_overflow == "wrap" else sat32(x)


def linear_i32(
    a: Matrix,
    w: Matrix,
    a_zp: int | list[int] = 0,
    bias: list[int] | None = None,
    acc_overflow: str = "wrap",
) -> Matrix:
    """``Σ_k (a[m][k] − zp[m])·w[n][k] + bias[n]``, exact, then narrowed to int32.

    ``a_zp`` is one int, or one int per row. Under ``"wrap"`` the narrowing of the exact sum equals
    any order of int32 wrapping adds; under ``"saturate"`` it is one clamp on readout.
    """
    zps = a_zp if isinstance(a_zp, list) else [a_zp] * len(a)
    out = []
    for row, zp in zip(a, zps, strict=True):
        out_row = []
        for n, w_row in enumerate(w):
            total = sum((x - zp) * y for x, y in zip(row, w_row, strict=True))
            if bias is not None:
                total += bias[n]
            out_row.append(narrow(total, acc_overflow))
        out.append(out_row)
    return out


def gemm_i32(a: Matrix, w: Matrix, acc_overflow: str = "wrap") -> Matrix:
    return linear_i32(a, w, 0, None, acc_overflow)


def _round_half_away(x: Fraction) -> int:
    magnitude = math.floor(abs(x) + Fraction(1, 2))
    return magnitude if x >= 0 else -magnitude


def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite ``QuantizeMultiplier`` (plus its single-rounding clamp of shifts above 30)."""
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    q_fixed = _round_half_away(Fraction(q) * 2**31)
    if q_fixed == 2**31:
        q_fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    if shift > 30:
        return 2**31 - 1, 30
    return q_fixed, shift


def _trunc_div(x: int, d: int) -> int:
    """C's ``/`` (rounds toward zero); Python's ``//`` floors."""
    q = abs(x) // d
    return q if x >= 0 else -q


def srdhm(a: int, b: int) -> int:
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` of two int32s."""
    if a == b == INT32_MIN:
        return INT32_MAX
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else (1 - (1 << 30))
    return _trunc_div(ab + nudge, 1 << 31)


def rdbpot(x: int, exponent: int) -> int:
    """gemmlowp ``RoundingDivideByPOT``: x / 2^exponent rounded half away from zero."""
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def multiply_by_quantized_multiplier(x: int, multiplier: int, shift: int) -> int:
    """TFLite ``MultiplyByQuantizedMultiplier`` with gemmlowp's saturating left shift."""
    left = max(shift, 0)
    right = max(-shift, 0)
    return rdbpot(srdhm(sat32(x * (1 << left)), multiplier), right)


def requantize(
    acc: Matrix,
    multipliers: list[int],
    shifts: list[int],
    out_zp: int,
    qmin: int,
    qmax: int,
    rounding: str = "tflite",
) -> Matrix:
    """int32 accumulator -> int8 per output channel n (lists of length 1 mean per tensor)."""
    out = []
    for row in acc:
        out_row = []
        for n, x in enumerate(row):
            mult = multipliers[n if len(multipliers) > 1 else 0]
            shift = shifts[n if len(shifts) > 1 else 0]
            if rounding == "tflite":
                y = multiply_by_quantized_multiplier(x, mult, shift)
            else:
                # float64 multiply by the exactly representable M·2^(shift−31), then half-to-even
                # (Python's round() on a float).
                y = round(float(x) * (mult * 2.0 ** (shift - 31)))
            out_row.append(min(max(y + out_zp, qmin), qmax))
        out.append(out_row)
    return out


def linear_requant(
    a: Matrix,
    w: Matrix,
    a_zp: int,
    bias: list[int] | None,
    multipliers: list[int],
    shifts: list[int],
    out_zp: int,
    qmin: int,
    qmax: int,
    acc_overflow: str = "wrap",
    rounding: str = "tflite",
) -> Matrix:
    acc = linear_i32(a, w, a_zp, bias, acc_overflow)
    return requantize(acc, multipliers, shifts, out_zp, qmin, qmax, rounding)
