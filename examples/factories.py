"""Model factories for ``pytest --nobreak-model examples/factories.py:<factory>``: models checked
with no test code.

A factory returns an ``nn.Module`` (its inputs are inferred from its first layer, or given with
``--nobreak-model-inputs``) or a ``(module, example_inputs)`` pair::

    pytest --nobreak-model examples/factories.py:tiny_cnn --asic-backend
    pytest --nobreak-model examples/factories.py:gated_mlp
"""

from __future__ import annotations

import torch
from torch import nn

from examples.models import MLP, GatedMLP, TinyCNN


def tiny_cnn() -> nn.Module:
    """Compiles whole; every MAC runs on the DUT. Inputs inferred: 2x3x32x32 images."""
    return TinyCNN()


def mlp() -> tuple[nn.Module, torch.Tensor]:
    """A module and its example inputs (a batch of 8 rows)."""
    return MLP(), torch.randn(8, 64)


def gated_mlp() -> nn.Module:
    """Branches on a tensor value: a graph break, which ``compiles_whole`` reports."""
    return GatedMLP()
