"""What every lowering pass shares: its options, its summary, and :class:`Rewrite`, the graph
edits it makes (put an ``asic::`` op in place of a node; leave a node on the host behind a
counted ``asic::host_fallback`` marker).

>>> rw = Rewrite(gm, LoweringOptions(device="default"))
>>> rw.replace(node, rw.call_before(node, torch.ops.asic.dyn_matmul.default, (a, b, "default")),
...            "matmul -> asic::dyn_matmul")
>>> rw.host(other, x, "float64 operands: the DUT path quantizes float32/bfloat16/float16 only")
>>> rw.summary.dut, rw.summary.host
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
from torch import fx

import asic_backend.quant_ops  # noqa: F401  (defines the asic:: ops the passes emit)
from asic_backend.device import HostFallback
from asic_backend.fx_nodes import op_name, user_frame, where

__all__ = ["POLICIES", "LoweringOptions", "LoweringSummary", "Policy", "Rewrite"]

Policy = Literal["dynamic", "none"]
POLICIES: tuple[str, ...] = ("dynamic", "none")


@dataclasses.dataclass(frozen=True)
class LoweringOptions:
    """What to move onto the DUT ``device`` (a device key).

    ``quantize``: float linears (and linear-like matmuls) as dynamic int8, or ``"none"``;
    ``matmul``: the same for activation x activation matmuls. Quantized TorchAO/PT2E layers go
    to the DUT either way.
    """

    device: str
    quantize: Policy = "dynamic"
    matmul: Policy = "dynamic"


@dataclasses.dataclass
class LoweringSummary:
    """What the passes did: the sites sent to the DUT and those left on the host (with why)."""

    dut: list[str] = dataclasses.field(default_factory=list)
    host: list[HostFallback] = dataclasses.field(default_factory=list)
    #: Opaque calls tagged for :func:`~asic_backend.lower_aten.lower_aten` (their GEMMs appear
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

    def erase(self, node: fx.Node) -> None:
        self.graph.erase_node(node)
        self.erased.add(node)

    def replace(self, old: fx.Node, new: fx.Node, what: str) -> None:
        """Put ``new`` in place of ``old`` (keeping ``old``'s metadata) and count it on the DUT."""
        for key, value in old.meta.items():
            new.meta.setdefault(key, value)
        old.replace_all_uses_with(new)
        self.erase(old)
        self.summary.dut.append(f"{what} at {where(old)}")

    def host(self, node: fx.Node, x: fx.Node, reason: str) -> None:
        """Leave ``node`` on the host, counted at run time through a marker on its input ``x``.

        A marker op rather than a compile-time count: the count then happens on every run, and a
        cached graph carries its site (the user's ``file:line``) in the op's arguments.
        """
        file, line, source = user_frame(node)
        site = HostFallback(op=op_name(node), reason=reason, file=file, line=line, source=source)
        marked = self.call_before(
            node,
            torch.ops.asic.host_fallback.default,
            (x, self.options.device, site.op, site.reason, file, line, source),
        )
        marked.meta.update(x.meta)
        node.replace_input_with(x, marked)
        self.summary.host.append(site)
