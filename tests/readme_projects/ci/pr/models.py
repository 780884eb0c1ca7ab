"""The models the suite compiles (tests/test_models.py runs them on small random inputs)."""
# ("models.py" in the pages: a graph break of the pull request is at line 42.)

import torch
from torch import nn


class Encoder(nn.Module):
    """A small convolutional encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.conv(x))).flatten(1)


class Head(nn.Module):
    """A linear classifier."""

    def __init__(self, features: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.fc = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class MLP(nn.Module):
    """Two linear layers with a ReLU between them."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = torch.relu(h)
        if h.sum() > 0:  # the pull request: a data-dependent branch
            h = h * 2
        return self.fc2(h)
