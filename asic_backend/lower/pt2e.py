"""PT2E converted layers → ``asic::qlinear`` / ``asic::qconv``.

On the Dynamo graph a PT2E layer is still ``dequantize_per_tensor(x_q) → linear(·,
dequantize_per_channel(W_q), b)`` (or ``conv2d``), optionally followed by ``relu`` and
``quantize_per_tensor`` (the shape inductor's x86 pass, ``torch/_inductor/fx_passes/
quantization.py``, matches later). The whole chain becomes one ``asic::qlinear`` or
``asic::qconv`` on the integer tensors: int8-out with the requantization on the DUT when the
output is quantized, else int32-out scaled on the host. Static qparams (Python numbers) and
dynamic ones (``choose_qparams`` outputs) both work.

>>> if is_pt2e_pair(x, w):        # x, w: the linear's input and weight nodes
...     lower_pt2e(rw, linear_node, x, w, bias)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from asic_backend.lower.fx_nodes import dtype_of, get_arg, ndim_of, real_tensor
from asic_backend.lower.rewrite import Rewrite
from asic_backend.sim import numerics

if TYPE_CHECKING:
    from asic_backend.lower.conv import ConvCall


#: Why a convolution whose layout is computed at run time stays on the host (a
#: PT2E one or a float one: :mod:`asic_backend.lower.conv` says it too).
STATIC_ONLY = (
    "stride, padding, dilation or groups computed at run time: the DUT path needs them as "
    "Python ints"
)
__all__ = ["is_pt2e_pair", "lower_pt2e", "lower_pt2e_conv"]

_aten = torch.ops.aten


def _qd_name(node: Any) -> str | None:
    """``op.overload`` of a ``quantized_decomposed::`` call, else None."""
    if isinstance(node, fx.Node) and node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and target.namespace == "quantized_decomposed":
            return f"{target._opname}.{target._overloadname}"
    return None


def _dequantize_name(node: fx.Node) -> str | None:
    name = _qd_name(node)
    return name if name is not None and name.startswith("dequantize_per_") else None


def is_pt2e_pair(x: fx.Node, w: fx.Node) -> bool:
    """Whether a linear's (or conv's) input and weight both come straight from PT2E
    dequantize ops."""
    return _dequantize_name(x) is not None and _dequantize_name(w) is not None


def lower_pt2e(rw: Rewrite, node: fx.Node, x: fx.Node, w: fx.Node, b: Any) -> None:
    """Replace the PT2E linear ``node`` (and a ``relu``/``quantize`` that only it feeds)."""
    reason = _unsupported(rw, x, w, weight_dims=(2,))
    if reason is not None:
        rw.host(node, reason)
        return
    _emit(rw, node, x, w, torch.ops.asic.qlinear.default, (b,), "PT2E linear")


def lower_pt2e_conv(rw: Rewrite, node: fx.Node, call: ConvCall) -> None:
    """Replace the PT2E convolution ``node`` (and a ``relu``/``quantize`` only it feeds)."""

    x, w = call.x, call.w
    reason = _unsupported(rw, x, w, weight_dims=(3, 4, 5), channel_axis=int(call.transposed))
    layout = call.static()
    if reason is not None or layout is None:
        rw.host(node, reason or STATIC_ONLY)
        return
    extra = (call.bias, *layout)
    _emit(rw, node, x, w, torch.ops.asic.qconv.default, extra, "PT2E conv")


def _emit(
    rw: Rewrite,
    node: fx.Node,
    x: fx.Node,
    w: fx.Node,
    op: Any,
    layer_args: tuple[Any, ...],
    what: str,
) -> None:
    """Put ``op(x_q, qparams..., *layer_args, output qparams..., device)`` in place of the chain."""
    g = rw.graph
    out_dtype = dtype_of(node) or torch.float32
    y_scale, y_zp, y_qmin, y_qmax = 0.0, 0, 0, 0
    relu, quant = None, None
    fused = _output_quant(node)
    if fused is not None:
        relu, quant = fused
        q_args: tuple[Any, ...] = quant.args
        y_scale, y_zp, y_qmin, y_qmax = float(q_args[1]), *(int(v) for v in q_args[2:5])
        out_dtype = q_args[5]
        if relu is not None:
            y_qmin = max(y_qmin, y_zp)  # relu, then quantize == clamp at the zero point
    with g.inserting_before(node):
        qparams = [
            _as_tensor_node(g, value, dtype)
            for value, dtype in (
                (x.args[1], torch.float64),
                (x.args[2], torch.int64),
                (w.args[1], torch.float32),
                (w.args[2], torch.int64),
            )
        ]
        x_scale, x_zp, w_scale, w_zp = qparams
        new = g.call_function(
            op,
            (
                x.args[0],
                x_scale,
                x_zp,
                w.args[0],
                w_scale,
                w_zp,
                *layer_args,
                y_scale,
                y_zp,
                y_qmin,
                y_qmax,
                out_dtype,
                rw.options.device,
            ),
        )
    if quant is not None:
        new.meta.update(quant.meta)
        quant.replace_all_uses_with(new)
        rw.erase(quant)
        if relu is not None:
            rw.erase(relu)
        what += " + relu + quantize" if relu is not None else " + quantize"
    rw.replace(node, new, f"{what} -> {op._schema.name}")
    for dq in (x, w):
        if not dq.users:
            rw.erase(dq)


def _as_tensor_node(g: fx.Graph, value: Any, dtype: torch.dtype) -> fx.Node:
    """A qparam as a graph tensor: static ones are Python numbers in PT2E graphs."""
    if isinstance(value, fx.Node):
        return value
    return g.call_function(_aten.scalar_tensor.default, (value,), {"dtype": dtype})


def _unsupported(
    rw: Rewrite, x: fx.Node, w: fx.Node, weight_dims: tuple[int, ...], channel_axis: int = 0
) -> str | None:
    """Why the DUT cannot take this PT2E layer (None: it can)."""
    xdq, wdq = _dequantize_name(x), _dequantize_name(w)
    if xdq not in ("dequantize_per_tensor.default", "dequantize_per_tensor.tensor"):
        return f"activations dequantized by {xdq}: the DUT takes per-tensor activations"
    if dtype_of(x.args[0]) not in (torch.int8, torch.uint8):
        return f"{dtype_of(x.args[0])} activations: the DUT takes int8/uint8"
    if wdq == "dequantize_per_channel.default":
        axis = int(get_arg(w, 3, "axis"))
        if axis != channel_axis:
            return (
                f"per-channel weights along axis {axis}, which the layer sums over: an int8 GEMM "
                f"can only scale its output channels (axis {channel_axis} of these weights); "
                "quantize the weights per output channel or per tensor"
            )
    elif wdq != "dequantize_per_tensor.default":
        return f"weights dequantized by {wdq}: the DUT takes per-channel or per-tensor int8 weights"
    if dtype_of(w.args[0]) != torch.int8 or ndim_of(w.args[0]) not in weight_dims:
        return (
            f"{ndim_of(w.args[0])}-D {dtype_of(w.args[0])} weights: the DUT takes int8 weights "
            f"of {' or '.join(map(str, weight_dims))} dims here"
        )
    w_zp: Any = w.args[2]  # a node, or a Python int when static
    # A zero point the graph cannot show (a computed one) is checked by asic::qlinear at run time.
    zp = real_tensor(rw.gm, w_zp) if isinstance(w_zp, fx.Node) else w_zp
    if zp is not None and not numerics.is_symmetric_weight_zp(zp):
        return numerics.ASYMMETRIC_WEIGHTS
    return None


_RELU: frozenset[Any] = frozenset({_aten.relu.default, torch.relu, torch.nn.functional.relu})


def _output_quant(node: fx.Node) -> tuple[fx.Node | None, fx.Node] | None:
    """``(relu or None, quantize_per_tensor)`` that only consume ``node``'s output, if any."""
    if len(node.users) != 1:
        return None
    (user,) = node.users
    relu = None
    if (user.op == "call_function" and user.target in _RELU and not user.kwargs.get("inplace")) or (
        user.op == "call_method" and user.target == "relu"
    ):
        if len(user.users) != 1:
            return None
        relu, (user,) = user, user.users
    source = relu if relu is not None else node
    if _qd_name(user) != "quantize_per_tensor.default" or user.args[0] is not source:
        return None
    if user.args[5] not in (torch.int8, torch.uint8):
        return None
    return relu, user
