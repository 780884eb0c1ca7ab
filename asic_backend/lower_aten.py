"""GEMMs that only the aten graph shows: those inside calls Dynamo keeps opaque.

Dynamo records ``F.multi_head_attention_forward`` as one call, although it runs linears and
batched matmuls. :func:`tag_region` marks such a call on the Dynamo graph; AOTAutograd copies the
mark (``node.meta["custom"]``) onto every aten node it traces out of it, and :func:`lower_aten`
then lowers those ``mm``/``addmm``/``bmm``/``baddbmm`` on the aten graph, before the host
compiler sees it. PyTorch's fused C++ inference fast paths (``_native_multi_head_attention``,
``_transformer_encoder_layer_fwd``) trace to no GEMM at all: :func:`fused_fastpath_on_host`
counts them as host fallbacks, with the switch that turns them off.

>>> lower(gm, options).regions            # on the Dynamo graph: the tagged calls
1
>>> lower_aten(aten_gm, options).dut      # on the aten graph AOTAutograd made of it
['aten linear -> asic::dyn_linear at model.py:12 (attn)', ...]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode

from asic_backend import quant_ops
from asic_backend.fx_nodes import (
    dtype_of,
    int_dims,
    is_graph_input,
    is_outer_product,
    is_scaled,
    ndim_of,
    op_name,
)
from asic_backend.rewrite import LoweringOptions, LoweringSummary, Rewrite

__all__ = [
    "FUSED_FASTPATHS",
    "REGIONS",
    "REGION_KEY",
    "fused_fastpath_on_host",
    "lower_aten",
    "tag_region",
]

_ops = torch.ops.asic
_aten = torch.ops.aten

#: The ``node.meta["custom"]`` key that marks a region; AOTAutograd copies ``custom`` metadata
#: onto every aten node it traces out of the tagged call.
REGION_KEY = "asic_region"

#: Torch functions Dynamo keeps as one opaque call although their bodies hold linears and batched
#: matmuls. AOTAutograd traces those bodies, so their GEMMs are lowered on the aten graph.
REGIONS: frozenset[Any] = frozenset({torch.nn.functional.multi_head_attention_forward})
#: Fused C++ inference fast paths, and how many linears each runs where the DUT cannot see them.
FUSED_FASTPATHS: dict[Any, int] = {
    torch._transformer_encoder_layer_fwd: 4,
    torch._native_multi_head_attention: 2,
}


# -- on the Dynamo graph ------------------------------------------------------------------------


def tag_region(rw: Rewrite, node: fx.Node) -> None:
    """Mark an opaque call (one of :data:`REGIONS`) for :func:`lower_aten`."""
    if rw.options.quantize == "none" and rw.options.matmul == "none":
        return
    node.meta["custom"] = {**(node.meta.get("custom") or {}), REGION_KEY: op_name(node)}
    rw.summary.regions += 1


def fused_fastpath_on_host(rw: Rewrite, node: fx.Node) -> None:
    """Count a fused fast path (one of :data:`FUSED_FASTPATHS`) as a host fallback."""
    x = node.args[0]
    if rw.options.quantize == "none" or not isinstance(x, fx.Node):
        return
    rw.host(
        node,
        x,
        f"PyTorch's fused inference fast path ({op_name(node)}) runs its "
        f"{FUSED_FASTPATHS[node.target]} linears on the host: call "
        "torch.backends.mha.set_fastpath_enabled(False) to run them on the DUT",
    )


# -- on the aten graph --------------------------------------------------------------------------

_ATEN_TRANSPOSE: frozenset[Any] = frozenset({_aten.t.default, _aten.permute.default})


def lower_aten(gm: fx.GraphModule, options: LoweringOptions) -> LoweringSummary:
    """Lower the ``mm``/``addmm``/``bmm``/``baddbmm`` that AOTAutograd traced out of the regions
    :func:`tag_region` tagged (e.g. ``F.multi_head_attention_forward``), in place."""
    rw = Rewrite(gm, options)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or REGION_KEY not in (node.meta.get("custom") or {}):
            continue
        if node.target in (_aten.mm.default, _aten.addmm.default):
            _lower_mm(rw, node)
        elif node.target in (_aten.bmm.default, _aten.baddbmm.default):
            _lower_bmm(rw, node)
    gm.graph.lint()
    gm.recompile()
    return rw.summary


def _gemm_ok(a: Any, b: Any) -> bool:
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return False
    if dtype_of(a) not in quant_ops.FLOAT_DTYPES or dtype_of(b) != dtype_of(a):
        return False
    return not is_outer_product(b)


def _lower_mm(rw: Rewrite, node: fx.Node) -> None:
    if rw.options.quantize == "none":
        return
    addmm = node.target is _aten.addmm.default
    bias, a, b = (node.args[0], node.args[1], node.args[2]) if addmm else (None, *node.args[:2])
    if (addmm and is_scaled(node, 3)) or not _gemm_ok(a, b):
        return
    assert isinstance(b, fx.Node)
    base, transposed = b, True  # a @ B with B [K, N] is linear(a, Bᵀ)
    if b.target in _ATEN_TRANSPOSE and ndim_of(b.args[0]) == 2:
        dims = int_dims(b.args[1:])
        if dims in ([], [1, 0], [-1, -2]):
            base, transposed = b.args[0], False  # type: ignore[assignment]
    args = (a, base, bias, transposed, is_graph_input(base), rw.options.device)
    _emit(rw, node, _ops.dyn_linear.default, args, "aten linear -> asic::dyn_linear")


def _lower_bmm(rw: Rewrite, node: fx.Node) -> None:
    if rw.options.matmul == "none":
        return
    baddbmm = node.target is _aten.baddbmm.default
    a, b = node.args[1:3] if baddbmm else node.args[:2]
    if (baddbmm and is_scaled(node, 3)) or not _gemm_ok(a, b):
        return
    g = rw.graph
    with g.inserting_before(node):
        out = g.call_function(_ops.dyn_matmul.default, (a, b, rw.options.device))
        out.meta["val"] = _fake_run(out)
        if baddbmm:
            out = g.call_function(_aten.add.Tensor, (node.args[0], out))
            out.meta["val"] = _fake_run(out)
    rw.replace(node, out, "aten bmm -> asic::dyn_matmul")


def _emit(rw: Rewrite, node: fx.Node, op: Any, args: tuple[Any, ...], what: str) -> None:
    new = rw.call_before(node, op, args)
    new.meta["val"] = _fake_run(new)  # before replace(), which would copy the old node's
    rw.replace(node, new, what)


def _fake_run(node: fx.Node) -> Any:
    """The fake value of a new aten node (inductor reads ``meta["val"]`` of every node)."""
    args, kwargs = torch.utils._pytree.tree_map_only(
        fx.Node, lambda n: n.meta["val"], (node.args, node.kwargs)
    )
    mode = detect_fake_mode(torch.utils._pytree.tree_leaves((args, kwargs)))
    assert mode is not None
    with mode:
        return node.target(*args, **kwargs)  # type: ignore[operator]
