"""PT2E (``convert_pt2e``) models: every quantized linear on the DUT, within 1 LSB of PT2E."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx, nn

from asic_backend.sim.device import Device

from .models import rel_err

pytest.importorskip("torchao")
import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.testing.pt2e._xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)

# The testing copy of XNNPACKQuantizer warns that the real one moved to ExecuTorch.
pytestmark = pytest.mark.filterwarnings("ignore:XNNPACKQuantizer is deprecated:UserWarning")

QUANTIZERS: dict[str, Callable[[], Any]] = {
    "x86_static": lambda: xiq.X86InductorQuantizer().set_global(
        xiq.get_default_x86_inductor_quantization_config()
    ),
    "x86_dynamic": lambda: xiq.X86InductorQuantizer().set_global(
        xiq.get_default_x86_inductor_quantization_config(is_dynamic=True)
    ),
    "xnnpack_static": lambda: XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    ),
    "xnnpack_static_per_tensor": lambda: XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=False)
    ),
    "xnnpack_dynamic": lambda: XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
    ),
}


class Residual(nn.Module):
    """Three linears; ``x``'s dequantize feeds both fc1 and a concat (a multi-user dq)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        return self.fc3(torch.cat([self.fc2(h), x], dim=-1))


class OneLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _convert(model: nn.Module, quantizer: str, x: torch.Tensor) -> fx.GraphModule:
    exported = torch.export.export(model.eval(), (x,)).module()
    prepared = prepare_pt2e(exported, QUANTIZERS[quantizer]())
    for _ in range(4):
        prepared(torch.randn_like(x))
    converted: fx.GraphModule = convert_pt2e(prepared)
    return converted


def _qd_nodes(gm: fx.GraphModule, name: str) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and name in str(n.target)]


def _lsb_bound(gm: fx.GraphModule) -> float:
    """The largest output change that 1-LSB differences in the last linear's int8 input allow.

    The DUT's int8 results may differ from PT2E's float pipeline by 1 LSB (fixed-point vs float
    rounding). Where such an intermediate feeds a float-output linear, the output moves by at most
    ``s_x · max_n Σ_k |W[n, k]|``; where the output is quantized, by one output step.
    """
    last = [n for n in gm.graph.nodes if n.op == "call_function" and "linear" in str(n.target)][-1]
    users = list(last.users)
    quantized_out = _qd_nodes(gm, "quantize_per_tensor")
    if users and "relu" in str(users[0].target):
        users = list(users[0].users)
    if users and users[0] in quantized_out:
        return float(users[0].args[1]) * 1.001
    dq_x, dq_w = last.args[0], last.args[1]
    assert isinstance(dq_x, fx.Node)
    assert isinstance(dq_w, fx.Node)
    weight = torch.ops.quantized_decomposed.dequantize_per_channel(
        *(getattr(gm, str(a.target)) if isinstance(a, fx.Node) else a for a in dq_w.args)
    )
    return float(dq_x.args[1]) * float(weight.abs().sum(dim=1).max())


@pytest.mark.parametrize("quantizer", sorted(QUANTIZERS))
def test_pt2e_models_run_on_the_dut(device: Device, quantizer: str) -> None:
    x = torch.randn(8, 64)
    converted = _convert(Residual(), quantizer, x)
    compiled = torch.compile(converted, backend="asic", fullgraph=True)
    with torch.no_grad():
        out, ref = compiled(x), converted(x)
    if "dynamic" in quantizer:
        # Same host quantization, an exact integer GEMM: only float rounding differs.
        assert rel_err(out, ref) < 1e-5
    else:
        diff = (out - ref).abs()
        assert float(diff.max()) <= _lsb_bound(converted)
        # 1-LSB ties are rare: a systematic error (rounding mode, bias, zero point) is not.
        assert float((diff > 1e-5 * ref.abs().max()).float().mean()) < 0.1
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks) == (3, 0)


@pytest.mark.parametrize("quantizer", ["xnnpack_static", "xnnpack_static_per_tensor"])
def test_fused_relu_and_requant_within_one_lsb(device: Device, quantizer: str) -> None:
    x = torch.randn(32, 64)
    converted = _convert(OneLayer(), quantizer, x)
    (out_q,) = (n for n in _qd_nodes(converted, "quantize_per_tensor") if "relu" in str(n.args[0]))
    lsb = float(out_q.args[1])
    with torch.no_grad():
        out = torch.compile(converted, backend="asic", fullgraph=True)(x)
        ref = converted(x)
    assert float((out - ref).abs().max()) <= lsb * 1.001
    assert float(out.min()) >= 0.0  # the ReLU, folded into the requantization's clamp
    assert device.snapshot().dut_ops == 1


def test_prepared_but_not_converted_pt2e_is_a_hard_error() -> None:
    x = torch.randn(4, 64)
    exported = torch.export.export(OneLayer().eval(), (x,)).module()
    prepared = prepare_pt2e(exported, QUANTIZERS["x86_static"]())
    with torch.no_grad(), pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        torch.compile(prepared, backend="asic")(x)
    assert "run model = convert_pt2e(model)" in str(info.value)


class Fan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 32)
        self.b = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x)
        return self.a(h) + self.b(h)


def test_multi_user_dequantize(device: Device) -> None:
    # convert_pt2e gives each linear its own dequantize; a graph that shares one (as inductor's
    # dequant promotion undoes) must still put both linears on the DUT.
    x = torch.randn(8, 64)
    converted = _convert(Fan(), "x86_static", x)
    first, second = (
        n for n in _qd_nodes(converted, "dequantize_per_tensor") if len(n.args[0].users) == 2
    )
    second.replace_all_uses_with(first)
    converted.graph.erase_node(second)
    converted.recompile()
    assert len(first.users) == 2
    with torch.no_grad():
        out = torch.compile(converted, backend="asic", fullgraph=True)(x)
        ref = converted(x)
    assert rel_err(out, ref) < 1e-5
    assert (device.snapshot().dut_ops, device.snapshot().host_fallbacks) == (2, 0)
