"""Host accounting: every matmul-class op left in the aten graph is a counted host fallback,
and every host sync a counted stall of the device.

The last pass over every aten graph the backend hands to the host compiler (forward, inference
and backward): each op of :data:`asic_backend.sim.macs.MAC_OPS` still in it runs on the host, so
:func:`account_host_macs` threads its first operand through ``asic::host_fallback``, which on
every run counts one call and its MACs (from the operands' real shapes, so dynamic shapes count
right) on the device, with the reason and the user's ``file:line``. Whatever put the op there (a
lowering that said why, autograd, an op no pass knows), it cannot run unseen.

>>> summary = account_host_macs(aten_gm, options, default_reason=None)
>>> [site.op for site in summary.host]        # what will be counted on the host, and why
['conv2d']

A host sync (:mod:`asic_backend.lower.host_syncs`: an ``.item()``, a data-dependent shape) makes the
device wait for the host: :func:`account_host_syncs` threads the sync's smallest tensor input
through ``asic::host_sync``, which on every run counts it on the device (``syncs``, and
``AsicConfig.sync_cycles`` more cycles).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, fx

from asic_backend.lower.fx_nodes import example_value, origin_frame, user_frame
from asic_backend.lower.host_syncs import sync_form
from asic_backend.lower.rewrite import (
    HOST_OP_KEY,
    HOST_REASON_KEY,
    LoweringOptions,
    LoweringSummary,
    Rewrite,
    graph_modules,
    merged,
)
from asic_backend.sim import macs
from asic_backend.sim.device import HostFallback, get_device

__all__ = [
    "AUTOGRAD_REASON",
    "BACKWARD_REASON",
    "account_host_macs",
    "account_host_syncs",
    "host_fallback",
    "host_sync",
]

#: Why a graph compiled while autograd was live runs on the host (per op, with its MACs).
AUTOGRAD_REASON = (
    "autograd is live (grad mode on and an input or parameter requires grad), so the graph runs "
    "on the host: the DUT is inference-only; call the model under torch.no_grad() or "
    "torch.inference_mode()"
)
#: Why the backward graph's matmul-class ops run on the host.
BACKWARD_REASON = "the backward pass runs on the host: the DUT is inference-only"


def _unlowered_reason(name: str) -> str:
    return (
        f"no DUT lowering reached aten.{name} (in-place and out= variants and ops inside calls "
        "the backend cannot see into have none): write it out of place if it is one, else "
        "report the model"
    )


def account_host_macs(
    gm: fx.GraphModule, options: LoweringOptions, default_reason: str | None = None
) -> LoweringSummary:
    """Count every matmul-class op of the aten graph ``gm`` as a host fallback, in place.

    An op's reason is the one the lowering gave its source node, else ``default_reason`` (why
    the whole graph is on the host), else a generic one naming the op. The subgraphs of
    higher-order ops (``torch.cond`` branches, nested compile regions) are walked too, and
    what runs there is counted when it runs.
    """
    return merged([_account(module, options, default_reason) for module in graph_modules(gm)])


def _account(
    gm: fx.GraphModule, options: LoweringOptions, default_reason: str | None
) -> LoweringSummary:
    rw = Rewrite(gm, options)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        op = macs.mac_op(node.target)
        if op is None:
            continue
        custom = node.meta.get("custom") or {}
        aten_name = node.target._opname if isinstance(node.target, torch._ops.OpOverload) else "?"
        reason = custom.get(HOST_REASON_KEY) or default_reason or _unlowered_reason(aten_name)
        _mark(rw, node, op, reason, str(custom.get(HOST_OP_KEY) or aten_name))
    if rw.summary.host:
        gm.graph.lint()
        gm.recompile()
    return rw.summary


def _mark(rw: Rewrite, node: fx.Node, op: macs.MacOp, reason: str, name: str) -> None:
    first, *others = (node.args[i] for i in op.operands)
    if not isinstance(first, fx.Node) or not all(isinstance(o, fx.Node) for o in others):
        return
    file, line, source = user_frame(node)
    origin = origin_frame(node)
    marker = rw.call_aten_before(
        node,
        torch.ops.asic.host_fallback.default,
        (
            first,
            list(others),
            op.formula,
            op.params(node.args),
            rw.options.device,
            name,
            reason,
            file,
            line,
            source,
            *origin,
        ),
    )
    for key in ("stack_trace", "nn_module_stack", "custom"):
        if key in node.meta:
            marker.meta[key] = node.meta[key]
    node.replace_input_with(first, marker)
    rw.summary.host.append(_site(name, reason, file, line, source, *origin))


# -- asic::host_fallback: the run-time count ----------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _site(
    op: str,
    reason: str,
    file: str | None,
    line: int | None,
    source: str | None,
    origin_file: str | None = None,
    origin_line: int | None = None,
    origin_function: str | None = None,
) -> HostFallback:
    return HostFallback(op, reason, file, line, source, origin_file, origin_line, origin_function)


@torch.library.custom_op("asic::host_fallback", mutates_args=())
def host_fallback(
    x: Tensor,
    others: list[Tensor],
    formula: str,
    params: list[int],
    device: str,
    op: str,
    reason: str,
    file: str | None,
    line: int | None,
    source: str | None,
    origin_file: str | None = None,
    origin_line: int | None = None,
    origin_function: str | None = None,
) -> Tensor:
    """Count one host call of ``op`` (at ``file:line``, traced at ``origin_*``, for
    ``reason``) and pass ``x`` on.

    ``x`` and ``others`` are the op's operands (the tensors its MAC ``formula`` reads, with
    ``params`` for a convolution); the op itself then runs on the host, unchanged, on the
    returned copy of ``x``, so the count cannot be dropped as dead code. The copy keeps ``x``'s
    strides (a kernel may lay its output out after its input's, and the graph after it was
    traced with those). The site travels in the arguments, so a cached graph needs no side
    table.
    """
    shapes = [tuple(x.shape), *(tuple(t.shape) for t in others)]
    formula_ = _formula(formula)
    count = macs.macs(formula_, shapes, params)
    get_device(device).record_host_fallback(
        _site(op, reason, file, line, source, origin_file, origin_line, origin_function),
        count,
        macs.shape_text(formula_, shapes),
    )
    return x.clone(memory_format=torch.preserve_format)


@host_fallback.register_fake
def _(
    x: Tensor,
    others: list[Tensor],
    formula: str,
    params: list[int],
    device: str,
    op: str,
    reason: str,
    file: str | None,
    line: int | None,
    source: str | None,
    origin_file: str | None = None,
    origin_line: int | None = None,
    origin_function: str | None = None,
) -> Tensor:
    _formula(formula)
    return torch.empty_like(x, memory_format=torch.preserve_format)


def _formula(name: str) -> macs.Formula:
    if name not in macs.FORMULAS:
        raise ValueError(f"asic::host_fallback: unknown MAC formula {name!r}")
    return name  # type: ignore[return-value]


# -- asic::host_sync: the device's stalls ---------------------------------------------------------


def account_host_syncs(gm: fx.GraphModule, options: LoweringOptions) -> int:
    """Count every host sync of the aten graph ``gm`` (its subgraphs included) on the device
    each time it runs, in place; return how many syncs the graph has."""
    total = 0
    for module in graph_modules(gm):
        rw = Rewrite(module, options)
        found = 0
        for node in list(module.graph.nodes):
            if sync_form(node) is None:
                continue
            tensors = [a for a in node.all_input_nodes if isinstance(example_value(a), Tensor)]
            if not tensors:
                continue  # nothing to thread the count through; the plugin still counts it
            smallest = min(tensors, key=_static_numel)
            marker = rw.call_aten_before(
                node, torch.ops.asic.host_sync.default, (smallest, options.device)
            )
            for key in ("stack_trace", "nn_module_stack"):
                if key in node.meta:
                    marker.meta[key] = node.meta[key]
            node.replace_input_with(smallest, marker)
            found += 1
        if found:
            module.graph.lint()
            module.recompile()
        total += found
    return total


def _static_numel(node: fx.Node) -> int:
    """The input's size, to copy the smallest; a symbolic size by its hint, which adds no
    guard (``int()`` of it would specialize the graph to this call's shape)."""
    numel = example_value(node).numel()
    if isinstance(numel, int):
        return numel
    hint = getattr(getattr(numel, "node", None), "hint", None)
    return int(hint) if isinstance(hint, int) else 1 << 62


@torch.library.custom_op("asic::host_sync", mutates_args=())
def host_sync(x: Tensor, device: str) -> Tensor:
    """Count one host sync on ``device`` (the op after this one reads ``x`` back on the host)
    and pass ``x`` on, as a copy, so the count cannot be dropped as dead code."""
    get_device(device).record_sync()
    return x.clone(memory_format=torch.preserve_format)


@host_sync.register_fake
def _(x: Tensor, device: str) -> Tensor:
    return torch.empty_like(x, memory_format=torch.preserve_format)
