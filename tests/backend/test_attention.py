"""Attention, einsum and batched matmuls on the DUT; the variants that cannot go there, counted.

Every test here also runs under the suite-wide MAC accounting check (tests/accounting.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from asic_backend import make_backend
from asic_backend.sim import host_gemm, numerics
from asic_backend.sim.device import Device

from .models import assert_close_to_fp32

B, H, L, S, E = 2, 4, 8, 12, 16
#: One SDPA's MACs at these shapes: QKᵀ and PV for every (batch, head).
SDPA_MACS = B * H * L * S * (E + E)


def _qkv(kv_heads: int = H) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(B, H, L, E), torch.randn(B, kv_heads, S, E), torch.randn(B, kv_heads, S, E)


def _math(fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    with sdpa_kernel(SDPBackend.MATH):
        return fn(*args)


SDPA_CASES: dict[str, Callable[..., torch.Tensor]] = {
    "plain": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    "bool-mask": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.ones(L, S, dtype=torch.bool).tril(diagonal=4)
    ),
    "float-mask-broadcast": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.linspace(-2, 0, S).expand(B, 1, L, S)
    ),
    "scale": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.05),
    "dropout-zero": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.0),
}


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_runs_both_matmuls_on_the_dut(device: Device, case: str) -> None:
    fn, (q, k, v) = SDPA_CASES[case], _qkv()
    with torch.no_grad():
        out = torch.compile(fn, backend="asic", fullgraph=True)(q, k, v)
    assert_close_to_fp32(out, _math(fn, q, k, v))
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks, snap.macs) == (2 * B * H, 0, SDPA_MACS)


def test_causal_and_grouped_query_attention(device: Device) -> None:
    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    q, k, v = torch.randn(B, H, S, E), torch.randn(B, 2, S, E), torch.randn(B, 2, S, E)
    with torch.no_grad():
        out = torch.compile(fn, backend="asic", fullgraph=True)(q, k, v)
    assert_close_to_fp32(out, _math(fn, q, k, v))
    # Key/value heads are shared by 2 query heads each; the work is per query head.
    assert device.snapshot().macs == B * H * S * S * 2 * E


def test_a_fully_masked_row_gives_zeros_as_the_math_path_does(device: Device) -> None:
    mask = torch.ones(L, S, dtype=torch.bool)
    mask[3] = False

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = _qkv()
    with torch.no_grad():
        out = torch.compile(fn, backend="asic", fullgraph=True)(q, k, v)
    assert not out.isnan().any()
    assert torch.equal(out[:, :, 3], torch.zeros_like(out[:, :, 3]))


@pytest.mark.parametrize(
    ("fn", "dtype", "host_ops", "shape", "reason"),
    [
        (
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.25),
            torch.float32,
            2,  # with dropout the host runs the math path: two bmm, QKᵀ then PV
            f"[{B * H}, {L}, {E}] x [{B * H}, {E}, {S}]",
            "attention dropout (dropout_p=0.25) is random and for training",
        ),
        (
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
            torch.float64,
            1,  # one fused attention kernel
            f"q[{B}, {H}, {L}, {E}] k[{B}, {H}, {S}, {E}] v[{B}, {H}, {S}, {E}]",
            "torch.float64 / torch.float64 / torch.float64 query/key/value: the DUT path",
        ),
    ],
    ids=["dropout", "float64"],
)
def test_attention_the_dut_cannot_take_is_a_counted_host_fallback(
    device: Device,
    fn: Callable[..., torch.Tensor],
    dtype: torch.dtype,
    host_ops: int,
    shape: str,
    reason: str,
) -> None:
    q, k, v = (t.to(dtype) for t in _qkv())
    with torch.no_grad():
        torch.compile(fn, backend="asic", fullgraph=True)(q, k, v)
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks, snap.host_macs) == (0, host_ops, SDPA_MACS)
    (stats,) = device.host_fallback_stats  # one site, whatever the host ran it as
    assert stats.site.op == "scaled_dot_product_attention"
    assert stats.site.reason.startswith(reason)
    assert (stats.calls, stats.shape) == (host_ops, shape)


def test_matmul_none_leaves_attention_on_the_host(device: Device) -> None:
    q, k, v = _qkv()
    fn = SDPA_CASES["plain"]
    with torch.no_grad():
        torch.compile(fn, backend=make_backend(matmul="none"))(q, k, v)
    assert (device.snapshot().host_fallbacks, device.snapshot().host_macs) == (1, SDPA_MACS)


EINSUMS = {
    "bij,bjk->bik": ((3, 4, 5), (3, 5, 6)),  # batched matmul
    "bhqd,bhkd->bhqk": ((2, 3, 4, 8), (2, 3, 5, 8)),  # attention scores
    "ij,jk->ik": ((4, 5), (5, 6)),
    "bsd,hd->bsh": ((2, 4, 8), (6, 8)),  # a linear written as einsum
    "i,i->": ((7,), (7,)),  # a dot product
    "bi,bi->b": ((3, 5), (3, 5)),  # a row-wise dot product (a batched GEMV)
}


@pytest.mark.parametrize("equation", list(EINSUMS))
def test_einsum_contractions_run_on_the_dut(device: Device, equation: str) -> None:
    a, b = (torch.randn(*shape) for shape in EINSUMS[equation])

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.einsum(equation, a, b)

    with torch.no_grad():
        out = torch.compile(fn, backend="asic", fullgraph=True)(a, b)
    assert_close_to_fp32(out, fn(a, b))
    snap = device.snapshot()
    assert snap.dut_ops >= 1
    assert (snap.host_fallbacks, snap.host_macs) == (0, 0)


def test_a_three_operand_einsum_runs_every_contraction_on_the_dut(device: Device) -> None:
    a, b, c = torch.randn(4, 5), torch.randn(5, 6), torch.randn(6, 3)

    def fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return torch.einsum("ij,jk,kl->il", a, b, c)

    with torch.no_grad():
        out = torch.compile(fn, backend="asic", fullgraph=True)(a, b, c)
    assert_close_to_fp32(out, fn(a, b, c))
    assert (device.snapshot().dut_ops, device.snapshot().host_fallbacks) == (2, 0)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, a, b: torch.baddbmm(x, a, b),
        lambda x, a, b: torch.baddbmm(x, a, b, beta=0.5, alpha=2.0),
        lambda x, a, b: x.baddbmm(a, b, beta=0.0),
        lambda x, a, b: torch.addbmm(x[0], a, b, alpha=-1.0),
        lambda x, a, b: torch.addmm(x[0], a[0], b[0], beta=2.0),
    ],
    ids=["baddbmm", "baddbmm-scaled", "baddbmm-beta0-method", "addbmm", "addmm-scaled"],
)
def test_batched_and_scaled_matmuls_run_on_the_dut(
    device: Device, fn: Callable[..., torch.Tensor]
) -> None:
    x, a, b = torch.randn(3, 5, 7), torch.randn(3, 5, 6), torch.randn(3, 6, 7)
    with torch.no_grad():
        out = torch.compile(fn, backend="asic", fullgraph=True)(x, a, b)
    assert_close_to_fp32(out, fn(x, a, b))
    snap = device.snapshot()
    assert snap.dut_ops >= 1
    assert (snap.host_fallbacks, snap.host_macs) == (0, 0)


def test_beta_zero_ignores_a_nan_input_as_pytorch_does(device: Device) -> None:
    def fn(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(x, a, b, beta=0.0)

    x, a, b = torch.full((2, 3, 4), float("nan")), torch.randn(2, 3, 5), torch.randn(2, 5, 4)
    with torch.no_grad():
        out = torch.compile(fn, backend="asic", fullgraph=True)(x, a, b)
    assert not out.isnan().any()


# -- large scores: a chunk of heads at a time ---------------------------------------------------


def _hf_layout(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[B, H, T, E]`` as a transformers model hands it over: ``[B, T, H, E]`` transposed."""
    b, h, t, e = shape
    return torch.randn(b, t, h, e).to(dtype).transpose(1, 2)


