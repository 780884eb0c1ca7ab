"""TorchAO: QAT-trained, converted int8 models run on the DUT and match TorchAO's eager output."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from asic_backend import make_backend
from asic_backend.backend import AsicHostWarning
from asic_backend.sim.device import Device
from pytest_nobreak.watch.dynamo import release

from .models import MLP, rel_err

pytest.importorskip("torchao")
from torchao.quantization import (
    Int8DynamicActivationInt8WeightConfig,
    Int8DynamicActivationIntxWeightConfig,
    Int8WeightOnlyConfig,
    MappingType,
    PerAxis,
    PerGroup,
    PerTensor,
    quantize_,
)
from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig

#: The issue's bound. The DUT folds the activation zero point in int32 where TorchAO subtracts
#: it in float, so asymmetric layers differ by float rounding (~1e-7); symmetric ones are exact.
TORCHAO_REL_TOL = 1e-3


def _train(model: nn.Module, steps: int = 5) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = (model(torch.randn(16, 64)) - torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def qat_int8_then_int8_dynamic() -> nn.Module:
    """Custom fake-quant configs (int8 per-token asymmetric act, per-channel symmetric weight),
    QAT, convert, then TorchAO's int8 dynamic PTQ config with asymmetric activations."""
    model = MLP()
    act = IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
    weight = IntxFakeQuantizeConfig(torch.int8, "per_channel", is_symmetric=True)
    quantize_(model, QATConfig(activation_config=act, weight_config=weight, step="prepare"))
    _train(model)
    quantize_(model, QATConfig(step="convert"))
    quantize_(model, Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC))
    return model


def qat_intx_int8_per_axis() -> nn.Module:
    """QAT with ``Int8DynamicActivationIntxWeightConfig(int8, PerAxis(0))`` as the base config."""
    model = MLP()
    base = Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int8, weight_granularity=PerAxis(0)
    )
    quantize_(model, QATConfig(base, step="prepare"))
    _train(model)
    quantize_(model, QATConfig(base, step="convert"))
    return model


def ptq_int8_symmetric() -> nn.Module:
    model = MLP()
    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    return model


def ptq_int8_per_tensor_asymmetric() -> nn.Module:
    model = MLP()
    config = Int8DynamicActivationInt8WeightConfig(
        granularity=PerTensor(), act_mapping_type=MappingType.ASYMMETRIC
    )
    quantize_(model, config)
    return model


@pytest.mark.parametrize(
    "build",
    [
        qat_int8_then_int8_dynamic,
        qat_intx_int8_per_axis,
        ptq_int8_symmetric,
        ptq_int8_per_tensor_asymmetric,
    ],
)
def test_converted_models_run_on_the_dut_and_match_torchao(
    device: Device, build: Callable[[], nn.Module]
) -> None:
    model = build()
    compiled = torch.compile(model, backend="asic", fullgraph=True)
    calls = 3
    with torch.no_grad():
        for _ in range(calls):
            x = torch.randn(2, 8, 64)
            out, ref = compiled(x), model(x)
            assert rel_err(out, ref) < TORCHAO_REL_TOL
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks) == (2 * calls, 0)


def test_symmetric_int8_is_bit_exact_in_bfloat16(device: Device) -> None:
    model = MLP().to(torch.bfloat16)
    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        out = torch.compile(model, backend="asic", fullgraph=True)(x)
        assert torch.equal(out, model(x))
    assert device.snapshot().dut_ops == 2


@pytest.mark.filterwarnings("ignore:Int8Tensor does not implement _stable_hash_for_caching")
def test_inductor_host(device: Device) -> None:
    model = qat_int8_then_int8_dynamic()
    x = torch.randn(8, 64)
    with torch.no_grad():
        out = torch.compile(model, backend=make_backend(host="inductor"), fullgraph=True)(x)
        assert rel_err(out, model(x)) < TORCHAO_REL_TOL
    assert device.snapshot().dut_ops == 2


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (
            Int8DynamicActivationIntxWeightConfig(
                weight_dtype=torch.int4, weight_granularity=PerGroup(32)
            ),
            "groupwise IntxUnpackedToInt8Tensor weights (group size 32)",
        ),
        (Int8WeightOnlyConfig(), "weight-only int8"),
        (
            Int8DynamicActivationIntxWeightConfig(
                weight_dtype=torch.int8,
                weight_granularity=PerAxis(0),
                weight_mapping_type=MappingType.ASYMMETRIC,
            ),
            "asymmetric weights",
        ),
    ],
)
def test_unsupported_weights_fall_back_counted(device: Device, config: object, reason: str) -> None:
    model = MLP()
    quantize_(model, config)
    x = torch.randn(4, 64)
    with torch.no_grad():
        out = torch.compile(model, backend="asic", fullgraph=True)(x)
        torch.testing.assert_close(out, model(x))
    snap = device.snapshot()
    assert (snap.dut_ops, snap.host_fallbacks) == (0, 2)
    (site,) = device.host_fallback_sites  # both linears are on the same line of MLP.forward
    assert site.reason.startswith(reason)


def test_prepared_but_not_converted_is_a_hard_error() -> None:
    model = MLP()
    act = IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
    weight = IntxFakeQuantizeConfig(torch.int8, "per_channel", is_symmetric=True)
    quantize_(model, QATConfig(activation_config=act, weight_config=weight, step="prepare"))
    compiled = torch.compile(model, backend="asic")  # no fullgraph: it must not fall back either
    with torch.no_grad(), pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        compiled(torch.randn(4, 64))
    message = str(info.value)
    assert "prepared for quantization but not converted" in message
    assert 'quantize_(model, QATConfig(step="convert"))' in message
    # The layer the user swapped in; torch 2.12 compiles that layer as a frame of its own,
    # whose graph names only the quantizer inside it.
    expected = "IntxFakeQuantizer" if release() < (2, 13) else "FakeQuantizedLinear"
    assert f"{expected} (QAT fake quantization)" in message


@pytest.mark.usefixtures("fresh_host_warnings")
def test_prepared_model_still_trains_on_the_host(device: Device) -> None:
    model = MLP()
    base = Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int8, weight_granularity=PerAxis(0)
    )
    quantize_(model, QATConfig(base, step="prepare"))
    compiled = torch.compile(model, backend="asic")
    with pytest.warns(AsicHostWarning, match="autograd is live"):
        compiled(torch.randn(4, 64)).sum().backward()
    assert model.fc1.weight.grad is not None
    assert device.snapshot().dut_ops == 0


def test_dynamic_batch_does_not_recompile(device: Device) -> None:
    from torch._dynamo.testing import CompileCounterWithBackend

    model = qat_int8_then_int8_dynamic()
    counter = CompileCounterWithBackend("asic")
    compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for batch in (3, 5, 17):
            x = torch.randn(batch, 64)
            assert rel_err(compiled(x), model(x)) < TORCHAO_REL_TOL
    assert counter.frame_count == 1
    assert device.snapshot().dut_ops == 2 * 3
