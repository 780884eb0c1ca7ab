"""How close the DUT's dynamic int8 result must be to the fp32 eager one.

Dynamic int8 (per-token activations, per-channel weights, symmetric) against fp32. One int8
step is 1/127.5 of a row's range, so each product carries ~0.5% noise; over a few layers the
max error lands at 1e-2 of the output's range on small models (measured: MLP 1.2e-2, Llama
logits 1.4e-2). 5e-2 leaves headroom for seeds, while a real bug (wrong scale, a transposed
or unquantized weight, a lost zero point) is off by O(1). The cosine bound catches a result
that is right in range but wrong in direction.

The backend's tests and pytest-nobreak's ``on_dut`` check both use these bounds. They bound
the quantization, not what a model makes of it: a deep network can amplify per-layer noise past
them (the backend tests' MobileNetV2, 0.47 at worst; docs/dut.md lists it with why).
"""

from __future__ import annotations

import torch

__all__ = ["DYN_INT8_MIN_COSINE", "DYN_INT8_REL_TOL", "cosine", "rel_err"]

DYN_INT8_REL_TOL = 5e-2
DYN_INT8_MIN_COSINE = 0.999


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: one number per comparison, robust to tiny reference values."""
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max())


def cosine(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The cosine similarity of the two results, flattened."""
    return float(
        torch.nn.functional.cosine_similarity(out.float().flatten(), ref.float().flatten(), dim=0)
    )
