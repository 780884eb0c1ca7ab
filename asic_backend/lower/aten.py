"""GEMMs that only the aten graph shows: those inside calls Dynamo keeps opaque.

Dynamo records ``F.multi_head_attention_forward`` as one call, although it runs linears, batched
matmuls or an attention kernel, and ``torch.einsum`` (``tensordot``, ``inner``, ``multi_dot``,
``chain_matmul``) as one call whose contraction AOTAutograd turns into (batched) matmuls.
:func:`tag_region` marks such a call on the Dynamo graph; AOTAutograd copies the mark
(``node.meta["custom"]``) onto every aten node it traces out of it, and :func:`lower_aten` then
lowers those ``mm``/``addmm``/``bmm``/``baddbmm`` and attention kernels on the aten graph, before
the host compiler sees it. PyTorch's fused C++ inference fast
paths (``_native_multi_head_attention``, ``_transformer_encoder_layer_fwd``) trace to one opaque
kernel: :func:`fused_fastpath_on_host` leaves them on the host, with the switch that turns them
off.

>>> lower(gm, options).regions            # on the Dynamo graph: the tagged calls
1
>>> lower_aten(aten_gm, options).dut      # on the aten graph AOTAutograd made of it
['aten linear -> asic::dyn_linear at model.py:12 (attn)', ...]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from asic_backend.lower.attention import ATEN_SDPA, lower_aten_sdpa
from asic_backend.lower.float_layers import dtype_unsupported
from asic_backend.lower.fx_nodes import int_dims, is_graph_input, is_scaled, ndim_of, op_name
from asic_backend.lower.rewrite import (
    LoweringOptions,
    LoweringSummary,
    Rewrite,
    graph_modules,
    merged,
)

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

#: Torch functions Dynamo keeps as one opaque call although their bodies hold GEMMs.
#: AOTAutograd traces those bodies, so their GEMMs are lowered on the aten graph.
REGIONS: frozenset[Any] = frozenset(
    {
        torch.nn.functional.multi_head_attention_forward,
        torch.functional.einsum,
        torch.einsum,
        torch.functional.tensordot,
        torch.tensordot,
        torch.inner,
        torch.linalg.multi_dot,
        torch.functional.chain_matmul,
        torch.chain_matmul,
        # The same calls in a torch.export program, whose graph keeps them as aten ops.
        _aten.einsum.default,
        _aten.tensordot.default,
        _aten.inner.default,
        _aten.linalg_multi_dot.default,
        _aten.chain_matmul.default,
    }
)
#: Fused C++ inference fast paths, and how many linears each runs where the DUT cannot see them.
FUSED_FASTPATHS: dict[Any, int] = {
    torch._transformer_encoder_layer_fwd: 4,
    torch._native_multi_head_attention: 2,
}


# -- on the Dynamo graph ------------------------------------------------------------------------


def tag_region(rw: Rewrite, node: fx.Node) -> None:
    """Mark an opaque call (one of :data:`REGIONS`) for :func:`lower_aten`."""
    node.meta["custom"] = {**(node.meta.get("custom") or {}), REGION_KEY: op_name(node)}
    rw.summary.regions += 1


def fused_fastpath_on_host(rw: Rewrite, node: fx.Node) -> None:
    """Leave a fused fast path (one of :data:`FUSED_FASTPATHS`) on the host, saying how to
    turn it off."""
    rw.host(
        node,
        f"PyTorch's fused inference fast path ({op_name(node)}) runs its "
        f"{FUSED_FASTPATHS[node.target]} linears and its attention on the host: call "
        "torch.backends.mha.set_fastpath_enabled(False) to run them on the DUT",
    )


# -- on the aten graph --------------------------------------------------------------------------

_ATEN_TRANSPOSE: frozenset[Any] = frozenset({_aten.t.default, _aten.permute.default})


def lower_aten(gm: fx.GraphModule, options: LoweringOptions) -> LoweringSummary:
    """Lower the GEMMs and attention kernels that AOTAutograd traced out of the regions
    :func:`tag_region` tagged (e.g. ``F.multi_head_attention_forward``), in place, in ``gm``
    and its subgraphs."""
    return merged([_lower_aten_graph(module, options) for module in graph_modules(gm)])


def _lower_aten_graph(gm: fx.GraphModule, options: LoweringOptions) -> LoweringSummary:
    rw = Rewrite(gm, options)
    for node in list(gm.graph.nodes):
        if node in rw.erased or node.op != "call_function":
            continue
        if REGION_KEY not in (node.meta.get("custom") or {}):
            continue
        if node.target in (_aten.mm.default, _aten.addmm.default):
            _lower_mm(rw, node)
        elif node.target in (_aten.bmm.default, _aten.baddbmm.default):
            _lower_bmm(rw, node)
        elif node.target in ATEN_SDPA:
            lower_aten_sdpa(rw, node, _region(node))
    if rw.summary.dut or rw.summary.host:
        gm.graph.lint()
        gm.recompile()
    return rw.summary


def _gemm_unsupported(node: fx.Node, a: fx.Node, b: fx.Node, policy: str) -> str | None:
    if policy == "none":
        which = "quantize" if node.target in (_aten.mm.default, _aten.addmm.default) else "matmul"
        return f"{which}='none': this region's matmuls stay on the host"
    if node.target in (_aten.addmm.default, _aten.baddbmm.default) and is_scaled(node, 3):
        return f"{op_name(node)} with alpha/beta != 1 inside {_region(node)} stays on the host"
    return dtype_unsupported(a, b)


def _host(rw: Rewrite, node: fx.Node, reason: str) -> None:
    """Leave a region's aten op on the host, named after the call the user wrote (einsum)."""
    rw.host(node, reason, op=_region(node))


def _region(node: fx.Node) -> str:
    return str((node.meta.get("custom") or {}).get(REGION_KEY, "an opaque call"))


def _lower_mm(rw: Rewrite, node: fx.Node) -> None:
    addmm = node.target is _aten.addmm.default
    bias, a, b = (node.args[0], node.args[1], node.args[2]) if addmm else (None, *node.args[:2])
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return
    reason = _gemm_unsupported(node, a, b, rw.options.quantize)
    if reason is not None:
        _host(rw, node, reason)
        return
    base, transposed = b, True  # a @ B with B [K, N] is linear(a, Bᵀ)
    if b.target in _ATEN_TRANSPOSE and ndim_of(b.args[0]) == 2:
        dims = int_dims(b.args[1:])
        if dims in ([], [1, 0], [-1, -2]):
            base, transposed = b.args[0], False  # type: ignore[assignment]
    args = (a, base, bias, transposed, is_graph_input(base), rw.options.device)
    new = rw.call_aten_before(node, _ops.dyn_linear.default, args)
    rw.replace(node, new, "aten linear -> asic::dyn_linear")


def _lower_bmm(rw: Rewrite, node: fx.Node) -> None:
    baddbmm = node.target is _aten.baddbmm.default
    a, b = node.args[1:3] if baddbmm else node.args[:2]
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return
    reason = _gemm_unsupported(node, a, b, rw.options.matmul)
    if reason is not None:
        _host(rw, node, reason)
        return
    out = rw.call_aten_before(node, _ops.dyn_matmul.default, (a, b, rw.options.device))
    if baddbmm:
        out = rw.call_aten_before(node, _aten.add.Tensor, (node.args[0], out))
    rw.replace(node, out, "aten bmm -> asic::dyn_matmul")
