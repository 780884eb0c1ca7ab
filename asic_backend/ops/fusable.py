"""The DUT ops ``host="inductor"`` swaps for their fusable forms before AOTAutograd traces.

A fusable form is CompositeImplicitAutograd: AOTAutograd traces through it (functionalizing its
in-place steps), so the graph holds the activations' quantization and the rescale as aten ops
around one opaque DUT op, and Inductor fuses each side into one kernel with its neighbours. Same
numbers as the whole op. With ``host="aten"`` the ops stay whole: there each aten op of the
quantization would cost a Python dispatch, more than it saves.
"""

from __future__ import annotations

from typing import Any

import torch

import asic_backend.ops.conv
import asic_backend.ops.linear  # noqa: F401  (define the ops below)

__all__ = ["FUSABLE"]

#: Each DUT op with a fusable form, and that form.
FUSABLE: dict[Any, Any] = {
    torch.ops.asic.dyn_linear.default: torch.ops.asic.dyn_linear_fusable.default,
    torch.ops.asic.dyn_conv.default: torch.ops.asic.dyn_conv_fusable.default,
}
