import torch
from models import Head


def test_it() -> None:
    torch.compile(Head(), backend="eager")(torch.randn(2, 8))
