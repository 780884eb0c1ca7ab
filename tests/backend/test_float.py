"""Float models: linears and matmuls become dynamic int8 on the DUT (or stay, when told to)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from asic_backend import make_backend
from asic_backend.sim.device import Device

from .models import MLP, assert_close_to_fp32


def _run(
    model: Callable[..., torch.Tensor], x: torch.Tensor, backend: str | Callable[..., Any] = "asic"
) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend=backend, fullgraph=True)(x)
    return out, ref


@pytest.mark.parametrize("shape", [(8, 64), (2, 8, 64)])
def test_float_mlp_runs_on_the_dut(device: Device, shape: tuple[int, ...]) -> None:
    out, ref = _run(MLP(), torch.randn(*shape))
    assert_close_to_fp32(out, ref)
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks) == (2, 0)
    assert snap.macs == (8 if len(shape) == 2 else 16) * (64 * 128 + 128 * 32)


def test_gpt2_conv1d_addmm_runs_on_the_dut(device: Device) -> None:
    from transformers.pytorch_utils import Conv1D  # x.view(-1, K) then addmm(b, x, W[K, N])

    model = nn.Sequential(Conv1D(128, 64), nn.GELU(), Conv1D(32, 128))
    out, ref = _run(model, torch.randn(2, 8, 64))
    assert_close_to_fp32(out, ref)
    assert (device.snapshot().dut_ops, device.snapshot().host_fallbacks) == (2, 0)


class _Matmuls(nn.Module):
    """A weight used through matmul / @ / .t(), and activation x activation matmul / bmm."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 32) / 8)
        self.proj = nn.Parameter(torch.randn(32, 64) / 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.matmul(x, self.w) + x @ self.proj.t()  # 2 linear-like
        scores = torch.bmm(h, h.transpose(1, 2))  # activation x activation
        return scores @ h  # activation x activation


def test_matmuls_run_on_the_dut(device: Device) -> None:
    x = torch.randn(2, 8, 64)
    out, ref = _run(_Matmuls(), x)
    assert_close_to_fp32(out, ref)
    # 2 linear-like GEMMs, then 2 batched matmuls of batch 2: one GEMM per batch element.
    assert (device.snapshot().dut_ops, device.snapshot().host_fallbacks) == (2 + 2 * 2, 0)


def test_vector_matmuls(device: Device) -> None:
    class Vec(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(16, 8))

        def forward(self, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return (v @ self.w).sum() + (x @ v[:8].repeat(2)).sum() + (v @ v)

    model, x, v = Vec(), torch.randn(3, 16), torch.randn(16)
    with torch.no_grad():
        ref = model(x, v)
        out = torch.compile(model, backend="asic", fullgraph=True)(x, v)
    assert abs(float(out - ref)) < 5e-2 * float(ref.abs())
    assert device.snapshot().dut_ops == 3


def test_outer_products_run_on_the_dut_exactly(device: Device) -> None:
    # K == 1 (e.g. rotary angles): each operand row holds one value, quantized to exactly ±127,
    # so the DUT's product is the float one up to float32 rounding, where plain int8 rounding
    # would shift every angle by up to 0.4%.
    pos = torch.arange(16.0).reshape(1, 1, 16)
    freq = torch.rand(1, 8, 1) + 0.01
    with torch.no_grad():
        angles = torch.compile(lambda f, p: f @ p, backend="asic", fullgraph=True)(freq, pos)
    torch.testing.assert_close(angles, freq @ pos, rtol=4e-7, atol=0)
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks, snap.macs) == (1, 0, 8 * 16)


#: _Matmuls's MACs on a [2, 8, 64] input: two linear-like GEMMs (16 tokens, 64 -> 32), then
#: bmm(h, hᵀ) ([8, 32] x [32, 8]) and scores @ h ([8, 8] x [8, 32]) per batch element.
_LINEAR_MACS = 2 * 16 * 64 * 32
_ACTIVATION_MACS = 2 * (8 * 32 * 8 + 8 * 8 * 32)


def test_quantize_none_leaves_float_matmuls_on_the_host_counted(device: Device) -> None:
    out, ref = _run(_Matmuls(), torch.randn(2, 8, 64), make_backend(quantize="none"))
    torch.testing.assert_close(out, ref)
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks) == (0, 4)
    assert (snap.macs, snap.host_macs) == (0, _LINEAR_MACS + _ACTIVATION_MACS)
    reasons = {site.reason for site in device.host_fallback_sites}
    assert reasons == {
        "quantize='none': float linears stay on the host",
        "matmul='none': activation x activation matmuls stay on the host",
    }


