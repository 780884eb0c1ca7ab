import pytest
import torch
from models import MLP, Head


def test_wide_mlp() -> None:
    torch.compile(MLP(128), backend="eager")(torch.randn(4, 128))


def test_head_batch() -> None:
    torch.compile(Head(), backend="eager")(torch.randn(16, 8))


@pytest.mark.xfail(raises=ValueError, reason="stops half-way, after its compiled call")
def test_half_way() -> None:
    torch.compile(Head(), backend="eager")(torch.randn(2, 8))
    raise ValueError("the test's own error")
