"""The integer golden model of the simulator's numerics: plain Python ints and lists, no torch.

It is written from the reference definitions (TFLite ``QuantizeMultiplier``, gemmlowp
``SaturatingRoundingDoublingHighMul`` and ``RoundingDivideByPOT``), literally and slowly, so that it
shares no shortcut with the vectorized implementation in ``asic_backend.sim.numerics``. "Bit-exact"
means equal to this. Convolutions are sums over each window (forward) or scatters of each input
point (transposed), on nested lists, with no im2col and no float arithmetic.

The host's float32 steps around a dynamic GEMM (symmetric per-row quantization, the rescale)
are here too, one Python float operation at a time, each rounded to float32 through ``struct``:
Python's double holds a product of two float32 values exactly, and a double-rounded float32
sum, product or quotient equals the directly rounded one (53 ≥ 2·24 + 2 bits).
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable
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


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (ties to even)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def quantize_sym_row(row: list[float], eps: float) -> tuple[list[int], float]:
    """TorchAO's symmetric int8 of one float32 row: ``scale = max(max|x| / 127.5, eps)``,
    ``q = clamp(round_half_even(x · f32(1 / scale)), -128, 127)``; ``(q, scale)``."""
    scale = max(f32(max(abs(v) for v in row) / 127.5), f32(eps))
    recip = f32(1.0 / scale)
    return [min(max(round(f32(v * recip)), -128), 127) for v in row], scale


def scale_row(acc: list[int], a: float, b: list[float], bias: list[float] | None) -> list[float]:
    """One row of the int32-out rescale: ``((f32(acc)·a)·b[n]) + bias[n]``, each step
    rounded to float32."""
    out = [f32(f32(f32(v) * a) * s) for v, s in zip(acc, b, strict=True)]
    return out if bias is None else [f32(v + c) for v, c in zip(out, bias, strict=True)]


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


# -- convolutions -----------------------------------------------------------------------------

Nested = list  # a nested list of ints, [N][C][*size]
Pairs = list[tuple[int, int]]


def shape_of(nested: Nested, dims: int) -> tuple[int, ...]:
    """The sizes of the first ``dims`` levels of a (non-empty) nested list."""
    sizes = []
    for _ in range(dims):
        sizes.append(len(nested))
        nested = nested[0]
    return tuple(sizes)


def at(nested: Nested, index: tuple[int, ...]) -> int:
    for i in index:
        nested = nested[i]
    return nested  # type: ignore[return-value]


def nest(shape: tuple[int, ...], values: dict[tuple[int, ...], int]) -> Nested:
    """A nested list of ``shape`` whose element at ``index`` is ``values[index]``."""

    def build(prefix: tuple[int, ...]) -> Nested | int:
        if len(prefix) == len(shape):
            return values[prefix]
        return [build((*prefix, i)) for i in range(shape[len(prefix)])]

    return build(())  # type: ignore[return-value]


def positions(sizes: tuple[int, ...] | list[int]) -> itertools.product[tuple[int, ...]]:
    return itertools.product(*(range(s) for s in sizes))


def conv_i32(
    x: Nested,
    w: Nested,
    stride: list[int],
    padding: Pairs,
    dilation: list[int],
    groups: int,
    a_zp: int | list[int] = 0,
    bias: list[int] | None = None,
    acc_overflow: str = "wrap",
    transposed: bool = False,
    output_padding: list[int] | None = None,
) -> Nested:
    """The int32 accumulator of a 1-3-D convolution: :func:`conv_exact`, narrowed to int32 once."""
    exact = conv_exact(
        x, w, stride, padding, dilation, groups, a_zp, bias, transposed, output_padding
    )
    return map_nested(lambda v: narrow(v, acc_overflow), exact)


def conv_exact(
    x: Nested,
    w: Nested,
    stride: list[int],
    padding: Pairs,
    dilation: list[int],
    groups: int,
    a_zp: int | list[int] = 0,
    bias: list[int] | None = None,
    transposed: bool = False,
    output_padding: list[int] | None = None,
) -> Nested:
    """The exact (unbounded) accumulator of a 1-3-D convolution of int8 ``x [N][C_in][*size]``.

    Forward: ``w [C_out][C_in/groups][*k]``, ``out[n][co][o] = Σ (x[n][ci][o·s − lo + k·d] −
    zp[n])·w[co][ci'][k]`` over the positions inside ``x`` (padding adds nothing). Transposed:
    ``w [C_in][C_out/groups][*k]``, each input point scatters ``(x − zp)·w`` into
    ``out[n][co][i·s − lo + k·d]``, ``output_padding`` extending the output at the end. Then
    ``+ bias[co]``. ``padding`` is one ``(lo, hi)`` per dim; ``a_zp`` one int or one per sample.
    """
    zps = a_zp if isinstance(a_zp, list) else [a_zp] * len(x)
    if transposed:
        shape, values = _conv_transpose_exact(
            x, w, stride, padding, dilation, groups, zps, output_padding
        )
    else:
        shape, values = _conv_exact(x, w, stride, padding, dilation, groups, zps)
    if bias is not None:
        for index in values:
            values[index] += bias[index[1]]
    return nest(shape, values)


def map_nested(f: Callable[[int], int], nested: Nested | int) -> Nested:
    """``f`` applied to every int of a nested list."""
    if isinstance(nested, list):
        return [map_nested(f, item) for item in nested]
    return f(nested)  # type: ignore[return-value]


def _conv_exact(
    x: Nested,
    w: Nested,
    stride: list[int],
    padding: Pairs,
    dilation: list[int],
    groups: int,
    zps: list[int],
) -> tuple[tuple[int, ...], dict[tuple[int, ...], int]]:
    spatial = len(stride)
    n, c_in, *in_size = shape_of(x, 2 + spatial)
    c_out, c_in_g, *kernel = shape_of(w, 2 + spatial)
    assert c_in_g * groups == c_in
    assert c_out % groups == 0
    c_out_g = c_out // groups
    out_size = [
        (in_size[i] + padding[i][0] + padding[i][1] - dilation[i] * (kernel[i] - 1) - 1)
        // stride[i]
        + 1
        for i in range(spatial)
    ]
    values: dict[tuple[int, ...], int] = {}
    for b, co, o in itertools.product(range(n), range(c_out), positions(out_size)):
        group = co // c_out_g
        total = 0
        for ci, k in itertools.product(range(c_in_g), positions(kernel)):
            p = tuple(o[i] * stride[i] - padding[i][0] + k[i] * dilation[i] for i in range(spatial))
            if all(0 <= p[i] < in_size[i] for i in range(spatial)):
                xv = at(x, (b, group * c_in_g + ci, *p))
                total += (xv - zps[b]) * at(w, (co, ci, *k))
        values[(b, co, *o)] = total
    return (n, c_out, *out_size), values


def _conv_transpose_exact(
    x: Nested,
    w: Nested,
    stride: list[int],
    padding: Pairs,
    dilation: list[int],
    groups: int,
    zps: list[int],
    output_padding: list[int] | None,
) -> tuple[tuple[int, ...], dict[tuple[int, ...], int]]:
    spatial = len(stride)
    n, c_in, *in_size = shape_of(x, 2 + spatial)
    c_in_w, c_out_g, *kernel = shape_of(w, 2 + spatial)
    assert c_in_w == c_in
    assert c_in % groups == 0
    c_in_g = c_in // groups
    extra = output_padding or [0] * spatial
    # The full scatter spans (size − 1)·s + (k − 1)·d + 1 points, less the padding at each end.
    out_size = [
        (in_size[i] - 1) * stride[i]
        + (kernel[i] - 1) * dilation[i]
        + 1
        - padding[i][0]
        - padding[i][1]
        + extra[i]
        for i in range(spatial)
    ]
    c_out = c_out_g * groups
    values = {
        (b, co, *o): 0
        for b, co, o in itertools.product(range(n), range(c_out), positions(out_size))
    }
    for b, ci, i in itertools.product(range(n), range(c_in), positions(in_size)):
        xv = at(x, (b, ci, *i)) - zps[b]
        group = ci // c_in_g
        for co_g, k in itertools.product(range(c_out_g), positions(kernel)):
            p = tuple(i[d] * stride[d] - padding[d][0] + k[d] * dilation[d] for d in range(spatial))
            if all(0 <= p[d] < out_size[d] for d in range(spatial)):
                values[(b, group * c_out_g + co_g, *p)] += xv * at(w, (ci, co_g, *k))
    return (n, c_out, *out_size), values
