"""The rules that shrink a ``transformers`` config (``pytest_nobreak.models.hf.shrinking``), on
config dicts, and the architectures each rule brought into the zoo, built and run eagerly.

Each dict test holds one rule: the per-layer lists and layer indices that follow a cut in
depth, the multimodal rotary sections that follow the head, a Mamba-2 mixer's heads, the
proportional fallback's widths, the shallow fallback's untouched widths, and the sizes a
config leaves unset.
"""

from __future__ import annotations

import pytest

from pytest_nobreak.models.hf.heads import SSM_HEADS
from pytest_nobreak.models.hf.shrinking import (
    first_layers,
    proportional,
    shallow,
    shrink,
    whole_backbone,
)
from pytest_nobreak.models.hf.sizes import HIDDEN, SLIDING_WINDOW, VOCAB

LLAMA_LIKE = {
    "model_type": "toy",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 11008,
    "vocab_size": 32000,
}


def test_a_hybrid_keeps_one_layer_of_each_kind_and_its_per_layer_entries() -> None:
    kinds = ["linear_attention"] * 3 + ["full_attention"]
    values = {
        **LLAMA_LIKE,
        "num_hidden_layers": 8,
        "layer_types": kinds * 2,
        "mlp_types": ["dense", "dense", "moe", "moe", "moe", "moe", "moe", "moe"],
        "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0],  # flags, not layer indices
        "moe_layers": [2, 3, 4, 5, 6, 7],  # layer indices
        "kv_source_layers": [0, 1, 2, 3, 4, 5, 3, 7],  # layer 6 reads layer 3's keys
    }
    out = shrink(values)
    # Layers 0 and 3: the first of each kind, in order; the depth is theirs.
    assert out["num_hidden_layers"] == 2
    assert out["layer_types"] == ["linear_attention", "full_attention"]
    assert out["mlp_types"] == ["dense", "moe"]
    assert out["no_rope_layers"] == [1, 0]
    assert out["moe_layers"] == [1]  # layer 3 is now layer 1; the others are gone
    assert out["kv_source_layers"] == [0, 1]


def test_first_layers_keeps_the_first_layers_whatever_their_kinds() -> None:
    values = {
        **LLAMA_LIKE,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["indexed_attention"],
    }
    assert first_layers(values)["layer_types"] == ["linear_attention"] * 2


def test_layer_indices_of_a_model_whose_kinds_fit_point_at_the_kept_layers() -> None:
    values = {**LLAMA_LIKE, "num_hidden_layers": 30, "index_layers": [4, 14, 19, 29]}
    # No kept layer is indexed: the list points at the nearest one instead of none.
    assert shrink(values)["index_layers"] == [1]


def test_multimodal_rotary_sections_keep_summing_to_half_the_head() -> None:
    values = {
        **LLAMA_LIKE,
        "num_hidden_layers": 4,
        "rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 24]},
    }
    out = shrink(values)
    head = out["hidden_size"] // out["num_attention_heads"]
    sections = out["rope_parameters"]["mrope_section"]
    assert sum(sections) == head // 2
    assert sections == [2, 3, 3]
    assert out["rope_parameters"]["rope_type"] == "default"


@pytest.mark.parametrize(
    ("heads", "width", "expand"),
    [
        ("mamba_n_heads", "mamba_d_head", "mamba_expand"),  # Bamba, GraniteMoeHybrid
        ("num_heads", "head_dim", "expand"),  # Mamba-2
    ],
)
def test_a_mamba2_mixers_heads_times_their_width_stays_the_expanded_hidden_size(
    heads: str, width: str, expand: str
) -> None:
    values = {**LLAMA_LIKE, "num_hidden_layers": 4, heads: 128, width: 64, expand: 2}
    values["n_groups"] = 8
    out = shrink(values)
    assert out[heads] <= SSM_HEADS
    assert out[heads] * out[width] == out[expand] * out["hidden_size"] == 2 * HIDDEN
    assert out[heads] % out["n_groups"] == 0  # each group of heads shares a state


def test_a_per_head_size_follows_the_head() -> None:
    values = {"model_type": "xlnet", "d_model": 1024, "n_head": 16, "d_head": 64, "n_layer": 24}
    out = shrink(values)
    assert out["d_head"] == out["d_model"] // out["n_head"]


