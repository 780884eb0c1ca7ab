"""Real architectures from ``transformers`` configs (random weights, no downloads): each compiles
whole with ``backend="asic"`` and runs every multiply-accumulate on the DUT.

For each model: no graph break, no eager frame, no host fallback; the DUT's MACs equal
``FlopCounterMode`` / 2 of the eager call (SDPA on its math path); and the output is within
int8 quantization error of fp32, for the weights and inputs of each of :data:`SEEDS`. That
error is measured as the max difference over the output's range and the cosine similarity, and
bounded by the project's dynamic int8 bound (:mod:`asic_backend.sim.tolerance`): one
dynamically quantized layer is off by ~0.5-1% of its range, while a real bug (a wrong scale, a
transposed weight, a dropped zero-point) is off by O(1) with a cosine far below 0.99.
MobileNetV2 is the one model outside that bound (docs/dut.md says why): its bound is what it
measures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from asic_backend.sim.device import Device
from asic_backend.sim.tolerance import DYN_INT8_MIN_COSINE, DYN_INT8_REL_TOL, cosine, rel_err
from tests.accounting import reference_macs

transformers = pytest.importorskip("transformers")

#: Each model is checked with the weights and inputs of every one of these seeds: one seed's
#: figures say little of a deep model's (MobileNetV2's max error ranges over 0.10-0.47).
SEEDS = tuple(range(8))


@dataclasses.dataclass(frozen=True)
class Case:
    build: Callable[[], nn.Module]
    inputs: Callable[[], dict[str, Any]]
    rel_tol: float = DYN_INT8_REL_TOL  # max |out - ref| / max |ref|
    min_cosine: float = DYN_INT8_MIN_COSINE


def _resnet() -> nn.Module:
    config = transformers.ResNetConfig(
        num_channels=3,
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="bottleneck",
        downsample_in_bottleneck=True,
    )
    return transformers.ResNetModel(config)


def _convnext() -> nn.Module:
    config = transformers.ConvNextConfig(
        num_channels=3, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], patch_size=2
    )
    return transformers.ConvNextModel(config)


def _mobilenet_v2() -> nn.Module:
    config = transformers.MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.25)
    model = transformers.MobileNetV2Model(config)
    # Its default init (normal, std 0.02) shrinks activations to ~1e-26 over 52 convs, which
    # would compare zeros with zeros; He init keeps them O(1).
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    return model


def _whisper_encoder() -> nn.Module:
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = transformers.WhisperConfig(
        num_mel_bins=16,
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=64,
        max_source_positions=16,  # two convs (stride 1, 2): 32 frames in
    )
    return WhisperEncoder(config)


def _vit() -> nn.Module:
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
    )
    return transformers.ViTModel(config)


def _llama(attn: str = "sdpa") -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn,
    )
    return transformers.LlamaForCausalLM(config)


def _bert() -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    return transformers.BertModel(config)


def _pixels() -> dict[str, Any]:
    return {"pixel_values": torch.randn(2, 3, 32, 32)}


def _tokens() -> dict[str, Any]:
    return {"input_ids": torch.randint(0, 100, (2, 16)), "use_cache": False}


CASES: dict[str, Case] = {
    "resnet": Case(_resnet, _pixels),
    "convnext": Case(_convnext, _pixels),
    # Outside the int8 bound, listed in docs/dut.md (issue 24): 52 convolutions, each within
    # 1.4% of its range on its own, depthwise ones no worse, but the random-weight network
    # amplifies that 5-25x on the way out, and no finer int8 scaling brings it within 5e-2.
    # The bound is the worst measured over SEEDS (seed 7: 0.466 of the range, cosine 0.9446),
    # with a little room, not 2x: twice that would be O(1), what a bug looks like.
    "mobilenet_v2": Case(_mobilenet_v2, _pixels, rel_tol=0.5, min_cosine=0.94),
    "whisper_encoder": Case(_whisper_encoder, lambda: {"input_features": torch.randn(2, 16, 32)}),
    "vit": Case(_vit, _pixels),
    "llama": Case(_llama, _tokens),
    "llama-eager-attention": Case(lambda: _llama("eager"), _tokens),
    "bert": Case(_bert, lambda: {"input_ids": torch.randint(0, 100, (2, 16))}),
}


def _output(out: Any) -> torch.Tensor:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits


@pytest.mark.parametrize("name", list(CASES))
def test_every_mac_of_the_model_runs_on_the_dut(device: Device, name: str) -> None:
    case = CASES[name]
    model = case.build().eval()
    compiled = torch.compile(model, backend="asic")
    figures: dict[int, tuple[float, float]] = {}
    for seed in SEEDS:
        torch.manual_seed(seed)
        # Each seed's weights are written into the one model, as loading a checkpoint does:
        # one compile serves every seed, and the DUT must follow the new weights.
        model.load_state_dict(case.build().state_dict())
        inputs = case.inputs()
        device.reset()
        with torch.no_grad():
            ref = _output(model(**inputs))
            with torch._dynamo.error_on_graph_break(True):
                out = _output(compiled(**inputs))
        snap = device.snapshot()
        assert (snap.host_fallbacks, snap.host_macs) == (0, 0), device.host_fallback_stats
        assert snap.dut_ops > 0
        assert snap.macs == reference_macs(model, **inputs)
        assert not torch.equal(out, ref), "bit-identical to fp32: the DUT path did not run"
        figures[seed] = (rel_err(out, ref), cosine(out, ref))
    assert counters["frames"]["total"] == counters["frames"]["ok"] > 0
    off = {
        seed: f"max error {err:.3e} of the output range, cosine {cos:.6f}"
        for seed, (err, cos) in figures.items()
        if not (err < case.rel_tol and cos > case.min_cosine)
    }
    assert not off, f"beyond {case.rel_tol} / cosine {case.min_cosine}: {off}"


def test_depthwise_layers_fill_the_array_poorly(device: Device) -> None:
    # A depthwise conv is one GEMM per channel with K = 9 and a single column: on a 128x128
    # array each uses 9 of 128 rows and 1 of 128 columns.
    model, inputs = CASES["mobilenet_v2"].build().eval(), _pixels()
    with torch.no_grad():
        torch.compile(model, backend="asic", fullgraph=True)(**inputs)
    snap = device.snapshot()
    assert snap.utilization < 0.01
    assert snap.dut_ops > 1000  # one GEMM per depthwise channel
