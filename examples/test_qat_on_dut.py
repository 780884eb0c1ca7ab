"""A TorchAO QAT-trained model, converted to int8, running on the simulated ASIC.

With ``--asic-backend``, ``nobreak_compile`` uses ``backend="asic"``: every linear runs as an
int8 matmul on the DUT, the rest on the host, in one graph. The ``asic`` fixture is this test's
device; the compile report table shows its counters (DUT ops, host fallbacks, cycles).
"""

from __future__ import annotations

import pytest
import torch

from examples.models import MLP

torchao = pytest.importorskip("torchao", reason="pip install 'pytest-nobreak[torchao]'")


def qat_trained_int8_mlp() -> torch.nn.Module:
    from torchao.quantization import (
        Int8DynamicActivationInt8WeightConfig,
        MappingType,
        quantize_,
    )
    from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig

    torch.manual_seed(0)
    model = MLP()
    activations = IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
    weights = IntxFakeQuantizeConfig(torch.int8, "per_channel", is_symmetric=True)
    quantize_(
        model, QATConfig(activation_config=activations, weight_config=weights, step="prepare")
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(5):  # a few steps of quantization-aware training
        x = torch.randn(16, 64)
        loss = (model(x) - x[:, :32]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    quantize_(model, QATConfig(step="convert"))
    quantize_(model, Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC))
    return model.eval()


@pytest.mark.no_graph_break
def test_qat_model_runs_on_the_dut(request, nobreak_compile, asic):  # type: ignore[no-untyped-def]
    if not request.config.getoption("asic_backend"):
        pytest.skip("shows the simulated device: run with --asic-backend")
    model = qat_trained_int8_mlp()
    x = torch.randn(8, 64)
    with torch.no_grad():
        reference = model(x)  # TorchAO's own int8 path, eager
        out = nobreak_compile(model)(x)
    counters = asic.snapshot()
    assert counters.dut_ops == 2  # both linears ran on the DUT
    assert counters.host_fallbacks == 0
    assert counters.cycles > 0
    torch.testing.assert_close(out, reference, rtol=1e-3, atol=1e-3)