#: (q, k, v, attn_mask, is_causal, scale, enable_gqa) for dyn_sdpa.
CHUNK_CASES: dict[str, Callable[[], tuple[Any, ...]]] = {
    "plain": lambda: (*_qkv(), None, False, None, False),
    "causal": lambda: (*_qkv(), None, True, None, False),
    "bool mask": lambda: (*_qkv(), torch.rand(L, S) > 0.4, False, None, False),
    "float mask per batch": lambda: (*_qkv(), torch.randn(B, 1, L, S), False, 0.3, False),
    "padding mask": lambda: (*_qkv(), torch.rand(B, 1, 1, S) > 0.3, False, None, False),
    "mask per head": lambda: (*_qkv(), torch.randn(1, H, L, S), False, None, False),
    "mask per key": lambda: (*_qkv(), torch.randn(S), False, None, False),
    "fully masked rows": lambda: (
        *_qkv(),
        torch.zeros(B, H, L, S, dtype=torch.bool),
        False,
        None,
        False,
    ),
    "grouped heads": lambda: (*_qkv(kv_heads=H // 2), None, True, None, True),
    "float16": lambda: (*(t.half() for t in _qkv()), None, True, None, False),
    "bfloat16, transformers' layout": lambda: (
        _hf_layout(B, H, L, E, dtype=torch.bfloat16),
        _hf_layout(B, H, S, E, dtype=torch.bfloat16),
        _hf_layout(B, H, S, E, dtype=torch.bfloat16),
        torch.where(torch.rand(B, 1, 1, S) > 0.3, 0.0, -1e4).to(torch.bfloat16),
        False,
        None,
        False,
    ),
}


@pytest.fixture
def attend_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The heads of each call of ``dyn_sdpa``'s ``_attend``: one call a chunk."""
    import asic_backend.ops.attention as attention

    calls: list[int] = []
    attend = attention._attend

    def counted(q: torch.Tensor, *rest: Any) -> torch.Tensor:
        calls.append(q.shape[0])
        return attend(q, *rest)

    monkeypatch.setattr(attention, "_attend", counted)
    return calls


@pytest.mark.parametrize("kernel", host_gemm.available_kernels())
@pytest.mark.parametrize("case", list(CHUNK_CASES))
def test_large_scores_go_by_chunks_of_heads_with_the_same_values_and_counts(
    monkeypatch: pytest.MonkeyPatch,
    device: Device,
    attend_calls: list[int],
    case: str,
    kernel: str,
) -> None:
    """Every step is per head, so chunks give the bits, the dtype, the layout and the device
    figures of one pass."""
    import asic_backend.ops.attention as attention

    args = CHUNK_CASES[case]()
    q = args[0]
    runs = []
    with host_gemm.forced(kernel):
        for min_bytes in (1 << 60, 1):  # whole, then by chunks of 3 heads of 8×12
            monkeypatch.setattr(numerics, "CHUNKED_MIN_BYTES", min_bytes)
            monkeypatch.setattr(attention, "SCORES_CHUNK_BYTES", 3 * 4 * L * S)
            device.reset()
            out = torch.ops.asic.dyn_sdpa(*args, "default")
            snap = device.snapshot()
            runs.append((out, (snap.dut_ops, snap.macs, snap.cycles, snap.bytes_moved)))
    (whole, whole_figures), (chunked, chunked_figures) = runs
    calls = attend_calls
    assert calls[0] == B  # the whole batch: [B, H, L, E] in one call
    assert calls[1:] == [3, 3, 2]  # B·H = 8 heads by 3
    assert torch.equal(chunked, whole)
    assert chunked_figures == whole_figures
    assert chunked.shape == (B, H, L, E)
    assert chunked.dtype == q.dtype
    assert chunked.stride() == whole.stride() == q.stride()  # q's layout, as eager's kernel
    if case == "fully masked rows":
        assert torch.equal(chunked, torch.zeros_like(chunked))


def test_a_chunk_gathers_only_the_masks_its_heads_take() -> None:
    """A padding mask ``[B, 1, 1, S]`` is B rows, gathered a chunk's heads at a time, never
    broadcast to ``[B, H, L, S]`` whole."""
    from asic_backend.ops.attention import _MaskRows

    mask = torch.rand(B, 1, 1, S) > 0.3
    rows = _MaskRows.of(mask, torch.Size((B, H)))
    assert rows.rows.shape == (B, 1, S)
    assert rows.index is not None
    assert rows.index.tolist() == [0] * H + [1] * H
    assert torch.equal(rows.of_heads(H - 1, H + 1), mask[:, 0])
    shared = _MaskRows.of(torch.randn(L, S), torch.Size((B, H)))
    assert shared.index is None
    assert shared.of_heads(2, 5).shape == (1, L, S)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize(
    ("q_shape", "mask_shape"), [((H, L, E), (1, H, L, S)), ((1, H, L, E), (B, H, L, S))]
)
def test_a_mask_that_widens_the_batch_is_refused_as_eager_refuses_it(
    monkeypatch: pytest.MonkeyPatch,
    chunked: bool,
    q_shape: tuple[int, ...],
    mask_shape: tuple[int, ...],
) -> None:
    from asic_backend.sim import numerics

    monkeypatch.setattr(numerics, "CHUNKED_MIN_BYTES", 1 if chunked else 1 << 60)
    q = torch.randn(q_shape)
    k = v = torch.randn(*q_shape[:-2], S, E)
    mask = torch.randn(mask_shape)
    with pytest.raises(RuntimeError, match="output with shape"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    weights = (*q_shape[:-2], L, S)
    with pytest.raises(
        RuntimeError,
        match=re.escape(f"does not broadcast to the attention weights' shape {weights}"),
    ):
        torch.ops.asic.dyn_sdpa(q, k, v, mask, False, None, False, "default")


def test_the_fake_kernel_refuses_a_mask_of_more_dims_than_q() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = k = v = torch.empty(H, L, E)
        mask = torch.empty(1, H, L, L)
        with pytest.raises(RuntimeError, match="has more dims than q"):
            torch.ops.asic.dyn_sdpa(q, k, v, mask, False, None, False, "default")


def test_chunks_of_heads_take_three_dim_inputs_and_keys_of_other_batch_dims_go_whole(
    monkeypatch: pytest.MonkeyPatch, attend_calls: list[int]
) -> None:
    """``[heads, L, E]`` goes by chunks; keys whose batch dims differ from q's (broadcast) take
    the one-pass path."""
    import asic_backend.ops.attention as attention
    from asic_backend.sim import numerics

    monkeypatch.setattr(numerics, "CHUNKED_MIN_BYTES", 1)
    monkeypatch.setattr(attention, "SCORES_CHUNK_BYTES", 4 * L * S)  # a head a chunk
    q, k, v = torch.randn(H, L, E), torch.randn(H, S, E), torch.randn(H, S, E)
    mask = torch.randn(L, S)
    with sdpa_kernel(SDPBackend.MATH):
        for args in ((None,), (mask,)):
            out = torch.ops.asic.dyn_sdpa(q, k, v, *args, False, None, False, "default")
            assert_close_to_fp32(out, F.scaled_dot_product_attention(q, k, v, attn_mask=args[0]))
        assert attend_calls == [1] * (2 * H)
        k1, v1 = torch.randn(1, S, E), torch.randn(1, S, E)
        out = torch.ops.asic.dyn_sdpa(q, k1, v1, None, False, None, False, "default")
        assert_close_to_fp32(out, F.scaled_dot_product_attention(q, k1, v1))
        assert attend_calls[2 * H :] == [H]
