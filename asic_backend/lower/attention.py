"""Scaled dot-product attention → ``asic::dyn_sdpa`` (QKᵀ and PV on the DUT).

Every argument combination of ``F.scaled_dot_product_attention`` is either lowered or left on
the host with a reason: ``attn_mask`` (boolean or additive), ``is_causal``, ``scale`` and
``enable_gqa`` are lowered; attention dropout (``dropout_p > 0``, which SDPA applies whatever
the module's mode) and arguments only known at run time are not. The same op takes the
attention that AOTAutograd traces out of an opaque region (``F.multi_head_attention_forward``
with ``need_weights=False``), on the aten graph.

>>> lower_sdpa(rw, node)              # on the Dynamo graph
>>> lower_aten_sdpa(rw, aten_node)    # an aten SDPA kernel inside a tagged region
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from asic_backend.lower.fx_nodes import dtype_of, get_arg
from asic_backend.lower.rewrite import Rewrite, fake_run
from asic_backend.ops import linear as quant_ops

__all__ = ["ATEN_SDPA", "SDPA_TARGETS", "lower_aten_sdpa", "lower_sdpa"]

_aten = torch.ops.aten

#: ``F.scaled_dot_product_attention`` as Dynamo records it (and as an exported graph calls it).
SDPA_TARGETS: frozenset[Any] = frozenset(
    {torch.nn.functional.scaled_dot_product_attention, _aten.scaled_dot_product_attention.default}
)
#: The aten attention kernels of a traced region: each returns ``(output, ...)``.
ATEN_SDPA: frozenset[Any] = frozenset(
    {
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
        _aten._scaled_dot_product_attention_math.default,
    }
)


def lower_sdpa(rw: Rewrite, node: fx.Node) -> None:
    """Replace an SDPA call by ``asic::dyn_sdpa``, or leave it on the host with the reason."""
    q, k, v = (get_arg(node, i, name) for i, name in enumerate(("query", "key", "value")))
    mask = get_arg(node, 3, "attn_mask")
    dropout = get_arg(node, 4, "dropout_p", 0.0)
    causal = get_arg(node, 5, "is_causal", False)
    scale = get_arg(node, 6, "scale")
    gqa = get_arg(node, 7, "enable_gqa", False)
    if not all(isinstance(t, fx.Node) for t in (q, k, v)):
        return
    reason = _unsupported(rw, q, k, v, mask, dropout, causal, scale, gqa)
    if reason is not None:
        rw.host(node, reason)
        return
    args = (q, k, v, mask, bool(causal), scale, bool(gqa), rw.options.device)
    new = rw.call_before(node, torch.ops.asic.dyn_sdpa.default, args)
    rw.replace(node, new, "scaled_dot_product_attention -> asic::dyn_sdpa")


def lower_aten_sdpa(rw: Rewrite, node: fx.Node, region: str) -> None:
    """Replace an aten SDPA kernel of a traced ``region`` (named for messages) when only its
    output is used."""
    q, k, v = node.args[:3]
    if node.target is _aten._scaled_dot_product_attention_math.default:
        mask, dropout = get_arg(node, 3, "attn_mask"), get_arg(node, 4, "dropout_p", 0.0)
        causal = get_arg(node, 5, "is_causal", False)
        extra = node.args[6] if len(node.args) > 6 else node.kwargs.get("dropout_mask")
        if extra is not None:
            rw.host(node, "attention with an explicit dropout mask stays on the host", region)
            return
    else:
        mask = node.kwargs.get("attn_mask")
        dropout, causal = get_arg(node, 3, "dropout_p", 0.0), get_arg(node, 4, "is_causal", False)
    scale = node.kwargs.get("scale")
    gqa = node.kwargs.get("enable_gqa", False)
    outputs = list(node.users)
    if not all(u.target is operator.getitem and u.args[1] == 0 for u in outputs):
        rw.host(node, "the attention's extra outputs (weights, log-sum-exp) are used", region)
        return
    reason = _unsupported(rw, q, k, v, mask, dropout, causal, scale, gqa)
    if reason is not None:
        rw.host(node, reason, region)
        return
    args = (q, k, v, mask, bool(causal), scale, bool(gqa), rw.options.device)
    new = rw.call_aten_before(node, torch.ops.asic.dyn_sdpa.default, args)
    # The aten graph after it was traced against the kernel's output strides (its views rely on
    # them): lay the DUT result out the same way.
    new = _restride(rw, node, new, outputs[0].meta["val"] if outputs else None)
    for user in outputs:
        user.replace_all_uses_with(new)
        rw.erase(user)
    new.meta.setdefault("stack_trace", node.meta.get("stack_trace"))
    rw.replace(node, new, "aten attention -> asic::dyn_sdpa")


def _restride(rw: Rewrite, node: fx.Node, new: fx.Node, like: Any) -> fx.Node:
    """``new`` (contiguous) copied into the dense layout of the fake tensor ``like``."""
    if not isinstance(like, torch.Tensor) or like.is_contiguous():
        return new
    strides = [int(like.stride(d)) for d in range(like.dim())]
    order = sorted(range(like.dim()), key=lambda d: (-strides[d], d))  # outermost first
    inverse = sorted(range(like.dim()), key=order.__getitem__)
    permuted = rw.call_aten_before(node, _aten.permute.default, (new, order))
    packed = rw.call_aten_before(node, _aten.clone.default, (permuted,))
    packed.kwargs = {"memory_format": torch.contiguous_format}
    packed.meta["val"] = fake_run(packed)
    return rw.call_aten_before(node, _aten.permute.default, (packed, inverse))


def _unsupported(
    rw: Rewrite, q: Any, k: Any, v: Any, mask: Any, dropout: Any, causal: Any, scale: Any, gqa: Any
) -> str | None:
    """Why the DUT path cannot take this attention (None: it can)."""
    if rw.options.matmul == "none":
        return "matmul='none': attention's activation matmuls stay on the host"
    dtypes = {dtype_of(t) for t in (q, k, v)}
    if len(dtypes) != 1 or not dtypes <= set(quant_ops.FLOAT_DTYPES):
        shown = " / ".join(str(dtype_of(t)) for t in (q, k, v))
        return (
            f"{shown} query/key/value: the DUT path quantizes float32/bfloat16/float16 only "
            "(cast to float32 to run it on the DUT)"
        )
    if not isinstance(dropout, int | float) or dropout != 0:
        return (
            f"attention dropout (dropout_p={dropout}) is random and for training; the DUT path "
            "is inference: pass dropout_p=0.0 outside training (dropout_p if self.training else "
            "0.0)"
        )
    if mask is not None and not isinstance(mask, fx.Node):
        return "an attn_mask that is not a tensor stays on the host"
    if not isinstance(causal, bool) or not isinstance(gqa, bool):
        return "is_causal / enable_gqa computed at run time: pass Python bools"
    if scale is not None and not isinstance(scale, int | float):
        return "a scale computed at run time: pass a Python float (or None)"
    if causal and mask is not None:
        return "both attn_mask and is_causal: PyTorch rejects the pair; pass one of them"
    return None
