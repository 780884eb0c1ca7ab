"""Small models for the example suite: ones that compile whole and run on the DUT, and ones
that do not."""

from __future__ import annotations

import torch
from torch import nn
from torch._dynamo.backends.common import aot_autograd


class MLP(nn.Module):
    """Compiles to one graph; under --asic-backend both linears run on the simulated DUT."""

    def __init__(self, d_in: int = 64, d_hidden: int = 128, d_out: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class TinyCNN(nn.Module):
    """A MobileNet-style block and an attention head: convolutions (dense, depthwise, pointwise),
    attention and a linear, every multiply-accumulate of which runs on the DUT."""

    def __init__(self, channels: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, stride=2, padding=1)
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.pointwise = nn.Conv2d(channels, channels, 1)
        self.attention = nn.MultiheadAttention(channels, 2, batch_first=True)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        h = h + self.pointwise(torch.relu(self.depthwise(h)))
        tokens = h.flatten(2).transpose(1, 2)  # [N, H·W, C]
        tokens, _ = self.attention(tokens, tokens, tokens, need_weights=False)
        return self.head(tokens.mean(dim=1))


class GatedMLP(MLP):
    """A data-dependent branch: Dynamo splits the graph at the `if`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if h.mean() > 0.5:
            h = h * 0.5
        return self.fc2(h)


def dut_matmul_sync(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The seed's device call: reads a scalar to pick the int8 scale."""
    scale = a.abs().max().item() / 127 or 1.0
    return torch.round(a / scale) @ w.t() * scale + b


def naive_asic_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
    """The seed's backend: swap every linear for dut_matmul_sync, then run aot_autograd.

    Fake-tensor tracing hits `.item()` (aten._local_scalar_dense), Dynamo prints gb0219 and
    quietly runs the whole forward eagerly, forever. The DUT never runs.
    """
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch._C._nn.linear:
            with gm.graph.inserting_before(node):
                new = gm.graph.call_function(dut_matmul_sync, args=tuple(node.args))
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
    gm.recompile()
    return aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)
