"""Inputs for a shrunk ``transformers`` model, inferred from its main input, its forward's
parameters and docstring, and its config."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from pytest_nobreak.models.hf.call import Call, config_int, first_width, sub
from pytest_nobreak.models.hf.companions import NEEDED, companion, token_ids
from pytest_nobreak.models.hf.patches import patch_layouts, patched
from pytest_nobreak.models.hf.shrinking import FRAMES, IMAGE
from pytest_nobreak.models.skips import BuildSkip

__all__ = ["HF_MAIN_INPUTS", "hf_inputs", "hf_layouts"]

#: The tiers of inputs tried: the required ones, then also the optional ones a forward may not
#: do without (:data:`~.companions.NEEDED`, and those its docstring does not call optional).
_TIERS = 2


def hf_inputs(model: nn.Module, batch: int, seq: int, layout: int = 0) -> dict[str, Any]:
    """Inputs for ``model(**inputs)``: the main input (token ids, pixel values of images, video
    frames or patches, audio features or waveforms, a time series, embeddings...), then each
    parameter the forward requires, and decoder token ids for an encoder-decoder.

    ``layout`` picks one of the :func:`hf_layouts` ways to make them: the main input's shapes
    (a waveform with or without its channel axis, features as mel bins by frames or frames by
    mel bins, ...), first with the required parameters only, then also with the optional ones
    the forward cannot do without. Raises :class:`BuildSkip` for an input it cannot make."""
    call = Call(model, batch, seq)
    main = _main(call)
    layouts = _main_layouts(call, main)
    tier, shape = divmod(layout, len(layouts))
    call.inputs.update(layouts[shape])
    if main == "past_values":  # a series' features and masks span its past, not the sequence
        call.steps = call.inputs[main].shape[1]
    config = call.config
    params = call.params
    if getattr(config, "is_encoder_decoder", False):
        if "decoder_input_ids" in params:
            call.inputs["decoder_input_ids"] = token_ids(config, batch, seq)
        decoder, given = f"decoder_{main}", call.inputs[main]
        if decoder in params and decoder not in call.inputs and given.is_floating_point():
            call.inputs[decoder] = torch.randn(given.shape)  # SpeechT5: hidden states both sides
    for name in params:
        if name in call.inputs or not (call.required(name) or (tier and _needed(call, name))):
            continue
        value = companion(call, name)
        if value is None:
            if call.required(name):
                raise BuildSkip(f"cannot infer its input {name!r} (beside {main!r})")
            continue
        call.inputs[name] = value
    if "use_cache" in params:
        call.inputs["use_cache"] = False  # one forward pass, not a KV cache being filled
    return call.inputs


def hf_layouts(model: nn.Module) -> int:
    """How many ways :func:`hf_inputs` has to make the model's inputs: the build takes the
    first one its eager forward accepts."""
    call = Call(model, 1, 1)
    try:
        return _TIERS * len(_main_layouts(call, _main(call)))
    except BuildSkip:
        return 1  # hf_inputs raises it, as the reason


def _main(call: Call) -> str:
    """The main input's name: ``main_input_name`` (the first of a list), or, when the forward
    does not take that (a vision tower keeps its VLM's ``input_ids``), its first required
    parameter, else its first."""
    name = _declared(call)
    if name in call.params or not call.params:
        return name
    required = [p for p in call.params if call.required(p)]
    return (required or list(call.params))[0]


def _declared(call: Call) -> str:
    """The model's ``main_input_name`` (the first of a list)."""
    main = getattr(call.model, "main_input_name", "input_ids")
    return main if isinstance(main, str) else str(main[0])


def _main_layouts(call: Call, main: str) -> list[dict[str, Any]]:
    if main in ("pixel_values", "hidden_states") and patched(call):
        layouts = patch_layouts(call, main)
        if layouts:
            return layouts
    make = _MAKERS.get(main)
    if make is not None:
        return make(call)
    value = companion(call, main)
    if value is None:
        raise BuildSkip(
            f"cannot infer its main input {main!r}; give --nobreak-model-inputs (e.g. {main}=2x16)"
        )
    layouts = [{main: value}]
    declared = _declared(call)
    if declared != main and declared in _MAKERS and declared != "input_ids":
        # Then, when the forward names its main input otherwise (VibeVoice's tokenizers call
        # their waveform ``hidden_states``), as what the model declares it to be.
        made = _MAKERS[declared](call)
        layouts += [{main: value} for layout in made for value in layout.values()]
    return layouts


def _needed(call: Call, name: str) -> bool:
    """Whether an optional parameter is one the forward may not do without."""
    if name in NEEDED:
        return True
    if name == "encoder_hidden_states":  # a cross-attention with a source width of its own
        return config_int(call.config, "encoder_hidden_size") is not None
    if name.endswith(("_mask", "_padding")) and any(name.startswith(m) for m in call.inputs):
        return True
    doc = call.docs.get(name)
    return doc is not None and not doc.optional and "Tensor" in doc.type


def _ids(call: Call) -> list[dict[str, Any]]:
    """Token ids, and, for a dual encoder (CLIP-, CLAP-, CLVP-like), the image or audio it
    takes beside the text (one layout per shape of that); a model that splices image or audio
    features into the text at placeholder tokens is checked on text alone."""
    ids: dict[str, Any] = {"input_ids": token_ids(call.config, call.batch, call.seq)}
    masked: list[dict[str, Any]] = [{}]
    if "attention_mask" in call.params:
        # Last, no mask: a model that derives positions from it may trip on text alone (Qwen
        # Omni thinkers look up vision tokens their config lacks).
        masked = [{"attention_mask": torch.ones(call.batch, call.seq, dtype=torch.long)}, {}]
    beside: list[dict[str, Any]] = [{}]
    if "pixel_values" in call.params and not _has_tokens(call.config, "image"):
        # Whole images first: a model that takes patches (SigLIP2) fails on them, one that
        # ignores images without an image token set takes them.
        beside = _pixels(call) + (patch_layouts(call, "pixel_values") if patched(call) else [])
    elif "input_features" in call.params and not _has_tokens(call.config, "audio"):
        # Text alone first: an audio LM without its audio token set takes no audio.
        beside += _features(call)
    layouts = [{**ids, **other, **mask} for mask in masked for other in beside]
    if "input_values" in call.params:
        # Last: text beside a waveform (PE Audio's dual encoder).
        layouts += [{**ids, **wave, **mask} for mask in masked for wave in _values(call)]
    return layouts


def _has_tokens(config: Any, kind: str) -> bool:
    return any(
        getattr(config, f"{kind}_{key}", None) is not None for key in ("token_id", "token_index")
    )


def _image_size(config: Any) -> tuple[int, int, int]:
    """Channels, height and width of the config's images."""
    size = sub(config, "image_size", IMAGE)
    h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]
    return int(sub(config, "num_channels", 3)), int(h), int(w)


