"""Convolutions → the DUT: float ones as ``asic::dyn_conv``, PT2E ones as ``asic::qconv``.

Every spelling Dynamo records (``torch.conv2d`` / ``F.conv2d``, ``conv_transpose*``,
``torch.convolution``, and the aten overloads an exported PT2E program calls) is read into one
:class:`ConvCall`: 1-D, 2-D and 3-D; strided, padded (``"same"``/``"valid"`` too), dilated,
grouped and depthwise; transposed. Float operands go to ``asic::dyn_conv`` (unless
``quantize="none"``); a PT2E ``dequantize → conv`` chain to ``asic::qconv``. Anything else (a
float64 conv, a tensor-subclass weight, a PT2E transposed conv, ...) stays on the host, counted,
with its reason.

>>> call = ConvCall.parse(node)        # node: a conv call of a Dynamo graph
>>> lower_conv(rw, node)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import fx

from asic_backend.lower.fx_nodes import dtype_of, example_value, get_arg, is_graph_input, is_plain
from asic_backend.lower.pt2e import STATIC_ONLY, is_pt2e_pair, lower_pt2e_conv
from asic_backend.lower.rewrite import Rewrite
from asic_backend.ops import linear as quant_ops
from asic_backend.ops.conv import padding_pairs

__all__ = ["CONV_TARGETS", "ConvCall", "lower_conv"]


_aten = torch.ops.aten

_CONV = "conv"  # (input, weight, bias, stride, padding, dilation, groups)
_CONV_T = (
    "conv_transpose"  # (input, weight, bias, stride, padding, output_padding, groups, dilation)
)
_CONVOLUTION = "convolution"  # (input, weight, bias, stride, padding, dilation, transposed, ...)

#: Every call target that is a convolution, and how its arguments are laid out.
CONV_TARGETS: dict[Any, str] = {
    torch.conv1d: _CONV,
    torch.conv2d: _CONV,
    torch.conv3d: _CONV,
    _aten.conv1d.default: _CONV,
    _aten.conv2d.default: _CONV,
    _aten.conv3d.default: _CONV,
    _aten.conv1d.padding: _CONV,
    _aten.conv2d.padding: _CONV,
    _aten.conv3d.padding: _CONV,
    torch.conv_transpose1d: _CONV_T,
    torch.conv_transpose2d: _CONV_T,
    torch.conv_transpose3d: _CONV_T,
    _aten.conv_transpose1d.default: _CONV_T,
    _aten.conv_transpose2d.input: _CONV_T,
    _aten.conv_transpose3d.input: _CONV_T,
    torch.convolution: _CONVOLUTION,
    _aten.convolution.default: _CONVOLUTION,
}


@dataclasses.dataclass(frozen=True)
class ConvCall:
    """A convolution call's arguments, whatever the spelling. ``padding`` may be a string."""

    x: Any
    w: Any
    bias: Any
    stride: Any
    padding: Any
    dilation: Any
    groups: Any
    transposed: bool
    output_padding: Any

    @classmethod
    def parse(cls, node: fx.Node) -> ConvCall:
        layout = CONV_TARGETS[node.target]

        def arg(i: int, name: str, default: Any = None) -> Any:
            return get_arg(node, i, name, default)

        x, w, b = arg(0, "input"), arg(1, "weight"), arg(2, "bias")
        if layout == _CONV:
            return cls(
                x,
                w,
                b,
                arg(3, "stride", 1),
                arg(4, "padding", 0),
                arg(5, "dilation", 1),
                arg(6, "groups", 1),
                False,
                0,
            )
        if layout == _CONV_T:
            return cls(
                x,
                w,
                b,
                arg(3, "stride", 1),
                arg(4, "padding", 0),
                arg(7, "dilation", 1),
                arg(6, "groups", 1),
                True,
                arg(5, "output_padding", 0),
            )
        return cls(
            x,
            w,
            b,
            arg(3, "stride"),
            arg(4, "padding"),
            arg(5, "dilation"),
            arg(8, "groups"),
            bool(arg(6, "transposed")),
            arg(7, "output_padding"),
        )

    def spatial(self) -> int | None:
        wv = example_value(self.w)
        return wv.dim() - 2 if isinstance(wv, torch.Tensor) else None

    def ints(self, value: Any) -> list[int] | None:
        """A per-dim argument as one int per spatial dim, or None when it is not static."""
        spatial = self.spatial()
        values = [value] if isinstance(value, int) else list(value or ())
        if spatial is None or not all(isinstance(v, int) for v in values):
            return None
        values = values * spatial if len(values) == 1 else values
        return values if len(values) == spatial else None

    def static(self) -> tuple[list[int], list[int], list[int], int, bool, list[int]] | None:
        """``(stride, padding, dilation, groups, transposed, output_padding)`` as the ``asic::``
        conv ops take them, or None when any is not a Python int (computed at run time)."""
        stride, dilation = self.ints(self.stride), self.ints(self.dilation)
        padding = self.padding_list()
        out_pad = self.ints(self.output_padding) if self.transposed else [0] * len(stride or ())
        if stride is None or dilation is None or padding is None or out_pad is None:
            return None
        if not isinstance(self.groups, int):
            return None
        return stride, padding, dilation, self.groups, self.transposed, out_pad

    def padding_list(self) -> list[int] | None:
        """Padding as ``[lo0, hi0, lo1, hi1, ...]``; ``"same"`` resolved from the kernel."""
        spatial = self.spatial()
        if spatial is None:
            return None
        if self.padding == "valid":
            return [0] * 2 * spatial
        if self.padding == "same":
            dilation, kernel = self.ints(self.dilation), example_value(self.w).shape[2:]
            if dilation is None or not all(isinstance(k, int) for k in kernel):
                return None
            out = []
            for d, k in zip(dilation, kernel, strict=True):
                total = d * (k - 1)
                out += [total // 2, total - total // 2]  # PyTorch pads the extra one after
            return out
        return padding_pairs(self.padding, spatial)


def lower_conv(rw: Rewrite, node: fx.Node) -> None:
    """Replace a convolution by its DUT op, or leave it on the host with the reason."""
    call = ConvCall.parse(node)
    x, w = call.x, call.w
    if not (isinstance(x, fx.Node) and isinstance(w, fx.Node)):
        return
    if is_pt2e_pair(x, w):
        lower_pt2e_conv(rw, node, call)
        return
    if not is_plain(example_value(w)):
        cls = type(example_value(w)).__name__
        rw.host(
            node,
            f"a {cls} weight: the DUT takes convolution weights as float (quantized on the fly) "
            "or from PT2E (convert_pt2e); leave convolutions unquantized for the DUT",
        )
        return
    if rw.options.quantize == "none":
        rw.host(node, "quantize='none': float convolutions stay on the host")
        return
    reason = _unsupported(call)
    layout = call.static()
    if reason is None and layout is None:
        reason = STATIC_ONLY
    if reason is not None or layout is None:
        rw.host(node, reason or STATIC_ONLY)
        return
    args = (x, w, call.bias, *layout, is_graph_input(w), rw.options.device)
    new = rw.call_before(node, torch.ops.asic.dyn_conv.default, args)
    kind = "conv_transpose" if call.transposed else "conv"
    rw.replace(node, new, f"{kind}{call.spatial()}d -> asic::dyn_conv")


def _unsupported(call: ConvCall) -> str | None:
    """Why the DUT cannot take this float convolution (None: it can)."""
    xd, wd = dtype_of(call.x), dtype_of(call.w)
    if xd not in quant_ops.FLOAT_DTYPES or wd != xd:
        got = f"{xd}" if xd == wd else f"{xd} x {wd}"
        return (
            f"{got} operands: the DUT path quantizes float32/bfloat16/float16 only "
            "(cast to float32 to run it on the DUT)"
        )
    if call.bias is not None and dtype_of(call.bias) != xd:
        return f"a {dtype_of(call.bias)} bias for {xd} operands: give the bias the input's dtype"
    if call.spatial() not in (1, 2, 3):
        return f"a {call.spatial()}-D convolution: the DUT path takes 1-D, 2-D and 3-D ones"
    return None
