"""Small models and comparison helpers shared by the backend tests."""

from __future__ import annotations

import torch
from torch import nn

# The bounds are the package's, so pytest-nobreak's on_dut check uses the same ones.
from asic_backend.sim.tolerance import DYN_INT8_MIN_COSINE, DYN_INT8_REL_TOL, rel_err

__all__ = ["DYN_INT8_MIN_COSINE", "DYN_INT8_REL_TOL", "MLP", "assert_close_to_fp32", "rel_err"]


class MLP(nn.Module):
    """fc1 -> relu -> fc2: two linears."""

    def __init__(self, d_in: int = 64, d_hidden: int = 128, d_out: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def assert_close_to_fp32(out: torch.Tensor, ref: torch.Tensor) -> None:
    err = rel_err(out, ref)
    cos = float(torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0))
    assert err < DYN_INT8_REL_TOL, f"max error {err:.3e} of the output range"
    assert cos > DYN_INT8_MIN_COSINE, f"cosine similarity {cos:.6f}"
    assert not torch.equal(out, ref), "bit-identical to fp32: the DUT path did not run"