def _image(call: Call) -> tuple[int, int, int]:
    channels, h, w = _image_size(call.config)
    if "prompt_pixel_values" in call.params:
        h //= 2  # SegGPT's image size stacks the prompt over the image: each is half as high
    return channels, h, w


def _pixels(call: Call) -> list[dict[str, Any]]:
    channels, h, w = _image(call)
    batch = call.batch
    image = torch.randn(batch, channels, h, w)
    frames = sub(call.config, "num_frames", None)
    if isinstance(frames, int):
        # A video model: frames (shrunk to FRAMES) of that image, frame axis second.
        video = torch.randn(batch, frames, channels, h, w)
        return [{"pixel_values": v} for v in (image, video, video.transpose(1, 2))]
    # Else a stack of two images: a pair to match (LightGlue), a clip (X-CLIP), the images of
    # one prompt (IDEFICS).
    layouts = [{"pixel_values": image}, {"pixel_values": torch.randn(batch, 2, channels, h, w)}]
    if sub(call.config, "image_size", None) is None:
        # Last, when the config gives no image size, a larger guess: a network may pool the
        # image down further than the shrunk size allows (PP-OCR's text recognizers).
        layouts.append({"pixel_values": torch.randn(batch, channels, 4 * h, 4 * w)})
    return layouts


