"""The output a generated model check compares (``pytest_nobreak.models.build.first_tensor``)."""

from __future__ import annotations

import pytest
import torch

from pytest_nobreak.models.build import first_tensor


def test_the_first_floating_tensor_of_a_nested_output_is_compared() -> None:
    codes, logits = torch.tensor([[1, 2]]), torch.randn(1, 2)
    assert first_tensor({"codes": (codes,), "logits": logits}) is logits


def test_an_output_without_floats_is_compared_by_its_first_tensor_as_floats() -> None:
    codes = torch.tensor([[1, 2]])
    out = first_tensor({"codes": codes, "mask": torch.ones(1, 2, dtype=torch.bool)})
    assert out.dtype == torch.float32
    assert torch.equal(out, codes.float())


def test_an_output_without_tensors_is_an_error() -> None:
    with pytest.raises(TypeError, match="no tensor in the model's output"):
        first_tensor({"n": 3})
