import torch
from models import Head


def test_head() -> None:
    torch.compile(Head(), backend="eager")(torch.randn(2, 8))