def _videos(call: Call) -> list[dict[str, Any]]:
    if isinstance(sub(call.config, "num_frames", None), int):
        videos = [layout["pixel_values"] for layout in _pixels(call)[1:]]
    else:
        videos = [torch.randn(call.batch, FRAMES, _image(call)[0], IMAGE, IMAGE)]
    return [{"pixel_values_videos": video} for video in videos]


def _features(call: Call, name: str = "input_features") -> list[dict[str, Any]]:
    config, batch, seq = call.config, call.batch, call.seq
    mels = config_int(config, "num_mel_bins")
    if mels is not None:
        # Whisper-like: the encoder checks frames == 2 * max_source_positions; conformers
        # (Parakeet, Canary) take frames by mel bins.
        frames = 2 * int(sub(config, "max_source_positions", seq))
        layouts = [torch.randn(batch, mels, frames), torch.randn(batch, 4 * seq, mels)]
        chunk = config_int(config, "n_window")
        if chunk:  # chunked encoders (Qwen-ASR) take whole chunks of 2 * n_window frames
            layouts.append(torch.randn(batch, mels, 2 * chunk))
    else:
        per_frame = sub(config, "input_feat_per_channel", None) or sub(
            config, "input_feat_size", sub(config, "feature_size", 80)
        )
        channels = int(sub(config, "input_channels", 1))
        layouts = [torch.randn(batch, 4 * seq, int(per_frame) * channels)]
    bins = layouts[-1].shape[-1] if mels is None else mels
    # Fallbacks: bins by frames (CLVP), a channel axis (CLAP takes crops of the spectrogram),
    # and frames as wide as the model's first layer (stacked frames: FunASR; strided
    # projections: W2V-BERT).
    if mels is None:
        layouts.append(torch.randn(batch, bins, 4 * seq))
    layouts.append(torch.randn(batch, 1, 4 * seq, bins))
    width = first_width(call.model)
    if width and width != bins:
        layouts += [torch.randn(batch, 4 * seq, width), torch.randn(batch, width, 4 * seq)]
    return [{name: features} for features in layouts]


def _values(call: Call) -> list[dict[str, Any]]:
    # A waveform: wav2vec2-style feature encoders downsample by 320; codecs (EnCodec, Mimi)
    # take a channel axis.
    batch, seq = call.batch, call.seq
    wave = torch.randn(batch, 320 * seq)
    channels = int(sub(call.config, "audio_channels", 1))
    layouts = [wave, torch.randn(batch, channels, 320 * seq)]
    mels = config_int(call.config, "num_mel_bins")
    if mels:  # a spectrogram (AST): its max_length frames by mel bins
        frames = config_int(call.config, "max_length") or 4 * seq
        layouts.append(torch.randn(batch, frames, mels))
    hop = config_int(call.config, "samples_per_token")
    if hop:  # whole tokens of samples (Muse Spark)
        layouts.append(torch.randn(batch, hop * seq))
    width = first_width(call.model)
    if width:  # hidden states already (a SpeechT5 without its pre-nets); latents, channels first
        layouts += [torch.randn(batch, seq, width), torch.randn(batch, width, seq)]
    return [{"input_values": values} for values in layouts]


def _series(call: Call) -> list[dict[str, Any]]:
    # A time series' past: its context length of steps, and the lags it looks back on before
    # that, one value per input channel.
    lags = sub(call.config, "lags_sequence", None) or [0]
    length = int(sub(call.config, "context_length", 4 * call.seq)) + max(lags)
    channels = int(sub(call.config, "num_input_channels", 1))
    layouts = [torch.randn(call.batch, length, channels), torch.randn(call.batch, length)]
    return [{"past_values": series} for series in layouts]


#: The main inputs made by their own rules; others follow their name or docstring (see
#: :mod:`.companions`).
_MAKERS: dict[str, Callable[[Call], list[dict[str, Any]]]] = {
    "input_ids": _ids,
    "pixel_values": _pixels,
    "pixel_values_videos": _videos,
    "input_features": _features,
    "input_values": _values,
    "past_values": _series,
    "audio_mel": functools.partial(_features, name="audio_mel"),
}
HF_MAIN_INPUTS = tuple(_MAKERS)
