"""What every lowering pass shares: its options, its summary, and :class:`Rewrite`, the graph
edits it makes (put an ``asic::`` op in place of a node; leave a node on the host, saying why).

A node left on the host is not counted here: the reason goes into ``node.meta["custom"]``, which
AOTAutograd copies onto every aten node traced out of it, and the aten-level accounting
(:mod:`asic_backend.lower.accounting`) counts each matmul-class aten op that remains, with its MACs,
that reason and the user's ``file:line``. One place counts, whatever left the op on the host.

>>> rw = Rewrite(gm, LoweringOptions(device="default"))
>>> rw.replace(node, rw.call_before(node, torch.ops.asic.dyn_matmul.default, (a, b, "default")),
...            "matmul -> asic::dyn_matmul")
>>> rw.host(other, "float64 operands: the DUT path quantizes float32/bfloat16/float16 only")
>>> rw.summary.dut, rw.summary.host
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
from torch import fx
from torch._guards import detect_fake_mode

from asic_backend.lower.fx_nodes import dtype_of, graph_modules, op_name, user_frame, where
from asic_backend.sim.device import HostFallback

__all__ = [
    "HOST_OP_KEY",
    "HOST_REASON_KEY",
    "POLICIES",
    "LoweringOptions",
    "LoweringSummary",
    "Policy",
    "Rewrite",
    "fake_run",
    "graph_modules",
    "merged",
    "name_ops",
]

Policy = Literal["dynamic", "none"]
POLICIES: tuple[str, ...] = ("dynamic", "none")

#: ``node.meta["custom"]`` keys of a node left on the host: why, and the op as the user wrote it.
HOST_REASON_KEY = "asic_host_reason"
HOST_OP_KEY = "asic_host_op"

_aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class LoweringOptions:
    """What to move onto the DUT ``device`` (a device key).

    ``quantize``: float linears (and linear-like matmuls) and convolutions as dynamic int8, or
    ``"none"``; ``matmul``: the same for activation x activation matmuls and attention. Quantized
    TorchAO/PT2E layers go to the DUT either way.
    """

    device: str
    quantize: Policy = "dynamic"
    matmul: Policy = "dynamic"


@dataclasses.dataclass
class LoweringSummary:
    """What the passes did: the sites sent to the DUT and those left on the host (with why)."""

    dut: list[str] = dataclasses.field(default_factory=list)
    host: list[HostFallback] = dataclasses.field(default_factory=list)
    #: Opaque calls tagged for :func:`~asic_backend.lower.aten.lower_aten` (their GEMMs appear
    #: only in the aten graph).
    regions: int = 0


class Rewrite:
    """One pass over ``gm``: the graph edits, and the summary of what went where."""

    def __init__(self, gm: fx.GraphModule, options: LoweringOptions) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.options = options
        self.summary = LoweringSummary()
        #: Nodes already removed: a driver iterating over a snapshot of the nodes skips them.
        self.erased: set[fx.Node] = set()

    def call_before(self, node: fx.Node, target: Any, args: tuple[Any, ...]) -> fx.Node:
        """A new ``call_function`` of ``target``, inserted just before ``node``."""
        with self.graph.inserting_before(node):
            return self.graph.call_function(target, args)

    def call_aten_before(self, node: fx.Node, target: Any, args: tuple[Any, ...]) -> fx.Node:
        """:meth:`call_before` on an aten graph, with the fake value compilers read."""
        new = self.call_before(node, target, args)
        new.meta["val"] = fake_run(new)
        return new

    def erase(self, node: fx.Node) -> None:
        self.graph.erase_node(node)
        self.erased.add(node)

    def replace(self, old: fx.Node, new: fx.Node, what: str) -> None:
        """Put ``new`` in place of ``old`` (keeping ``old``'s metadata) and count it on the DUT.

        A DUT op computes in its activation's dtype; where ``old`` was traced in another (under
        ``torch.autocast``), the result is cast to the traced dtype.
        """
        new = self._as_traced_dtype(old, new)
        for key, value in old.meta.items():
            new.meta.setdefault(key, value)
        old.replace_all_uses_with(new)
        self.erase(old)
        self.summary.dut.append(f"{what} at {where(old)}")

    def _as_traced_dtype(self, old: fx.Node, new: fx.Node) -> fx.Node:
        want, got = dtype_of(old), dtype_of(new.args[0] if new.args else None)
        if want is None or got is None or want == got:
            return new
        if not (want.is_floating_point and got.is_floating_point):
            return new
        with self.graph.inserting_after(new):
            if "val" in old.meta:  # an aten graph
                cast = self.graph.call_function(_aten._to_copy.default, (new,), {"dtype": want})
                cast.meta["val"] = fake_run(cast)
                return cast
            return self.graph.call_method("to", (new, want))

    def host(self, node: fx.Node, reason: str, op: str | None = None) -> None:
        """Leave ``node`` on the host for ``reason`` (one line a user can act on), named ``op``
        (default: the op ``node`` calls).

        The aten-level accounting counts its matmul-class ops on every run, with their MACs.
        """
        name = op or op_name(node)
        custom = dict(node.meta.get("custom") or {})
        custom.setdefault(HOST_REASON_KEY, reason)
        custom.setdefault(HOST_OP_KEY, name)
        node.meta["custom"] = custom
        file, line, source = user_frame(node)
        self.summary.host.append(
            HostFallback(op=name, reason=reason, file=file, line=line, source=source)
        )


def merged(summaries: list[LoweringSummary]) -> LoweringSummary:
    """One summary of the passes over several graphs."""
    out = LoweringSummary()
    for summary in summaries:
        out.dut += summary.dut
        out.host += summary.host
        out.regions += summary.regions
    return out


def name_ops(gm: fx.GraphModule) -> None:
    """Mark every call of the Dynamo graph ``gm`` with the op as the user wrote it (``linear``,
    ``conv2d``), so host fallbacks of a graph left whole on the host are named that way rather
    than by the aten op AOTAutograd made of it (``addmm``, ``convolution``)."""
    for module in graph_modules(gm):
        for node in module.graph.nodes:
            if node.op in ("call_function", "call_method"):
                custom = node.meta.get("custom") or {}
                if HOST_OP_KEY not in custom:
                    node.meta["custom"] = {**custom, HOST_OP_KEY: op_name(node)}


def fake_run(node: fx.Node) -> Any:
    """The fake value of a new aten node (inductor reads ``meta["val"]`` of every node)."""
    args, kwargs = torch.utils._pytree.tree_map_only(
        fx.Node, lambda n: n.meta["val"], (node.args, node.kwargs)
    )
    mode = detect_fake_mode(torch.utils._pytree.tree_leaves((args, kwargs)))
    assert mode is not None
    with mode:
        return node.target(*args, **kwargs)  # type: ignore[operator]
