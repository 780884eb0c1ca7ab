"""The family of each kind of model (``pytest_nobreak.models.families``), which the zoo counts."""

from __future__ import annotations

import pytest

from pytest_nobreak.models.families import FAMILIES, family_of
from pytest_nobreak.models.spec import parse_spec


@pytest.mark.parametrize(
    ("spec", "family"),
    [
        ("hf:llama", "LLM"),
        ("hf:mixtral", "LLM"),
        ("hf:bert", "encoder"),  # it has a causal-LM head too: a masked LM first
        ("hf:t5", "encoder"),  # an encoder-decoder
        ("hf:vit", "vision"),
        ("hf:detr", "vision"),
        ("hf:qwen2_vl_vision", "vision"),  # a vision tower, by its name
        ("hf:whisper", "audio"),
        ("hf:dac", "audio"),  # a codec: no task, but a sampling rate
        ("hf:clip", "multimodal"),
        ("hf:llava", "multimodal"),
        ("hf:patchtst", "other"),  # a time series
    ],
)
def test_an_architecture_has_the_family_of_what_it_takes_and_does(spec: str, family: str) -> None:
    pytest.importorskip("transformers")
    assert family_of(parse_spec(spec)) == family
    assert family in FAMILIES


def test_a_factory_has_no_family() -> None:
    assert family_of(parse_spec("examples.factories:tiny_cnn")) is None


@pytest.mark.parametrize(
    ("spec", "family"),
    [
        ("hf:qwen3", "LLM"),
        ("hf:roberta", "encoder"),
        ("hf:dinov2", "vision"),
        ("hf:wav2vec2", "audio"),
        ("hf:siglip", "multimodal"),
        ("hf:patchtst", "other"),
    ],
)
def test_one_architecture_of_each_family_is_built_and_run(spec: str, family: str) -> None:
    """The shrinking and input rules hold for each family (the UNet, VAE and diffusion
    transformer are in ``tests/plugin/test_diffusers_models.py``)."""
    pytest.importorskip("transformers")
    from pytest_nobreak.models.build import build

    parsed = parse_spec(spec)
    built = build(parsed, None, ())
    assert sum(p.numel() for p in built.module.parameters()) < 20_000_000
    assert built.reference.numel() > 0
    assert family_of(parsed) == family
