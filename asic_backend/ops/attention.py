"""``asic::dyn_sdpa``: scaled dot-product attention with its two matmuls on the DUT.

QKᵀ and PV are activation x activation GEMMs, quantized dynamically as ``asic::dyn_matmul``
does (:func:`asic_backend.ops.linear.dut_matmul`: the left operand per row, the right one per
column), one DUT GEMM per batch element and head. Scale, masks and softmax run on the host in
float32, as PyTorch's math path (``_scaled_dot_product_attention_math``) does them: a boolean
mask or ``is_causal`` (top-left aligned) masks with -inf, a float mask is added, rows with
nothing left to attend to come out as zeros (``_safe_softmax``), and grouped key/value heads
(``enable_gqa``) are repeated to the query's heads.

>>> import asic_backend.ops.attention
>>> q = k = v = torch.randn(2, 4, 16, 8)
>>> torch.ops.asic.dyn_sdpa(q, k, v, None, True, None, False, "default").shape
torch.Size([2, 4, 16, 8])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from asic_backend.ops.library import dut_op
from asic_backend.ops.linear import dut_matmul
from asic_backend.sim import numerics

__all__ = ["dyn_sdpa"]

#: Scores past :data:`asic_backend.sim.numerics.CHUNKED_MIN_BYTES` go a chunk of heads of about
#: this many bytes at a time (:func:`dyn_sdpa`). 16 heads of 512×512, one thread, AVX-512 VNNI
#: host: the float32 kernel 23.5 ms whole, 19.6 to 20.3 by 2 or 4 MB (2 threads: 13.9, 11.4);
#: ``int_mm`` 10.9 whole and 10.6 by 4 MB, 11.5 by 2 MB (each chunk's calls cost about 0.2 ms).
SCORES_CHUNK_BYTES = 4 << 20

# A typed handle on an untyped torch helper (mypy --strict).
_check: Callable[[Any, Callable[[], str]], None] = torch._check


@dut_op("asic::dyn_sdpa")
def dyn_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    device: str,
) -> Tensor:
    """``softmax(q·kᵀ·scale + mask)·v`` with both GEMMs on the DUT; see the module doc."""
    length, source = q.shape[-2], k.shape[-2]
    lead = q.shape[:-2]
    if attn_mask is not None:
        _check_mask(attn_mask, (*lead, length, source))
    if enable_gqa and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        repeat = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(repeat, dim=-3)
        v = v.repeat_interleave(repeat, dim=-3)
    alpha = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    chunks = [(0, 1)]
    if q.dim() > 2:
        chunks = numerics.row_spans(lead.numel(), length * source, SCORES_CHUNK_BYTES)
    if len(chunks) == 1 or k.shape[:-2] != lead or v.shape[:-2] != lead:
        out = _attend(q, k, v, attn_mask, is_causal, alpha, device)
        return _laid_out_like(q, out.to(q.dtype))
    # Large scores go a chunk of heads at a time through both GEMMs, the softmax and every host
    # pass between, so that each pass reads what the last left in the caches: every step is per
    # head (its scales are a row's or a column's of one head), so the values are the same.
    heads = lead.numel()
    q3, k3, v3 = (t.reshape(heads, *t.shape[-2:]) for t in (q, k, v))
    masks = None if attn_mask is None else _MaskRows.of(attn_mask, lead)
    out = q.new_empty((heads, length, v.shape[-1]), dtype=torch.float32)
    for lo, hi in chunks:
        mask = None if masks is None else masks.of_heads(lo, hi)
        out[lo:hi] = _attend(q3[lo:hi], k3[lo:hi], v3[lo:hi], mask, is_causal, alpha, device)
    return _laid_out_like(q, out.reshape(*lead, length, v.shape[-1]).to(q.dtype))


def _check_mask(attn_mask: Tensor, weights: tuple[int, ...]) -> None:
    """A mask must broadcast to the attention weights' shape ``[*lead, L, S]``, as PyTorch's
    kernels require (its meta kernel would let one that widens the batch through)."""
    widened = attn_mask.dim() > len(weights) or any(
        m not in (1, w) for m, w in zip(reversed(attn_mask.shape), reversed(weights), strict=False)
    )
    if widened:
        raise RuntimeError(
            f"asic::dyn_sdpa: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast "
            f"to the attention weights' shape {weights}"
        )


@dataclasses.dataclass(frozen=True)
class _MaskRows:
    """A mask's ``[L, S]`` matrices (``rows [R, L or 1, S or 1]``) and which one each head of
    the flattened batch ``[*lead]`` takes (``index [heads]``; None when all take the one), so a
    chunk of heads gathers only its own: a mask broadcast over the batch is never copied whole
    (HF's padding mask ``[B, 1, 1, S]`` would be ``B·H·L·S`` values)."""

    rows: Tensor
    index: Tensor | None

    @classmethod
    def of(cls, attn_mask: Tensor, lead: torch.Size) -> _MaskRows:
        shape = (1,) * (len(lead) + 2 - attn_mask.dim()) + tuple(attn_mask.shape)
        rows = attn_mask.reshape(-1, *shape[-2:])
        if rows.shape[0] == 1:
            return cls(rows, None)
        index = torch.arange(rows.shape[0]).reshape(shape[:-2]).expand(*lead).reshape(-1)
        return cls(rows, index)

    def of_heads(self, lo: int, hi: int) -> Tensor:
        """The masks of heads ``[lo, hi)``: ``[hi - lo or 1, L or 1, S or 1]``."""
        return self.rows if self.index is None else self.rows.index_select(0, self.index[lo:hi])


def _attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    alpha: float,
    device: str,
) -> Tensor:
    """``softmax(q·kᵀ·alpha + mask)·v`` in float32, both GEMMs on the DUT."""
    length, source = q.shape[-2], k.shape[-2]
    scores = dut_matmul(q, k.transpose(-2, -1), device, alpha=alpha)
    if is_causal:
        keep = torch.ones(length, source, dtype=torch.bool, device=q.device).tril()
        scores.masked_fill_(~keep, -math.inf)
    if attn_mask is None:
        # Every row keeps at least one score (causal keeps the diagonal): a plain softmax, in
        # place (torch.softmax's kernel, whose output may be its input: each row is read for its
        # maximum before it is written), as the scores are this op's own.
        probs = torch.ops.aten._softmax.out(scores, -1, False, out=scores)
    else:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, -math.inf)
        else:
            scores = scores + attn_mask.to(torch.float32)
        probs = torch.ops.aten._safe_softmax(scores, -1)
    return dut_matmul(probs, v, device, consume_a=True)


def _laid_out_like(q: Tensor, out: Tensor) -> Tensor:
    """``out`` in the memory layout of ``q``, as PyTorch's CPU attention returns it: a graph
    traced against that op may ``view`` the output through it (torch 2.12's
    ``multi_head_attention_forward`` does, where 2.13 reshapes)."""
    if out.shape != q.shape or q.is_contiguous():
        return out.contiguous()
    return torch.empty_like(q).copy_(out)


@dyn_sdpa.register_fake
def _(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    device: str,
) -> Tensor:
    _check(
        q.shape[-1] == k.shape[-1],
        lambda: f"asic::dyn_sdpa: q and k differ in their last dim: {q.shape} vs {k.shape}",
    )
    _check(
        attn_mask is None or attn_mask.dim() <= q.dim(),
        lambda: (
            f"asic::dyn_sdpa: attn_mask {tuple(attn_mask.shape)} has more dims than q "  # type: ignore[union-attr]
            f"{tuple(q.shape)}"
        ),
    )
    if v.shape[-1] == q.shape[-1]:
        return torch.empty_like(q)  # q's layout, as the kernel returns it
    return q.new_empty((*q.shape[:-1], v.shape[-1]))
