"""A ``torch.export`` program on the DUT: what the device toolchain would be handed, run.

>>> ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("batch")},))
>>> dut = lower_exported(ep, device="gemmini")
>>> with torch.no_grad():
...     y = dut(x)          # every MAC on the DUT, or a counted host fallback

The program's module (``ep.module()``, whose graph is the exported ATen graph) is traced once
more by Dynamo, whole (``fullgraph=True``), and goes through the backend's own pipeline: the
lowering of every linear, matmul, convolution and attention to ``asic::`` ops, AOTAutograd,
the aten passes and the host accounting. So an exported program runs its MACs on the DUT with
the accounting, cycles and numerics of ``torch.compile(model, backend="asic")`` on the same
model (the tests hold both to the same DUT ops, MACs and cycles). Its ``torch.autocast`` and
``torch.no_grad`` blocks, which export makes subgraphs, are first opened up as Dynamo opens
them in a compiled model (:mod:`~asic_backend.lower.blocks`). Its dynamic dimensions stay
dynamic: a second size within the program's range compiles once more, never fails.
"""

from __future__ import annotations

from typing import Any

import torch

from asic_backend.backend import make_backend
from asic_backend.lower.blocks import open_blocks
from asic_backend.sim.config import AsicConfig

__all__ = ["lower_exported"]


def lower_exported(
    program: Any,
    *,
    device: AsicConfig | str | None = None,
    quantize: str = "dynamic",
    matmul: str | None = None,
    host: str = "aten",
) -> torch.nn.Module:
    """The exported ``program`` as a callable module whose MACs run on the simulated DUT.

    ``device``, ``quantize``, ``matmul`` and ``host`` are :func:`~asic_backend.make_backend`'s
    (``device=None``: ``$ASIC_BACKEND_CONFIG``, else the default preset). TorchAO- and
    PT2E-converted programs lower as their models do under ``torch.compile``. The DUT is
    inference-only: call the module under ``torch.no_grad()`` (with autograd live every
    matmul-class op is a counted host fallback).

    Raises ``TypeError`` for anything but an ``ExportedProgram``, ``ValueError`` for a bad
    option (as ``make_backend`` does).
    """
    if not isinstance(program, torch.export.ExportedProgram):
        raise TypeError(
            f"lower_exported: program must be a torch.export.ExportedProgram, not "
            f"{type(program).__name__} (export the model first: torch.export.export(model, args))"
        )
    backend = make_backend(config=device, quantize=quantize, matmul=matmul, host=host)
    module = program.module()
    # Before Dynamo: it cannot trace an autocast body that uses a dynamic size.
    open_blocks(module)
    compiled: torch.nn.Module = torch.compile(module, backend=backend, fullgraph=True)  # type: ignore[assignment]
    return compiled
