"""Inputs for a shrunk ``diffusers`` model, inferred from its ``forward`` signature and config.

The checks call a model at a batch and a *sequence* size (``build.SIZES``); for a diffusion
model the sequence sets the latent's side: ``seq // 4`` times the model's spatial factor (its
downsampling, 2 per UNet block but the last, and its patch size), so 16, 24 and 12 give
sides of 4, 6 and 3 factors, each one the model's blocks and patches divide (``seq // 8``
past a factor of 4, so a VAE that downsamples 8 or 32 times is not run on large images). The
main input (``sample``, ``hidden_states``, ``x``, ``latents``) is a latent of one of six
layouts, the build taking the first its eager forward accepts at every size: an image (batch
x channels x side x side), a video (batch x channels x frames x side x side, or frames before
channels), packed tokens (batch x side² x channels, with their ``img_ids``, as Flux takes
them), a 1-D signal (batch x channels x length) or rows (batch x channels). The other
inputs follow the config: ``timestep`` (in [0, 1)), text embeddings of 8 tokens sized by the
cross-attention, joint-attention or caption width, their mask when required,
``pooled_projections``, ``txt_ids``, ``guidance``, class labels, ``added_cond_kwargs``, a
ControlNet's ``controlnet_cond`` (an image at the conditioning embedding's scale, or a latent).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from pytest_nobreak.models.diffusers.shrinking import TEXT, WIDTH
from pytest_nobreak.models.skips import BuildSkip

__all__ = ["MAIN_INPUTS", "Layout", "diffusers_inputs", "diffusers_layouts"]

#: The names the main latent goes by, in the order looked for.
MAIN_INPUTS = ("sample", "hidden_states", "x", "latents", "z", "mel", "inputs_embeds")
IMAGE, VIDEO, FRAMES_FIRST, TOKENS, SIGNAL, ROWS = (
    "image",
    "video",
    "frames-first",
    "tokens",
    "signal",
    "rows",
)
#: The width of the text embeddings: the first of these config keys that is set (a UNet's
#: ``encoder_hid_dim`` projects to its ``cross_attention_dim``; a caption projection takes
#: ``caption_channels``), else the shrunk width.
_TEXT_DIMS = (
    "encoder_hid_dim",
    "caption_channels",
    "joint_attention_dim",
    "text_dim",
    "text_embed_dim",
    "context_in_dim",
    "cap_feat_dim",
    "txt_in_features",
    "text_hidden_dim",
    "in_text_dim",
    "text_in_dim",
    "cross_attention_dim",
)
#: Config keys of a video model (a temporal compression, patch or frame count; Wan's VAEs
#: spell it "temperal"), and of an audio one.
_VIDEO_HINTS = ("temporal", "temperal", "patch_size_t", "frames")
_AUDIO_HINTS = frozenset(("audio_channels", "sampling_rate", "sample_rate"))
#: The config keys naming the main latent's channels, in the order looked for.
_CHANNELS = (
    "in_channels",
    "encoder_in_channels",
    "input_channels",
    "in_visual_dim",
    "audio_channels",
    "in_dim",
    "latent_channels",
)


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the main latent is shaped: its kind, the spatial factor its side is a multiple of,
    and (for a video) its frame count."""

    kind: str
    factor: int
    frames: int = 0


def _config(model: nn.Module) -> Mapping[str, Any]:
    config = getattr(model, "config", None)
    return config if isinstance(config, Mapping) else {}


