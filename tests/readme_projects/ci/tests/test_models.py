import torch
from models import MLP, Encoder, Head


def test_mlp() -> None:
    model = torch.compile(MLP(), backend="eager")
    model(torch.randn(8, 64))


def test_classifier() -> None:
    model = torch.compile(torch.nn.Sequential(Encoder(), Head()), backend="eager")
    model(torch.randn(2, 3, 16, 16))
