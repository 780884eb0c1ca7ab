"""Which aten ops do multiply-accumulate work, and how many MACs each call does.

This is the backend's definition of "matmul-class op": every op listed in :data:`MAC_OPS` either
runs on the DUT or is counted as a host fallback with :func:`macs` of its operands' shapes. The
formulas are ``torch.utils.flop_counter``'s divided by two (a FLOP there is a multiply or an add),
so that for any model

    DUT MACs + host MACs == FlopCounterMode flops / 2 of one eager call

(with SDPA on its math path, which FlopCounterMode can see into). FlopCounterMode has no formula
for a few ops this table does count (``mv``, ``dot``, ``addmv``, ``addbmm``, ``_int_mm``, the CPU
flash attention kernel and PyTorch's fused transformer fast paths); :func:`flop_counter_extras`
gives them to it:

>>> from torch.utils.flop_counter import FlopCounterMode
>>> with FlopCounterMode(display=False, custom_mapping=flop_counter_extras()) as counter:
...     model(x)
>>> counter.get_total_flops() // 2       # what the backend accounts for, DUT + host
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, get_args

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import flop_registry

__all__ = [
    "FORMULAS",
    "MAC_OPS",
    "Formula",
    "MacOp",
    "conv_params",
    "flop_counter_extras",
    "mac_op",
    "macs",
    "shape_text",
]

Formula = Literal[
    "mm", "linear", "conv", "conv_backward", "sdpa", "sdpa_backward", "encoder_layer", "native_mha"
]
FORMULAS: tuple[str, ...] = get_args(Formula)
Shape = Sequence[int]

_aten = torch.ops.aten
# A typed handle on an untyped torch helper (mypy --strict).
_broadcast_shapes: Callable[..., torch.Size] = torch.broadcast_shapes


def _prod(values: Sequence[int]) -> int:
    return math.prod(int(v) for v in values)


def _mm(a: Shape, b: Shape) -> int:
    # A 1-D operand is a row (left) or a column (right), as matmul treats it; batch dims broadcast.
    a = (1, a[0]) if len(a) == 1 else a
    b = (b[0], 1) if len(b) == 1 else b
    batch = _broadcast_shapes(torch.Size(a[:-2]), torch.Size(b[:-2]))
    return _prod(batch) * int(a[-2]) * int(a[-1]) * int(b[-1])


def _conv(x: Shape, w: Shape, params: Sequence[int]) -> int:
    # params: transposed, then stride, padding, dilation per spatial dim (conv_params()).
    spatial = len(w) - 2
    transposed, stride = params[0], params[1 : 1 + spatial]
    padding, dilation = params[1 + spatial : 1 + 2 * spatial], params[1 + 2 * spatial :]
    batch, size = (x[0], x[2:]) if len(x) == spatial + 2 else (1, x[1:])
    if transposed:  # w [C_in, C_out/groups, *k]: every input point meets the whole kernel
        return int(batch) * _prod(size) * _prod(w)
    out = [
        (int(size[i]) + 2 * padding[i] - dilation[i] * (int(w[2 + i]) - 1) - 1) // stride[i] + 1
        for i in range(spatial)
    ]
    return int(batch) * _prod(out) * _prod(w)  # w [C_out, C_in/groups, *k]


def _conv_backward(grad_out: Shape, x: Shape, w: Shape, params: Sequence[int]) -> int:
    # FlopCounterMode's own formula (one source of truth for the backward's convolutions):
    # grad_input as a transposed conv of grad_out, grad_weight as a conv of the input.

    transposed, mask_input, mask_weight = params
    flops = flop_registry[_aten.convolution_backward](
        grad_out,
        x,
        w,
        None,
        None,
        None,
        None,
        bool(transposed),
        None,
        None,
        [bool(mask_input), bool(mask_weight), False],
        out_val=(x, w, None),
    )
    return int(flops) // 2


def _sdpa_backward(grad_out: Shape, q: Shape, k: Shape, v: Shape) -> int:

    # FlopCounterMode's formula: QKᵀ recomputed, then the gradients of both products.
    count: Callable[..., int] = flop_counter.sdpa_backward_flop_count
    return int(count(grad_out, q, k, v)) // 2


def _sdpa(q: Shape, k: Shape, v: Shape) -> int:
    # QKᵀ and PV over every query head (grouped key/value heads are shared, not fewer MACs).
    return _prod(q[:-2]) * int(q[-2]) * int(k[-2]) * (int(q[-1]) + int(v[-1]))


def _encoder_layer(src: Shape, qkv_w: Shape, ffn_w1: Shape) -> int:
    tokens, length, e, f = _prod(src[:-1]), int(src[-2]), int(src[-1]), int(ffn_w1[0])
    # in-projection (3E), attention (QKᵀ and PV over the sequence), out-projection, FFN.
    return (
        tokens * e * int(qkv_w[0]) + 2 * tokens * length * e + tokens * e * e + 2 * tokens * e * f
    )


def _native_mha(q: Shape, k: Shape) -> int:
    e = int(q[-1])
    q_tokens, k_tokens, k_len = _prod(q[:-1]), _prod(k[:-1]), int(k[-2])
    return q_tokens * e * e + 2 * k_tokens * e * e + 2 * q_tokens * k_len * e + q_tokens * e * e


def macs(formula: Formula, shapes: Sequence[Shape], params: Sequence[int] = ()) -> int:
    """The MACs of one call, from its operands' shapes (and ``params`` for a convolution).

    >>> macs("mm", [(8, 64), (64, 32)])
    16384
    >>> macs("conv", [(1, 3, 8, 8), (4, 3, 3, 3)], conv_params(False, [1, 1], [1, 1], [1, 1]))
    6912
    """
    if formula == "mm":
        return _mm(shapes[0], shapes[1])
    if formula == "linear":  # x [..., K], w [N, K]
        return _prod(shapes[0]) * int(shapes[1][0])
    if formula == "conv":
        return _conv(shapes[0], shapes[1], params)
    if formula == "conv_backward":
        return _conv_backward(shapes[0], shapes[1], shapes[2], params)
    if formula == "sdpa":
        return _sdpa(shapes[0], shapes[1], shapes[2])
    if formula == "sdpa_backward":
        return _sdpa_backward(shapes[0], shapes[1], shapes[2], shapes[3])
    if formula == "encoder_layer":
        return _encoder_layer(shapes[0], shapes[1], shapes[2])
    if formula == "native_mha":
        return _native_mha(shapes[0], shapes[1])
    raise ValueError(f"asic: unknown MAC formula {formula!r}")


def conv_params(
    transposed: bool, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]
) -> list[int]:
    """The ``params`` of :func:`macs` for a convolution (per-dim stride, padding, dilation)."""
    return [int(transposed), *map(int, stride), *map(int, padding), *map(int, dilation)]


def shape_text(formula: Formula, shapes: Sequence[Shape]) -> str:
    """The operands' shapes as a user reads them: ``[8, 64] x [64, 32]``, ``x[..] w[..]``."""
    dims = [f"[{', '.join(str(int(d)) for d in s)}]" for s in shapes]
    if formula == "conv":
        return f"x{dims[0]} w{dims[1]}"
    if formula == "sdpa":
        return f"q{dims[0]} k{dims[1]} v{dims[2]}"
    return " x ".join(dims)