def _int(config: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    """The first of ``keys`` the config sets to an int (the first entry of a list)."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def _spatial_factor(config: Mapping[str, Any]) -> int:
    """What the latent's side must be a multiple of: the downsampling of the blocks (each but
    the last halves it; a channel multiplier list likewise), the patch, a compression ratio."""
    factor = 1
    stages = ("block_out_channels", "dim_mult", "ch_mult", "channel_multipliers")
    for key, value in config.items():
        if key.endswith(stages) and isinstance(value, (list, tuple)) and value:
            factor = math.lcm(factor, 2 ** (len(value) - 1))
    patch = config.get("patch_size")
    if isinstance(patch, (list, tuple)) and patch:
        patch = patch[-1]
    if isinstance(patch, int) and patch > 0:
        factor = math.lcm(factor, patch)
    for key in ("spatial_compression_ratio", "scale_factor_spatial", "downscale_factor"):
        ratio = config.get(key)
        if isinstance(ratio, int) and ratio > 0:
            factor = math.lcm(factor, ratio)
    return max(factor, 2)  # a latent side of 8 at least


def _frames(config: Mapping[str, Any]) -> int:
    """A frame count a video model takes: one more than its temporal compression (causal video
    VAEs keep the first frame apart), else two temporal patches."""
    ratio = _int(config, "temporal_compression_ratio", "scale_factor_temporal")
    steps = config.get("temperal_downsample")
    if not ratio and isinstance(steps, (list, tuple)):
        ratio = 2 ** sum(bool(step) for step in steps)
    if ratio > 1:
        return ratio + 1
    patch = config.get("patch_size")
    temporal = patch[0] if isinstance(patch, (list, tuple)) and len(patch) == 3 else 1
    return 2 * max(_int(config, "patch_size_t", default=temporal), 1)


def _main(model: nn.Module) -> str | None:
    params = inspect.signature(model.forward).parameters
    return next((name for name in MAIN_INPUTS if name in params), None)


def diffusers_layouts(model: nn.Module) -> list[Layout]:
    """The layouts of the main latent to try, most likely first: packed tokens for a model
    that takes their ids, a video for one with a temporal config or name, a 1-D signal for an
    audio or 1-D one, else an image; then the others, and a 4x coarser side as a fallback."""
    config = _config(model)
    params = inspect.signature(model.forward).parameters
    name = type(model).__name__
    factor, frames = _spatial_factor(config), _frames(config)
    if {"img_ids", "img_shapes", "inputs_embeds"} & params.keys():
        first = TOKENS
    elif "3D" in name or "Video" in name or any(h in k for k in config for h in _VIDEO_HINTS):
        first = VIDEO
    elif "1D" in name or "Audio" in name or "mel" in params or _AUDIO_HINTS & config.keys():
        first = SIGNAL
    else:
        first = IMAGE
    order = (IMAGE, VIDEO, FRAMES_FIRST, TOKENS, SIGNAL, ROWS)
    kinds = [first, *(k for k in order if k != first)]
    layouts = [Layout(k, factor, frames if k in (VIDEO, FRAMES_FIRST) else 0) for k in kinds]
    layouts.insert(1, dataclasses.replace(layouts[0], factor=4 * factor))
    return layouts


@dataclasses.dataclass
class _Call:
    """What the makers of one call's inputs share."""

    config: Mapping[str, Any]
    batch: int
    side: int
    layout: Layout
    main: torch.Tensor


def _channels(model: nn.Module, config: Mapping[str, Any]) -> int:
    """The main latent's channels: from the config, else what its first layer takes."""
    channels = _int(config, *_CHANNELS)
    if channels:
        return channels
    for layer in model.modules():
        if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            return int(layer.in_channels)
        if isinstance(layer, nn.Linear):
            return int(layer.in_features)
    return 4


