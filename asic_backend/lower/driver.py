"""The lowering driver: moves every quantized (and, by default, every float) matmul-class op
of a Dynamo graph onto the DUT, as ``asic::`` ops (:mod:`asic_backend.ops.linear`,
:mod:`~asic_backend.ops.conv`, :mod:`~asic_backend.ops.attention`).

It runs on the Dynamo graph, before AOTAutograd: there a TorchAO layer is still one ``linear``
whose weight is the tensor subclass, and a PT2E layer is still ``dequantize → linear``. Each
kind of site has its own module:

1. a model prepared for QAT (or PT2E) but not converted is refused
   (:mod:`~asic_backend.lower.unconverted`);
2. PT2E layers → ``asic::qlinear`` / ``asic::qconv`` (:mod:`~asic_backend.lower.pt2e`);
3. TorchAO ``Int8Tensor`` / ``IntxUnpackedToInt8Tensor`` linears → ``asic::dyn_qlinear``
   (:mod:`~asic_backend.lower.torchao`);
4. float linears and linear-like matmuls → ``asic::dyn_linear``, activation x activation
   matmuls (``bmm``, ``baddbmm``, ``addbmm``) → ``asic::dyn_matmul``
   (:mod:`~asic_backend.lower.float_layers`);
5. convolutions (1-D/2-D/3-D, grouped, transposed) → ``asic::dyn_conv``
   (:mod:`~asic_backend.lower.conv`);
6. ``F.scaled_dot_product_attention`` → ``asic::dyn_sdpa`` (:mod:`~asic_backend.lower.attention`);
   an int8 ``_int_mm`` (a TorchAO layer in an exported program) → ``asic::int_mm``
   (:mod:`~asic_backend.lower.torchao`);
7. calls Dynamo keeps opaque (``F.multi_head_attention_forward``, ``torch.einsum``) are tagged,
   and :func:`lower_aten` lowers their GEMMs on the aten graph (:mod:`~asic_backend.lower.aten`).

Anything the DUT cannot take (dtype, dropout, a fused C++ fast path, …) stays on the host with
a reason, and the aten-level accounting (:mod:`~asic_backend.lower.accounting`) counts each of its
matmul-class ops on every run, with its MACs and the user's ``file:line``.

>>> summary = lower(gm, LoweringOptions(device="default"))   # gm: a Dynamo GraphModule
>>> summary.dut, summary.host                                  # what went where, and why
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

import asic_backend.ops.attention
import asic_backend.ops.conv
import asic_backend.ops.linear  # noqa: F401  (the asic:: ops the passes emit)
from asic_backend.lower.aten import (
    FUSED_FASTPATHS,
    REGION_KEY,
    REGIONS,
    fused_fastpath_on_host,
    lower_aten,
    tag_region,
)
from asic_backend.lower.attention import SDPA_TARGETS, lower_sdpa
from asic_backend.lower.conv import CONV_TARGETS, lower_conv
from asic_backend.lower.float_layers import lower_float_linear, lower_matmul
from asic_backend.lower.fx_nodes import example_value, get_arg, is_plain
from asic_backend.lower.pt2e import is_pt2e_pair, lower_pt2e
from asic_backend.lower.rewrite import (
    POLICIES,
    LoweringOptions,
    LoweringSummary,
    Policy,
    Rewrite,
    graph_modules,
    merged,
)
from asic_backend.lower.torchao import INT_MM_TARGETS, lower_int_mm, lower_torchao
from asic_backend.lower.unconverted import NotConvertedError, reject_unconverted

__all__ = [
    "POLICIES",
    "REGION_KEY",
    "LoweringOptions",
    "LoweringSummary",
    "NotConvertedError",
    "Policy",
    "lower",
    "lower_aten",
    "reject_unconverted",
]

_aten = torch.ops.aten


def lower(gm: fx.GraphModule, options: LoweringOptions) -> LoweringSummary:
    """Rewrite ``gm`` (a Dynamo graph) in place; see the module docstring for the passes.

    Raises :class:`NotConvertedError` for a prepared, unconverted model.
    """
    reject_unconverted(gm)
    return merged([_lower_graph(module, options) for module in graph_modules(gm)])


def _lower_graph(gm: fx.GraphModule, options: LoweringOptions) -> LoweringSummary:
    rw = Rewrite(gm, options)
    for node in list(gm.graph.nodes):
        if node in rw.erased:  # fused into an earlier node
            continue
        kind = _kind(node)
        if kind == "linear":
            _lower_linear(rw, node)
        elif kind == "region":
            tag_region(rw, node)
        elif kind == "fused":
            fused_fastpath_on_host(rw, node)
        elif kind == "conv":
            lower_conv(rw, node)
        elif kind == "sdpa":
            lower_sdpa(rw, node)
        elif kind == "int_mm":
            lower_int_mm(rw, node)
        elif kind is not None:
            lower_matmul(rw, node, kind)
    gm.graph.lint()
    gm.recompile()
    return rw.summary


def _lower_linear(rw: Rewrite, node: fx.Node) -> None:
    """A ``linear`` is PT2E, TorchAO or float: its input and weight nodes tell which."""
    x, w, b = get_arg(node, 0, "input"), get_arg(node, 1, "weight"), get_arg(node, 2, "bias")
    if not (isinstance(x, fx.Node) and isinstance(w, fx.Node)):
        return
    if is_pt2e_pair(x, w):
        lower_pt2e(rw, node, x, w, b)
        return
    wv = example_value(w)
    if wv is not None and not is_plain(wv):
        lower_torchao(rw, node, x, w, b, wv)
        return
    lower_float_linear(rw, node, x, w, b)


# -- which lowering a node needs ----------------------------------------------------------------

_LINEAR: frozenset[Any] = frozenset({torch._C._nn.linear, _aten.linear.default})
_BY_TARGET: dict[Any, str] = {
    torch.matmul: "matmul",
    torch.linalg.matmul: "matmul",
    operator.matmul: "matmul",
    _aten.matmul.default: "matmul",
    torch.mv: "matmul",
    _aten.mv.default: "matmul",
    torch.dot: "matmul",
    _aten.dot.default: "matmul",
    torch.mm: "mm",
    _aten.mm.default: "mm",
    torch.bmm: "bmm",
    _aten.bmm.default: "bmm",
    torch.addmm: "addmm",
    _aten.addmm.default: "addmm",
    torch.baddbmm: "baddbmm",
    _aten.baddbmm.default: "baddbmm",
    torch.addbmm: "addbmm",
    _aten.addbmm.default: "addbmm",
    **dict.fromkeys(CONV_TARGETS, "conv"),
    **dict.fromkeys(SDPA_TARGETS, "sdpa"),
    **dict.fromkeys(INT_MM_TARGETS, "int_mm"),
}
_BY_METHOD = {
    "matmul": "matmul",
    "__matmul__": "matmul",
    "mv": "matmul",
    "dot": "matmul",
    "mm": "mm",
    "bmm": "bmm",
    "addmm": "addmm",
    "baddbmm": "baddbmm",
    "addbmm": "addbmm",
}


def _kind(node: fx.Node) -> str | None:
    if node.op == "call_function":
        if node.target in _LINEAR:
            return "linear"
        if node.target in REGIONS:
            return "region"
        if node.target in FUSED_FASTPATHS:
            return "fused"
        return _BY_TARGET.get(node.target)
    if node.op == "call_method":
        return _BY_METHOD.get(str(node.target))
    return None