def test_shallow_cuts_depth_vocabulary_and_experts_and_keeps_every_width() -> None:
    values = {**LLAMA_LIKE, "num_hidden_layers": 32, "num_local_experts": 8}
    out = shallow(values)
    assert (out["num_hidden_layers"], out["vocab_size"], out["num_local_experts"]) == (2, VOCAB, 4)
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size"):
        assert out[key] == values[key]


def test_proportional_divides_every_width_alike_and_keeps_counts() -> None:
    values = {
        **LLAMA_LIKE,
        "num_hidden_layers": 32,
        "emb_dim": 4096,
        "entity_vocab_size": 500_000,
        "vision_config": {"model_type": "toy_vision", "hidden_size": 1024, "num_heads": 16},
        "image_size": 224,
        "num_channels": 3,
    }
    out = proportional(values)
    # Heads of 128 dims keep 16: 4096 / 8.
    assert out["hidden_size"] == out["emb_dim"] == 512
    assert out["intermediate_size"] == 11008 // 8
    assert out["vision_config"]["hidden_size"] == 128
    assert (out["num_attention_heads"], out["vision_config"]["num_heads"]) == (32, 16)
    assert (out["image_size"], out["num_channels"]) == (224, 3)
    assert out["vocab_size"] == out["entity_vocab_size"] == VOCAB
    assert out["num_hidden_layers"] == 2


@pytest.mark.parametrize(
    "spec",
    [
        "hf:qwen2_vl_text",  # rotary sections its modeling file holds, not its config
        "hf:olmo_hybrid",  # a validator asking for an attention layer among the kept ones
        "hf:bamba",  # Mamba-2 heads
        "hf:mamba2",  # Mamba-2 heads in groups
        "hf:xlnet",  # d_head
        "hf:dots3_note_text",  # only its first layers build
        "hf:glm4v_text",  # rotary sections in a config
        "hf:hy_v4_vl_text",  # rotary sections of the rope part of a latent-attention head
        "hf:detr",  # a timm backbone built from transformers
        "hf:dory",  # sections of the depth
        "hf:rt_detr",  # a backbone that keeps its stages
        "hf:mimi",  # a codec
        "hf:molmo2",  # an adapter's indices into the vision tower's layers
        "hf:cohere_compass_text",  # rotary parameters per kind of layer, unset by default
        "hf:step3p7",  # a sliding window its layer types do not name
    ],
)
def test_architectures_the_rules_bring_in_build_and_run(spec: str) -> None:
    pytest.importorskip("transformers")
    from pytest_nobreak.models.build import build
    from pytest_nobreak.models.spec import parse_spec

    built = build(parse_spec(spec), None, ())
    assert built.reference.numel() > 0


def test_sections_of_the_depth_keep_one_layer_each() -> None:
    values = {
        **LLAMA_LIKE,
        "num_hidden_layers": 72,
        "n_input_layers": 16,
        "n_recurrent_layers": 40,
        "n_output_layers": 16,
        "layer_types": ["attention"] * 72,
    }
    out = shrink(values)
    assert out["num_hidden_layers"] == 3
    assert (out["n_input_layers"], out["n_recurrent_layers"], out["n_output_layers"]) == (1, 1, 1)
    assert len(out["layer_types"]) == 3


def test_a_size_given_per_layer_is_shrunk_per_layer() -> None:
    values = {**LLAMA_LIKE, "num_hidden_layers": 35, "intermediate_size": [16384] * 35}
    assert shrink(values)["intermediate_size"] == [128, 128]


def test_a_size_tied_to_another_sub_configs_width_follows_it() -> None:
    values = {
        "model_type": "toy_multimodal",
        "text_config": {**LLAMA_LIKE, "num_hidden_layers": 4},
        "audio_config": {"model_type": "toy_audio", "hidden_size": 1024, "out_hidden_size": 4096},
        "head_config": {"model_type": "toy_head", "audio_hidden_size": 1024},
    }
    out = shrink(values)
    assert out["audio_config"]["out_hidden_size"] == out["text_config"]["hidden_size"] == HIDDEN
    assert out["head_config"]["audio_hidden_size"] == out["audio_config"]["hidden_size"]


def test_shallow_keeps_every_stage_of_a_staged_backbone() -> None:
    values = {"model_type": "swin", "embed_dim": 128, "depths": [2, 2, 18, 2], "num_layers": 4}
    values["out_features"] = ["stage1", "stage2", "stage3", "stage4"]
    out = shallow(values)
    assert (out["depths"], out["num_layers"]) == ([1, 1, 1, 1], 4)
    assert out["out_features"] == values["out_features"]


