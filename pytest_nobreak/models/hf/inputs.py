"""Inputs for a shrunk ``transformers`` model, inferred from its main input and config."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from pytest_nobreak.models.hf.shrinking import FRAMES, IMAGE, VOCAB
from pytest_nobreak.models.skips import BuildSkip

__all__ = ["HF_MAIN_INPUTS", "hf_inputs", "hf_layouts"]


def _sub(config: Any, attr: str, default: Any) -> Any:
    """``config.attr``, else that of its text/vision/audio/encoder sub-config."""
    value = getattr(config, attr, None)
    if value is not None:
        return value
    for sub in ("text_config", "vision_config", "audio_config", "encoder_config", "encoder"):
        value = getattr(getattr(config, sub, None), attr, None)
        if value is not None:
            return value
    return default


def hf_inputs(model: nn.Module, batch: int, seq: int, layout: int = 0) -> dict[str, Any]:
    """Inputs for ``model(**inputs)`` inferred from its main input and config: token ids (and
    an attention mask), pixel values (images or video frames), audio features or waveforms,
    time series, and decoder token ids for an encoder-decoder. ``layout`` picks one of the
    :func:`hf_layouts` ways to shape the main input. Raises :class:`BuildSkip` for a main
    input it cannot make."""
    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    params = inspect.signature(model.forward).parameters
    make = _MAKERS.get(main) if isinstance(main, str) else None  # some name a list
    if make is None:
        first = main if isinstance(main, str) else main[0]
        raise BuildSkip(
            f"cannot infer its main input {main!r}; give --nobreak-model-inputs (e.g. {first}=2x16)"
        )
    inputs: dict[str, Any] = {main: make(config, batch, seq)[layout]}
    if main == "input_ids" and "attention_mask" in params:
        inputs["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
    if main == "input_ids" and "pixel_values" in params and not _has_image_tokens(config):
        # A dual encoder (CLIP-like) takes an image beside the text; a model that splices
        # image features into the text at placeholder tokens is checked on text alone.
        inputs["pixel_values"] = _pixels(config, batch, seq)[0]
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        inputs["decoder_input_ids"] = _ids(config, batch, seq)[0]
    if "use_cache" in params:
        inputs["use_cache"] = False  # one forward pass, not a KV cache being filled
    return inputs


def hf_layouts(model: nn.Module) -> int:
    """How many ways :func:`hf_inputs` has to shape the model's main input (a waveform with or
    without its channel axis, features as mel bins by frames or frames by mel bins, ...): the
    build takes the first one its eager forward accepts."""
    main = getattr(model, "main_input_name", "input_ids")
    make = _MAKERS.get(main) if isinstance(main, str) else None
    return len(make(model.config, 1, 1)) if make else 1


def _has_image_tokens(config: Any) -> bool:
    return any(
        getattr(config, key, None) is not None for key in ("image_token_id", "image_token_index")
    )


def _ids(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    vocab = int(_sub(config, "vocab_size", VOCAB))
    # Low ids only: special tokens (image, audio placeholders) sit at the top of a vocabulary.
    return [torch.randint(1, max(vocab // 2, 2), (batch, seq))]


def _pixels(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    size = _sub(config, "image_size", IMAGE)
    h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]
    channels = int(_sub(config, "num_channels", 3))
    image = torch.randn(batch, channels, int(h), int(w))
    frames = _sub(config, "num_frames", None)
    if not isinstance(frames, int):
        return [image]
    # A video model: frames (shrunk to FRAMES) of that image, frame axis second.
    video = torch.randn(batch, frames, channels, int(h), int(w))
    return [image, video, video.transpose(1, 2)]


def _videos(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    return _pixels(config, batch, seq)[1:] or [
        torch.randn(batch, FRAMES, int(_sub(config, "num_channels", 3)), IMAGE, IMAGE)
    ]


def _features(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    mels = _sub(config, "num_mel_bins", None)
    if mels is not None:
        # Whisper-like: the encoder checks frames == 2 * max_source_positions; conformers
        # (Parakeet, Canary) take frames by mel bins.
        frames = 2 * int(_sub(config, "max_source_positions", seq))
        return [torch.randn(batch, int(mels), frames), torch.randn(batch, 4 * seq, int(mels))]
    per_channel = int(_sub(config, "input_feat_per_channel", _sub(config, "feature_size", 80)))
    channels = int(_sub(config, "input_channels", 1))
    return [torch.randn(batch, 4 * seq, per_channel * channels)]


def _values(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    # A waveform: wav2vec2-style feature encoders downsample by 320; codecs (EnCodec, Mimi)
    # take a channel axis.
    wave = torch.randn(batch, 320 * seq)
    channels = int(_sub(config, "audio_channels", 1))
    return [wave, torch.randn(batch, channels, 320 * seq)]


def _series(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    # A time series' past: its context length of steps, one value per input channel.
    length = int(_sub(config, "context_length", 4 * seq))
    channels = int(_sub(config, "num_input_channels", 1))
    return [torch.randn(batch, length, channels), torch.randn(batch, length)]


#: The main inputs :func:`hf_inputs` can make.
_MAKERS: dict[str, Callable[[Any, int, int], list[torch.Tensor]]] = {
    "input_ids": _ids,
    "pixel_values": _pixels,
    "pixel_values_videos": _videos,
    "input_features": _features,
    "input_values": _values,
    "past_values": _series,
}
HF_MAIN_INPUTS = tuple(_MAKERS)