@dataclasses.dataclass(frozen=True)
class MacOp:
    """How to read the MACs of one aten op: its formula, the argument positions of the tensors
    the formula reads, and, for convolutions, the static arguments it needs."""

    formula: Formula
    operands: tuple[int, ...]

    def params(self, args: Sequence[Any]) -> list[int]:
        """The formula's static parameters, from the op's arguments (aten.convolution's, or
        aten.convolution_backward's ``transposed`` and ``output_mask``)."""
        if self.formula == "conv_backward":
            transposed, output_mask = args[7], args[10]
            return [int(bool(transposed)), int(bool(output_mask[0])), int(bool(output_mask[1]))]
        if self.formula != "conv":
            return []
        stride, padding, dilation, transposed = args[3], args[4], args[5], args[6]
        spatial = len(stride)  # aten.convolution: one stride per spatial dim
        return conv_params(
            bool(transposed),
            _per_dim(stride, spatial),
            _per_dim(padding, spatial),
            _per_dim(dilation, spatial),
        )

    def count(self, args: Sequence[Any]) -> int:
        """The MACs of a call with ``args`` (tensors, or their shapes as FlopCounterMode passes)."""
        return macs(self.formula, [_shape(args[i]) for i in self.operands], self.params(args))


def _shape(value: Any) -> Shape:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else tuple(value)


