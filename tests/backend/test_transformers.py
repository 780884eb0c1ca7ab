"""Real architectures from ``transformers`` configs (random weights, no downloads) on the DUT."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from asic_backend.device import Device

from .models import assert_close_to_fp32

transformers = pytest.importorskip("transformers")


def _bert(attn: str) -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        attn_implementation=attn,
    )
    return transformers.BertModel(config)


def _llama(attn: str) -> nn.Module:
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


def _hidden(out: Any) -> torch.Tensor:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits


@pytest.mark.parametrize(
    ("build", "attn", "activation_matmuls"),
    [
        # sdpa: attention stays one host op; eager: its two matmuls per layer go to the DUT.
        (_bert, "sdpa", 0),
        # layers x (QK^T, AV) x one GEMM per (batch 2 x heads 4; repeat_kv expands the kv-heads)
        (_llama, "eager", 2 * 2 * 8),
    ],
    ids=["bert-sdpa", "llama-eager"],
)
def test_every_linear_runs_on_the_dut(
    device: Device, build: Callable[[str], nn.Module], attn: str, activation_matmuls: int
) -> None:
    model = build(attn).eval()
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    ids = torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        ref = _hidden(model(input_ids=ids, use_cache=False))
        with torch._dynamo.error_on_graph_break(True):
            out = _hidden(torch.compile(model, backend="asic")(input_ids=ids, use_cache=False))
    assert_close_to_fp32(out, ref)
    assert counters["frames"]["total"] == counters["frames"]["ok"] > 0
    snap = device.snapshot()
    assert snap.host_fallbacks == 0
    assert snap.dut_ops >= linears
    assert snap.dut_ops == linears + activation_matmuls
