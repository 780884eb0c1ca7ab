"""The inputs ``hf:`` models get beyond token ids, images and audio (models/hf/inputs.py and
its helpers): one architecture per rule, built shrunk as ``--nobreak-model hf:<type>`` builds
it, so each test proves its rule lets the model's eager forward run, on inputs of the shapes
shown, and fails (the build skips) without the rule."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_nobreak.models.spec import parse_spec

pytest.importorskip("transformers")


def built(model_type: str) -> Any:
    """The model as ``--nobreak-model hf:<model_type>`` builds it: its reference forward ran."""
    from pytest_nobreak.models.build import build

    return build(parse_spec(f"hf:{model_type}"), None, ())


def shapes(inputs: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)}


RULES = [
    # Patches: the main input is the forward's first required parameter when it does not take
    # its main_input_name; images are 4x4 grids of patches (twice the merge size), one per item.
    pytest.param(
        "qwen2_5_vl_vision",
        {"hidden_states": (32, 384), "grid_thw": (2, 3)},
        id="packed-patches-first-required-main",
    ),
    pytest.param(
        "kimi_k25_vision",
        {"pixel_values": (32, 3, 8, 8), "grid_thw": (2, 3)},
        id="packed-patches-shaped-for-a-conv",
    ),
    pytest.param(
        "video_llama_3_vision",
        {"pixel_values": (32, 192), "grid_thw": (2, 3), "merge_sizes": (2,)},
        id="merge-sizes",
    ),
    pytest.param(
        "siglip2_vision_model",
        {"pixel_values": (2, 16, 192), "spatial_shapes": (2, 2), "pixel_attention_mask": (2, 16)},
        id="batched-patches",
    ),
    pytest.param(
        "gemma4_vision",
        {"pixel_values": (2, 36, 192), "pixel_position_ids": (2, 36, 2)},
        id="patch-positions-pooled-by-3",
    ),
    pytest.param(
        "minicpm_ocr_vision",
        {"pixel_values": (1, 3, 8, 256), "target_sizes": (2, 2)},
        id="navit-strip",
    ),
    pytest.param(
        "siglip2",
        {
            "input_ids": (2, 16),
            "pixel_values": (2, 16, 192),
            "spatial_shapes": (2, 2),
            "pixel_attention_mask": (2, 16),
            "attention_mask": (2, 16),
        },
        id="patches-beside-text",
    ),
    # Named companions.
    pytest.param(
        "bros",
        {"input_ids": (2, 16), "attention_mask": (2, 16), "bbox": (2, 16, 4)},
        id="bbox",
    ),
    pytest.param(
        "xmod",
        {"input_ids": (2, 16), "attention_mask": (2, 16), "lang_ids": (2,)},
        id="language",
    ),
    pytest.param(
        "videoprism",
        {"pixel_values_videos": (2, 4, 3, 32, 32), "input_ids": (2, 16)},
        id="required-text-beside-video",
    ),
    pytest.param(
        "blip_2_qformer",
        {"query_embeds": (2, 16, 64), "encoder_hidden_states": (2, 16, 1408)},
        id="embeds-and-cross-attention-source",
    ),
    pytest.param(
        "timesfm",
        {"past_values": (2, 512, 1), "past_values_padding": (2, 512), "freq": (2, 1)},
        id="padding-of-an-input-and-frequency",
    ),
    pytest.param(
        "audioflamingo3_encoder",
        {"input_features": (2, 128, 64), "input_features_mask": (2, 64)},
        id="mask-of-channels-first-features",
    ),
    pytest.param(
        "gemma3n_audio",
        {"audio_mel": (2, 64, 128), "audio_mel_mask": (2, 64)},
        id="audio-mel",
    ),
    pytest.param(
        "idefics",
        {
            "input_ids": (2, 16),
            "pixel_values": (2, 2, 3, 32, 32),
            "attention_mask": (2, 16),
            "image_attention_mask": (2, 16, 2),
        },
        id="image-stack-and-its-mask",
    ),
    # Docstring shapes: config sizes, bracketed shapes, len(config.x), zero-size dims.
    pytest.param(
        "decision_transformer",
        {
            "states": (2, 16, 17),
            "actions": (2, 16, 4),
            "rewards": (2, 16, 1),
            "returns_to_go": (2, 16, 1),
            "timesteps": (2, 16),
        },
        id="documented-not-optional",
    ),
    pytest.param("mimi_decoder", {"latents": (2, 64, 16)}, id="documented-main"),
    pytest.param(
        "lxmert",
        {
            "input_ids": (2, 16),
            "attention_mask": (2, 16),
            "visual_feats": (2, 4, 2048),
            "visual_pos": (2, 4, 4),
        },
        id="visual-features",
    ),
    pytest.param(
        "muse_glimmer_assistant",
        {"noise_embeds": (2, 16, 64), "context_hidden_states": (2, 16, 128)},
        id="bracketed-shapes-with-config-lists",
    ),
    pytest.param(
        "time_series_transformer",
        {"past_values": (2, 15), "past_time_features": (2, 15, 0), "past_observed_mask": (2, 15)},
        id="series-with-lags",
    ),
    # Other layouts of the main input.
    pytest.param(
        "qwen3_asr_encoder",
        {"input_features": (2, 128, 100), "input_features_mask": (2, 100)},
        id="whole-chunks-of-frames",
    ),
    pytest.param(
        "fun_asr_nano_encoder",
        {"input_features": (2, 64, 560), "input_features_mask": (2, 64)},
        id="frames-as-wide-as-the-first-layer",
    ),
    pytest.param(
        "audio-spectrogram-transformer", {"input_values": (2, 1024, 128)}, id="spectrogram"
    ),
    pytest.param("muse_spark_audio", {"input_values": (2, 1536)}, id="whole-tokens-of-samples"),
    pytest.param(
        "speecht5",
        {"input_values": (2, 16, 64), "decoder_input_values": (2, 16, 64)},
        id="hidden-states-both-sides",
    ),
    pytest.param("lightglue", {"pixel_values": (2, 2, 3, 32, 32)}, id="image-pair"),
    pytest.param("qwen3_omni_moe_thinker", {"input_ids": (2, 16)}, id="text-without-mask"),
    pytest.param(
        "voxtral", {"input_ids": (2, 16), "attention_mask": (2, 16)}, id="text-alone-first"
    ),
    pytest.param(
        "pe_audio",
        {"input_ids": (2, 16), "input_values": (2, 1, 5120), "attention_mask": (2, 16)},
        id="text-beside-a-waveform",
    ),
    pytest.param(
        "vibevoice_acoustic_tokenizer_encoder",
        {"hidden_states": (2, 1, 5120)},
        id="main-input-named-otherwise",
    ),
    pytest.param(
        "vibevoice_acoustic_tokenizer_decoder",
        {"hidden_states": (2, 64, 16)},
        id="latents-channels-first",
    ),
    pytest.param("pp_ocrv6_small_rec", {"pixel_values": (2, 3, 128, 128)}, id="larger-image"),
]


@pytest.mark.parametrize(("model_type", "expected"), RULES)
def test_the_forward_runs_on_the_inferred_inputs(
    model_type: str, expected: dict[str, tuple[int, ...]]
) -> None:
    _, kwargs = built(model_type).inputs()
    assert shapes(kwargs) == expected


@pytest.mark.parametrize(
    ("model_type", "first", "other"),
    [
        ("qwen2_5_vl_vision", {"hidden_states": (32, 384)}, {"hidden_states": (48, 384)}),
        ("siglip2_vision_model", {"spatial_shapes": (2, 2)}, {"spatial_shapes": (3, 2)}),
        ("decision_transformer", {"timesteps": (2, 16)}, {"timesteps": (3, 24)}),
        ("time_series_transformer", {"past_values": (2, 15)}, {"past_values": (3, 15)}),
    ],
)
def test_the_inputs_follow_the_batch_and_sequence(
    model_type: str, first: dict[str, tuple[int, ...]], other: dict[str, tuple[int, ...]]
) -> None:
    model = built(model_type)
    for index, want in ((0, first), (1, other)):  # SIZES 2x16, then 3x24
        got = shapes(model.inputs(index)[1])
        assert {k: got[k] for k in want} == want
        with torch.no_grad():
            model.module(**model.inputs(index)[1])


def test_the_values_mean_what_the_model_reads() -> None:
    _, grid = built("qwen2_5_vl_vision").inputs()
    assert grid["grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
    _, boxes = built("bros").inputs()
    x0, y0, x1, y1 = boxes["bbox"].unbind(-1)
    assert bool(((x0 <= x1) & (y0 <= y1)).all())
    assert 0 <= float(boxes["bbox"].min()) <= float(boxes["bbox"].max()) <= 1  # of the page
    _, audio = built("gemma3n_audio").inputs()
    assert not audio["audio_mel_mask"].any()  # True marks padding: none
    _, series = built("time_series_transformer").inputs()
    assert series["past_observed_mask"].all()  # True marks what was observed: all


def test_seggpt_takes_the_image_and_its_prompt_each_half_as_high() -> None:
    from pytest_nobreak.models.hf import build_hf, hf_inputs, shrink

    model = build_hf("seggpt", "", lambda values: {**shrink(values), "image_size": [64, 32]})
    inputs = hf_inputs(model, 2, 16)
    names = ("pixel_values", "prompt_pixel_values", "prompt_masks")
    assert shapes(inputs) == dict.fromkeys(names, (2, 3, 32, 32))
    with torch.no_grad():
        model(**inputs)


def test_omdet_gets_its_class_and_task_prompts() -> None:
    # The forward fails later, on sizes its shrunk config gets wrong; the prompts are right.
    from pytest_nobreak.models.hf import build_hf, hf_inputs

    inputs = hf_inputs(build_hf("omdet-turbo", ""), 2, 16)
    assert shapes(inputs) == {
        "pixel_values": (2, 3, 32, 32),
        "classes_input_ids": (2, 16),
        "classes_attention_mask": (2, 16),
        "tasks_input_ids": (2, 16),
        "tasks_attention_mask": (2, 16),
        "classes_structure": (2,),
    }
    assert inputs["classes_attention_mask"].all()
    assert inputs["classes_structure"].tolist() == [1, 1]


def test_an_output_of_codes_alone_is_compared_as_floats() -> None:
    model = built("wavtokenizer_encoder")  # its output: integer audio codes and their mask
    with torch.no_grad():
        codes = model.module(**model.inputs()[1]).audio_codes
    assert not codes.is_floating_point()
    assert torch.equal(model.reference, codes.float())