def diffusers_inputs(model: nn.Module, batch: int, seq: int, layout: Layout) -> dict[str, Any]:
    """Inputs for ``model(**inputs)`` at a batch and sequence size (see the module docstring):
    every required parameter of its ``forward``, and the optional ones its config asks for.
    Raises :class:`BuildSkip` for a required input it cannot make."""
    config = _config(model)
    params = inspect.signature(model.forward).parameters
    main = _main(model)
    if main is None:
        needed = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
        raise BuildSkip(
            f"no latent input ({', '.join(MAIN_INPUTS)}) in its forward"
            f"({', '.join(needed)}); pass --nobreak-model-inputs"
        )
    side = layout.factor * max(seq // (4 if layout.factor <= 4 else 8), 1)
    latent = _latent(_channels(model, config), batch, side, layout)
    call = _Call(config, batch, side, layout, latent)
    inputs: dict[str, Any] = {main: call.main}
    for name, param in params.items():
        if name == main or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        required = param.default is inspect.Parameter.empty
        maker = _MAKERS.get(name)
        if maker is None:
            if required:
                raise BuildSkip(
                    f"cannot infer its input {name!r}; pass --nobreak-model-inputs "
                    f"(e.g. {main}=2x4x8x8,{name}=2)"
                )
            continue
        if not required and name not in _OPTIONAL:
            continue
        value = maker(call)
        if value is _ABSENT and required:
            value = _fallback(name, call)
        if value is not _ABSENT:
            inputs[name] = value
    return inputs


_ABSENT: Any = object()


def _latent(channels: int, batch: int, side: int, layout: Layout) -> torch.Tensor:
    if layout.kind == VIDEO:
        return torch.randn(batch, channels, layout.frames, side, side)
    if layout.kind == FRAMES_FIRST:
        return torch.randn(batch, layout.frames, channels, side, side)
    if layout.kind == ROWS:
        return torch.randn(batch, channels)
    if layout.kind == TOKENS:
        return torch.randn(batch, side * side, channels)
    if layout.kind == SIGNAL:
        return torch.randn(batch, channels, 8 * side)
    return torch.randn(batch, channels, side, side)


def _timestep(call: _Call) -> torch.Tensor:
    # In [0, 1): flow-matching models scale it by 1000 themselves; a DDPM UNet's sinusoidal
    # embedding takes any value.
    return torch.rand(call.batch)


def _text_dim(config: Mapping[str, Any]) -> int:
    return _int(config, *_TEXT_DIMS, default=WIDTH)


def _has_text(config: Mapping[str, Any]) -> bool:
    return any(isinstance(config.get(k), (int, list, tuple)) for k in _TEXT_DIMS)


def _text(call: _Call) -> Any:
    if not _has_text(call.config):
        return _ABSENT
    return torch.randn(
        call.batch, _int(call.config, "text_len", default=TEXT), _text_dim(call.config)
    )


def _text_t5(call: _Call) -> Any:
    dim = _int(call.config, "cross_attention_dim_t5", "text_embed_2_dim", default=0)
    if not dim:
        return _ABSENT
    return torch.randn(call.batch, _int(call.config, "text_len_t5", default=TEXT), dim)


def _text_mask(call: _Call) -> torch.Tensor:
    # Long ones: models read it as .bool(), as 1 - mask, or cast it to their dtype.
    return torch.ones(call.batch, _int(call.config, "text_len", default=TEXT), dtype=torch.long)


def _text_mask_t5(call: _Call) -> Any:
    if _text_t5(call) is _ABSENT:
        return _ABSENT
    return torch.ones(call.batch, _int(call.config, "text_len_t5", default=TEXT), dtype=torch.long)


def _pooled(call: _Call) -> Any:
    dim = _int(call.config, "pooled_projection_dim", default=0)
    return torch.randn(call.batch, dim) if dim else _ABSENT


def _ids(call: _Call, rows: int, cols: int, *, positions: bool) -> torch.Tensor:
    axes = call.config.get("axes_dims_rope") or call.config.get("axes_dim_rope") or (0, 0, 0)
    ids = torch.zeros(rows * cols, len(axes))
    if positions:  # the last two axes are the row and the column of each latent patch
        grid = torch.stack(torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij"))
        ids[:, -2:] = grid.reshape(2, -1).T.float()
    return ids


def _img_ids(call: _Call) -> Any:
    if call.layout.kind != TOKENS:
        return _ABSENT
    return _ids(call, call.side, call.side, positions=True)


def _txt_ids(call: _Call) -> torch.Tensor:
    return _ids(call, 1, TEXT, positions=False)


def _img_shapes(call: _Call) -> Any:
    if call.layout.kind != TOKENS:
        return _ABSENT
    return [[(1, call.side, call.side)]] * call.batch


def _guidance(call: _Call) -> Any:
    return torch.full((call.batch,), 3.5) if call.config.get("guidance_embeds") else _ABSENT


def _class_labels(call: _Call) -> Any:
    classes = _int(call.config, "num_class_embeds", default=0)
    if not classes and call.config.get("norm_type") == "ada_norm_zero":
        classes = _int(call.config, "num_embeds_ada_norm", default=0)
    return torch.randint(0, classes, (call.batch,)) if classes else _ABSENT


def _added_cond(call: _Call) -> Any:
    config = call.config
    if config.get("addition_embed_type") == "text_time":
        time_dim = _int(config, "addition_time_embed_dim")
        text = _int(config, "projection_class_embeddings_input_dim") - 6 * time_dim
        return {"text_embeds": torch.randn(call.batch, text), "time_ids": torch.rand(call.batch, 6)}
    if config.get("use_additional_conditions"):
        return {
            "resolution": torch.full((call.batch, 2), 8.0 * call.side),
            "aspect_ratio": torch.ones(call.batch, 1),
        }
    return _ABSENT


def _controlnet_cond(call: _Call) -> torch.Tensor:
    """An image at the conditioning embedding's scale (each of its blocks but the first halves
    it), or, for a ControlNet without one, a latent shaped like the main input."""
    prefix = "ctrl_" if "ctrl_conditioning_embedding_out_channels" in call.config else ""
    blocks = call.config.get(prefix + "conditioning_embedding_out_channels")
    if isinstance(blocks, (list, tuple)) and blocks:
        scale = 2 ** (len(blocks) - 1)
        channels = _int(call.config, prefix + "conditioning_channels", default=3)
        size = call.side * scale
        return torch.randn(call.batch, channels, size, size)
    return torch.randn_like(call.main)


def _meta_size(call: _Call) -> Any:
    if not call.config.get("use_style_cond_and_image_meta_size"):
        return _ABSENT
    return torch.tensor([[8.0 * call.side] * 4 + [0.0, 0.0]] * call.batch)


def _style(call: _Call) -> Any:
    if not call.config.get("use_style_cond_and_image_meta_size"):
        return _ABSENT
    return torch.zeros(call.batch, dtype=torch.long)


def _sizes(call: _Call) -> torch.Tensor:
    return torch.full((call.batch, 2), 8.0 * call.side)


def _added_time_ids(call: _Call) -> torch.Tensor:
    # Stable Video Diffusion's fps, motion bucket and noise augmentation, each embedded
    # addition_time_embed_dim wide.
    count = _int(call.config, "projection_class_embeddings_input_dim") // max(
        _int(call.config, "addition_time_embed_dim", default=1), 1
    )
    return torch.rand(call.batch, max(count, 1))


def _like_main(call: _Call) -> torch.Tensor:
    return torch.randn_like(call.main)


def _control_latents(call: _Call) -> Any:
    channels = _int(call.config, "vace_in_channels", default=0)
    if not channels or call.main.dim() != 5:
        return _ABSENT
    return torch.randn(call.batch, channels, *call.main.shape[2:])


def _clip_pooled(call: _Call) -> torch.Tensor:
    return torch.randn(
        call.batch, 1, _int(call.config, "clip_text_pooled_in_channels", default=WIDTH)
    )


def _fallback(name: str, call: _Call) -> Any:
    """A required input whose config gives no size: the shrunk width."""
    if name == "encoder_hidden_states":
        return torch.randn(call.batch, TEXT, WIDTH)
    if name == "pooled_projections":
        return torch.randn(call.batch, WIDTH)
    raise BuildSkip(f"cannot infer its input {name!r} from its config")


#: Optional inputs passed when the config asks for them (the others are left to their
#: defaults: a mask of ones would only add work).
_OPTIONAL = frozenset(
    (
        "timestep",
        "timesteps",
        "encoder_hidden_states",
        "cap_feats",
        "encoder_hidden_states_t5",
        "text_embedding_mask",
        "text_embedding_mask_t5",
        "pooled_projections",
        "img_ids",
        "txt_ids",
        "img_shapes",
        "guidance",
        "class_labels",
        "added_cond_kwargs",
        "controlnet_cond",
        "control_hidden_states",
        "image_meta_size",
        "style",
        "return_dict",
    )
)
#: Makers by parameter name; each returns ``_ABSENT`` for an optional input the config does
#: not ask for.
_MAKERS: dict[str, Callable[[_Call], Any]] = {
    "timestep": _timestep,
    "timesteps": _timestep,
    "t": _timestep,
    "timestep_ratio": _timestep,
    "timestep_r": _timestep,
    "r_timestep": _timestep,
    "added_time_ids": _added_time_ids,
    "fps": lambda call: torch.full((call.batch,), 8, dtype=torch.long),
    "image_latents": _like_main,
    "control_hidden_states": _control_latents,
    "clip_text_pooled": _clip_pooled,
    "proj_embedding": lambda call: torch.randn(call.batch, _int(call.config, "embedding_dim")),
    "encoder_hidden_states": _text,
    "cap_feats": _text,
    "encoder_hidden_states_t5": _text_t5,
    "encoder_attention_mask": _text_mask,
    "encoder_mask": _text_mask,
    "encoder_hidden_states_mask": _text_mask,
    "text_embedding_mask": _text_mask,
    "text_embedding_mask_t5": _text_mask_t5,
    "pooled_projections": _pooled,
    "img_ids": _img_ids,
    "txt_ids": _txt_ids,
    "img_shapes": _img_shapes,
    "guidance": _guidance,
    "class_labels": _class_labels,
    "added_cond_kwargs": _added_cond,
    "controlnet_cond": _controlnet_cond,
    "image_meta_size": _meta_size,
    "style": _style,
    "original_size": _sizes,
    "target_size": _sizes,
    "crop_coords": lambda call: torch.zeros(call.batch, 2),
    # One call, its output a tuple: torch.export takes it as it is, whatever the output class.
    "return_dict": lambda call: False,
}