def test_matmul_none_keeps_only_activation_matmuls_on_the_host(device: Device) -> None:
    out, ref = _run(_Matmuls(), torch.randn(2, 8, 64), make_backend(matmul="none"))
    assert_close_to_fp32(out, ref)
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks) == (2, 2)
    assert (snap.macs, snap.host_macs) == (_LINEAR_MACS, _ACTIVATION_MACS)


def test_float64_linear_falls_back_counted_with_its_site(device: Device) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 8).double()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)  # the site

    model, x = Net(), torch.randn(4, 16, dtype=torch.float64)
    compiled = torch.compile(model, backend="asic", fullgraph=True)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(compiled(x), model(x))
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks) == (0, 3)
    (site,) = device.host_fallback_sites
    lines, first = inspect.getsourcelines(Net)
    marker = next(i for i, text in enumerate(lines) if text.strip().endswith("# the site"))
    assert site.op == "linear"
    assert "float64" in site.reason
    assert (site.file, site.line) == (__file__, first + marker)
    assert site.source == "return self.fc(x)  # the site"


def test_transposed_weights_are_quantized_as_the_parameter(device: Device) -> None:
    class Views(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(32, 64) / 8)  # [N, K]
            self.v = nn.Parameter(torch.randn(64, 32) / 8)  # [K, N]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (
                x @ self.w.T
                + x @ self.w.mT
                + x @ self.w.permute(1, 0)
                + x @ torch.transpose(self.w, 0, 1)
                + x @ self.w.transpose(-1, -2)
                + x @ self.v.permute(0, 1)  # the identity permutation
            )

    lowered: list[torch.fx.GraphModule] = []

    def spy(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        compiled = make_backend()(gm, example_inputs)
        lowered.append(gm)  # lowered in place
        return compiled

    out, ref = _run(Views(), torch.randn(4, 64), spy)
    assert_close_to_fp32(out, ref)
    (gm,) = lowered
    calls = [n for n in gm.graph.nodes if n.target is torch.ops.asic.dyn_linear.default]
    assert len(calls) == 6
    # Each weight reaches the op as the parameter itself (cached), with its layout flag.
    assert all(n.args[1].op == "placeholder" and n.args[4] is True for n in calls)
    assert [n.args[3] for n in calls] == [False] * 5 + [True]
    assert device.snapshot().dut_ops == 6


@pytest.fixture
def no_mha_fastpath() -> Iterator[None]:
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(enabled)


def test_multihead_attention_runs_on_the_dut(device: Device) -> None:
    # Dynamo keeps F.multi_head_attention_forward as one call: its GEMMs are lowered on the aten
    # graph. need_weights + a mask takes the bmm / baddbmm path (not SDPA).
    mha = nn.MultiheadAttention(64, 4, batch_first=True).eval()
    mask = torch.triu(torch.full((16, 16), float("-inf")), 1)
    x = torch.randn(2, 16, 64)
    out, ref = _run(lambda x: mha(x, x, x, need_weights=True, attn_mask=mask)[0], x)
    assert_close_to_fp32(out, ref)
    # in-proj + out-proj, and QK^T, AV per (batch 2 x heads 4)
    assert (device.snapshot().dut_ops, device.snapshot().host_fallbacks) == (2 + 2 * 8, 0)


@pytest.mark.usefixtures("no_mha_fastpath")
def test_transformer_encoder_runs_on_the_dut(device: Device) -> None:
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    out, ref = _run(encoder, torch.randn(2, 16, 64))
    assert_close_to_fp32(out, ref)
    # Per layer: 4 linears, and the attention (SDPA, need_weights=False) as QKᵀ and PV per
    # (batch 2 x heads 4).
    assert (device.snapshot().dut_ops, device.snapshot().host_fallbacks) == (2 * (4 + 2 * 8), 0)


def test_fused_fast_path_is_a_counted_fallback_with_the_fix(device: Device) -> None:
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    out, ref = _run(encoder, torch.randn(2, 16, 64))
    torch.testing.assert_close(out, ref)
    assert (device.snapshot().dut_ops, device.snapshot().host_fallbacks) == (0, 2)
    (site,) = device.host_fallback_sites
    assert "torch.backends.mha.set_fastpath_enabled(False)" in site.reason