def _per_dim(value: Any, spatial: int) -> list[int]:
    values = list(value) if isinstance(value, Sequence) else [value]
    return [int(v) for v in (values * spatial if len(values) == 1 else values)]


_MM = MacOp("mm", (0, 1))
_ADD_MM = MacOp("mm", (1, 2))  # addmm, baddbmm, addbmm, addmv: (input, mat1, mat2, ...)
_CONV = MacOp("conv", (0, 1))
_SDPA = MacOp("sdpa", (0, 1, 2))
_SDPA_BACKWARD = MacOp("sdpa_backward", (0, 1, 2, 3))  # (grad_out, query, key, value, ...)

#: Every aten op that does multiply-accumulate work, by overload packet. Composite ops (matmul,
#: linear, einsum, conv2d, ...) are listed too, for graphs that keep them; AOTAutograd
#: usually decomposes them into the ops below them.
MAC_OPS: Mapping[Any, MacOp] = {
    _aten.mm: _MM,
    _aten.bmm: _MM,
    _aten.matmul: _MM,
    _aten.mv: _MM,
    _aten.dot: _MM,
    _aten.vdot: _MM,
    _aten._int_mm: _MM,
    _aten._scaled_mm: _MM,
    _aten.addmm: _ADD_MM,
    _aten.baddbmm: _ADD_MM,
    _aten.addbmm: _ADD_MM,
    _aten.addmv: _ADD_MM,
    _aten.addmm_: _ADD_MM,  # in place: functionalized before the host compiler sees them
    _aten.baddbmm_: _ADD_MM,
    _aten.addbmm_: _ADD_MM,
    _aten.addmv_: _ADD_MM,
    _aten.linear: MacOp("linear", (0, 1)),
    _aten.convolution: _CONV,
    _aten._convolution: _CONV,
    _aten.scaled_dot_product_attention: _SDPA,
    _aten._scaled_dot_product_attention_math: _SDPA,
    _aten._scaled_dot_product_flash_attention: _SDPA,
    _aten._scaled_dot_product_flash_attention_for_cpu: _SDPA,
    _aten._scaled_dot_product_efficient_attention: _SDPA,
    _aten._scaled_dot_product_cudnn_attention: _SDPA,
    _aten.convolution_backward: MacOp("conv_backward", (0, 1, 2)),
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _SDPA_BACKWARD,
    _aten._scaled_dot_product_flash_attention_backward: _SDPA_BACKWARD,
    _aten._scaled_dot_product_efficient_attention_backward: _SDPA_BACKWARD,
    _aten._scaled_dot_product_cudnn_attention_backward: _SDPA_BACKWARD,
    _aten._transformer_encoder_layer_fwd: MacOp("encoder_layer", (0, 3, 14)),
    _aten._native_multi_head_attention: MacOp("native_mha", (0, 1)),
}


def mac_op(target: Any) -> MacOp | None:
    """The :class:`MacOp` of an aten op (an ``OpOverload`` or its packet), or None."""
    packet = getattr(target, "overloadpacket", target)
    try:
        return MAC_OPS.get(packet)
    except TypeError:  # an unhashable call target
        return None


def flop_counter_extras() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode ``custom_mapping`` entries for the MAC ops it has no formula for.

    Its ``shape_wrapper`` hands each formula the op's arguments with tensors replaced by their
    shapes; a formula returns FLOPs (2 per MAC).
    """

    def formula(op: MacOp) -> Callable[..., int]:
        def flops(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
            return 2 * op.count(args)

        return flops

    return {packet: formula(op) for packet, op in MAC_OPS.items() if packet not in flop_registry}