def test_a_detectors_backbone_keeps_its_stages_and_the_neck_follows_the_width() -> None:
    values = {
        "model_type": "toy_detr",
        "d_model": 256,
        "encoder_hidden_dim": 256,
        "decoder_in_channels": [256, 256, 256],
        "encoder_in_channels": [512, 1024, 2048],
        "backbone_config": {
            "model_type": "resnet",
            "hidden_sizes": [256, 512, 1024, 2048],
            "depths": [3, 4, 6, 3],
            "out_indices": [2, 3, 4],
        },
    }
    out = whole_backbone(values)
    assert out["backbone_config"]["depths"] == [1, 1, 1, 1]
    assert out["backbone_config"]["out_indices"] == [2, 3, 4]
    assert out["encoder_in_channels"] == values["encoder_in_channels"]
    assert out["decoder_in_channels"] == [out["d_model"]] * 3 == [HIDDEN] * 3
    # shrink cuts the backbone to two stages.
    assert shrink(values)["backbone_config"]["depths"] == [1, 1]


def test_ratios_between_stages_follow_the_stages_kept_and_other_lists_do_not() -> None:
    values = {
        "model_type": "toy_codec",
        "depths": [3, 3, 3, 3, 3, 3, 8],
        "downsampling_ratios": [2, 2, 4, 5, 5, 8],
        "stem_channels": [3, 32, 48, 64, 80, 96],
    }
    out = shrink(values)
    assert (out["depths"], out["downsampling_ratios"]) == ([1, 1], [2])
    assert out["stem_channels"] == values["stem_channels"]


def test_an_efficientnet_is_shrunk_to_its_b0_with_the_head_width_that_goes_with_it() -> None:
    values = {
        "model_type": "efficientnet",
        "width_coefficient": 2.0,
        "depth_coefficient": 3.1,
        "hidden_dim": 2560,
        "num_block_repeats": [1, 2, 2, 3, 3, 4, 1],
    }
    out = shrink(values)
    assert (out["width_coefficient"], out["depth_coefficient"], out["hidden_dim"]) == (1, 1, 1280)
    assert out["num_block_repeats"] == [1] * 7


def test_a_codecs_first_channels_are_shrunk() -> None:
    values = {"model_type": "mimi", "num_filters": 64, "upsampling_ratios": [8, 6, 5, 4]}
    assert shrink(values)["num_filters"] == 16


def test_indices_into_the_vision_towers_layers_point_at_the_layers_kept() -> None:
    values = {
        "model_type": "toy_vlm",
        "vision_config": {"model_type": "toy_vit", "num_hidden_layers": 27},
        "adapter_config": {"model_type": "toy_adapter", "vision_feature_layer": [24, 18]},
        "vision_feature_layer": -2,  # still inside the kept depth: left as it is
    }
    for out in (shrink(values), shallow(values)):
        assert out["vision_config"]["num_hidden_layers"] == 2
        assert out["adapter_config"]["vision_feature_layer"] == [1, 0]  # the deepest last
        assert out["vision_feature_layer"] == -2


def test_rotary_parameters_left_empty_are_given_per_kind_of_layer() -> None:
    values = {
        **LLAMA_LIKE,
        "num_hidden_layers": 4,
        "layer_types": ["full_attention", "sliding_attention"] * 2,
        "rope_parameters": {},
        "sliding_window": None,
    }
    out = shrink(values)
    assert set(out["rope_parameters"]) == {"full_attention", "sliding_attention"}
    assert out["rope_parameters"]["full_attention"]["rope_type"] == "default"
    assert out["sliding_window"] == SLIDING_WINDOW
    assert shrink({**values, "rope_parameters": {"rope_theta": 1e4}})["rope_parameters"] == {
        "rope_theta": 1e4
    }


def test_a_sliding_window_is_set_when_sliding_heads_are_configured() -> None:
    values = {**LLAMA_LIKE, "sliding_window": None, "num_sliding_attention_heads": 64}
    assert shrink(values)["sliding_window"] == SLIDING_WINDOW
    assert shrink({**values, "num_sliding_attention_heads": 0})["sliding_window"] is None
