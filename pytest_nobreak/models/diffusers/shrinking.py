"""Shrinking a ``diffusers`` model config to a model of a few million parameters.

:func:`shrink` works on the keyword defaults of a model class's ``__init__`` (its config) and
narrows every size: a UNet, VAE or ControlNet keeps at most 2 of its blocks (the first and
the last, so the down and up paths stay mirrored) with block widths (32, 64), 1 layer per
block, at most 8 attention heads; a diffusion transformer keeps 2 layers of 2 heads of
dimension 32 (width 64); every other width above 64 (cross-attention, text, pooled and
timestep embeddings, hidden sizes) becomes 64, FFN widths 128; channel lists that are not a
UNet's blocks keep their count, divided by a power of two; sample sizes 16, position tables
64, text lengths 8. Sizes tied to a shrunk one follow it: a width equal to the old
attention width (heads x head dim) becomes the new one, per-block and per-layer lists keep
the blocks and layers kept, rotary axes add up to the new head dim. No torch, no diffusers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pytest_nobreak.models.skips import BuildSkip

__all__ = [
    "BLOCK_CHANNELS",
    "HEADS",
    "HEAD_DIM",
    "LAYERS",
    "SAMPLE",
    "SHRINKS",
    "TEXT",
    "WIDTH",
    "alternate",
    "shrink",
]

#: The shrunk sizes (one source: the docs quote this module's docstring).
BLOCK_CHANNELS, LAYERS, HEADS, HEAD_DIM, FFN, SAMPLE, TEXT = 32, 2, 2, 32, 128, 16, 8
#: Group norms' groups (so narrowed channel lists stay divisible), and the longest position
#: table (a side, or a count of patches, depending on the model).
GROUPS, POSITIONS = 8, 64
#: The width of a shrunk transformer (its heads x head dim), and of every conditioning input.
WIDTH = HEADS * HEAD_DIM
#: A UNet's per-block head count (or head dim: older configs mix the two) stays at most this,
#: a power of two, so it divides both block widths.
UNET_HEADS = 8
#: Sizes that are not widths: the model's own inputs and outputs (what the inputs are made
#: from), rates, tables, thresholds.
_KEEP = frozenset(
    (
        "in_channels",
        "out_channels",
        "latent_channels",
        "conditioning_channels",
        "z_dim",
        "in_dim",
        "out_dim",
        "num_embeds_ada_norm",
        "num_train_timesteps",
    )
)
_TEXT_LENGTHS = frozenset(
    (
        "text_len",
        "text_len_t5",
        "max_text_seq_length",
        "max_sequence_length",
        "text_seq_len",
        "num_text_tokens",
    )
)
#: Per-block lists named for what they hold (their length may not be the block count).
_PER_BLOCK = ("block_types", "_per_block", "only_cross_attention", "head_dim", "heads")


def shrink(
    values: dict[str, Any], *, truncate: bool | None = None, narrowest: int = 16
) -> dict[str, Any]:
    """A config (``__init__`` keyword defaults) shrunk by the rules in the module docstring.
    ``truncate``: keep 2 blocks (``True``) or every block, narrowed (``False``); by default,
    2 for a UNet-like config (its blocks named by type, one entry per block in each list).
    ``narrowest``: the narrowest stage a narrowed channel list keeps."""
    out = dict(values)
    if "in_channels" in values and values["in_channels"] is None:
        # No default latent (the class takes it from a checkpoint's config): the usual one.
        for key, default in _UNSET.items():
            if key in values and values[key] is None:
                out[key] = default
    values = dict(out)
    unet = _is_unet(values) if truncate is None else truncate and _has_blocks(values)
    if unet:
        _shrink_blocks(values, out, len(values["block_out_channels"]))
    else:
        _shrink_attention(values, out)
    _shrink_depth(values, out)
    _shrink_widths(values, out, unet, narrowest)
    for key in {"sample_size", "pos_embed_max_size"} & values.keys():
        out[key] = _cap(values[key], SAMPLE if key == "sample_size" else POSITIONS)
    for key, value in values.items():
        if _is_int(value) and key in _TEXT_LENGTHS:
            out[key] = min(value, TEXT)
        elif key.endswith("layers_per_block") or key == "num_res_blocks":
            out[key] = _map_ints(out[key], lambda v: min(v, 1))
        elif key.endswith("num_groups") or key == "groups":
            out[key] = _map_ints(out[key], lambda v: min(v, GROUPS))
    return out


#: Sizes whose default is ``None`` (the class takes them from a checkpoint's config), and the
#: value they get.
_UNSET = {"in_channels": 16, "patch_size": 2}


def _has_blocks(values: dict[str, Any]) -> bool:
    blocks = values.get("block_out_channels")
    return isinstance(blocks, (list, tuple)) and len(blocks) > 0


def _is_unet(values: dict[str, Any]) -> bool:
    """A UNet-like config: its blocks named by type, every per-block list one per block (VAEs
    with per-stage lists of other lengths keep their stages, narrowed)."""
    if not _has_blocks(values):
        return False
    if not any(key.endswith("block_types") for key in values):
        return False
    return all(
        len(value) == len(values["block_out_channels"])
        for key, value in values.items()
        if isinstance(value, (list, tuple)) and key.endswith(_PER_BLOCK)
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _cap(value: Any, limit: int) -> Any:
    if _is_int(value):
        return min(value, limit)
    if isinstance(value, (list, tuple)) and all(_is_int(v) for v in value):
        return type(value)(min(v, limit) for v in value)
    return value


def _power_of_two(value: float) -> int:
    """The largest power of two not above ``value`` (1 below 2)."""
    return 1 << max(int(math.log2(value)), 0) if value >= 1 else 1


def _shrink_blocks(values: dict[str, Any], out: dict[str, Any], count: int) -> None:
    """A UNet, VAE or ControlNet: its first and last block, widths (32, 64), 1 layer each."""
    keep = [0, count - 1] if count > 2 else list(range(count))
    for key, value in values.items():
        if (
            isinstance(value, (list, tuple))
            and len(value) == count
            and count > 2
            and (key.endswith(_PER_BLOCK) or key in ("block_out_channels", "cross_attention_dim"))
        ):
            out[key] = type(value)(value[i] for i in keep)
    old = values["block_out_channels"]
    if max(old) > 2 * BLOCK_CHANNELS:
        out["block_out_channels"] = type(old)(BLOCK_CHANNELS << i for i in range(len(keep)))
    for key in {"attention_head_dim", "num_attention_heads"} & values.keys():
        out[key] = _map_ints(out[key], lambda v: min(_power_of_two(v), UNET_HEADS))


def _map_ints(value: Any, rule: Callable[[int], int]) -> Any:
    """``rule`` applied to an int, or to every int of a (nested) list."""
    if _is_int(value):
        return rule(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_ints(v, rule) for v in value)
    return value


_HIDDEN_KEYS = ("hidden_size", "dim", "model_dim", "d_model", "inner_dim", "embed_dim", "dit_dim")
_HEADS_KEYS = ("num_attention_heads", "num_heads", "n_heads", "heads_num", "dit_heads")
_HEAD_DIM_KEYS = ("attention_head_dim", "head_dim", "dim_head", "dim_heads", "d_kv")


def _first(values: dict[str, Any], keys: tuple[str, ...]) -> str:
    return next((k for k in keys if _is_int(values.get(k))), "")


def _shrink_attention(values: dict[str, Any], out: dict[str, Any]) -> None:
    """A transformer: 2 heads of dim 32; widths equal to the old attention width follow it,
    rotary axes add up to the new head dim."""
    for key, value in values.items():
        if not _is_int(value):
            continue
        if key.endswith(("head_dim", "dim_head", "dim_heads")) or key == "d_kv":
            out[key] = min(value, HEAD_DIM)
        elif key.endswith("heads") and value > HEADS:
            out[key] = HEADS
    hidden, heads, head = (
        _first(values, _HIDDEN_KEYS),
        _first(values, _HEADS_KEYS),
        _first(values, _HEAD_DIM_KEYS),
    )
    if not heads or not (hidden or head):
        return
    if hidden:
        out[hidden] = min(values[hidden], WIDTH)
    old_head = values[head] if head else values[hidden] // max(values[heads], 1)
    new_head = out[head] if head else out[hidden] // max(out[heads], 1)
    old_inner = old_head * values[heads]
    for key, value in values.items():
        if _is_int(value) and value in (old_inner, values.get(hidden)) and _sizeish(key):
            out[key] = out[heads] * new_head if not hidden else out[hidden]
    for key, value in values.items():
        if not ("rope" in key or "axes_dim" in key) or not isinstance(value, (list, tuple)):
            continue
        if value and all(_is_int(v) for v in value):
            if sum(value) == old_head:
                out[key] = type(value)(_split(list(value), new_head, even=True))
            elif sum(value) * 2 == old_head:  # sections of the rotated half (M-RoPE)
                out[key] = type(value)(_split(list(value), new_head // 2, even=False))


def _split(parts: list[int], total: int, *, even: bool) -> list[int]:
    """``parts`` scaled to add up to ``total``, each at least 1 (2 and even when ``even``)."""
    step = 2 if even else 1
    old = sum(parts)
    scaled = [max(step, round(p * total / old / step) * step) for p in parts]
    scaled[scaled.index(max(scaled))] += total - sum(scaled)
    return scaled


_LAYER_NAMES = ("depth", "n_layers", "num_layers")


def _shrink_depth(values: dict[str, Any], out: dict[str, Any]) -> None:
    """At most 2 layers of each stack; per-layer lists keep the layers kept, and lists of
    layer indices (ControlNet injection points, skip layers) those below the new depth."""
    for key, value in values.items():
        if not _is_int(value) or value <= LAYERS:
            continue
        if key in _LAYER_NAMES or key.endswith(("_layers", "_depth", "_blocks")):
            out[key] = LAYERS
            old = value
            for other, items in values.items():
                if not isinstance(items, (list, tuple)) or not items:
                    continue
                if len(items) == old:
                    out[other] = type(items)(items[:LAYERS])
                elif "layer" in other and all(_is_int(i) and 0 <= i < old for i in items):
                    out[other] = type(items)(i for i in items if i < LAYERS)


def _sizeish(key: str) -> bool:
    return key not in _KEEP and (
        key in ("dim", "ch", "channels", "d_model", "n_embd", "d_ff", "model_dim")
        or key.endswith(("_dim", "_channels", "_channel", "hidden_size", "_size_ff", "_features"))
        or "_dim_" in key  # a second text encoder's width: cross_attention_dim_t5
        or key.endswith("intermediate_size")
    )


def _ffn(key: str) -> bool:
    return any(part in key for part in ("ff", "intermediate", "mlp", "ffn"))


def _shrink_widths(values: dict[str, Any], out: dict[str, Any], unet: bool, narrowest: int) -> None:
    """Every width above 64 to 64 (FFN widths above 128 to 128; base widths that channel
    multipliers scale above 32 to 32); absolute channel lists other than a UNet's blocks
    divided by a power of two."""
    multiplied = any("mult" in k and isinstance(v, (list, tuple)) for k, v in values.items())
    for key, value in values.items():
        if not _sizeish(key) or key.endswith(("head_dim", "dim_head")):
            continue
        if _is_int(value) and out[key] == value:
            limit = FFN if _ffn(key) else BLOCK_CHANNELS if multiplied else WIDTH
            if value > limit:
                out[key] = limit
        elif (
            isinstance(value, (list, tuple))
            and value
            and all(_is_int(v) and v > 0 for v in value)
            and key.endswith(("channels", "_dims"))
            and not (unet and key == "block_out_channels")
            and "rope" not in key
            and out[key] == value
        ):
            out[key] = type(value)(v // _channel_factor(value, narrowest) for v in value)


def _channel_factor(channels: list[int] | tuple[int, ...], narrowest: int) -> int:
    """The power of two an absolute channel list is divided by: its widest stage down to 128
    or less, its narrowest not below ``narrowest``, every stage still a multiple of the norm
    groups."""
    factor = 1
    while (
        max(channels) // factor > 4 * BLOCK_CHANNELS
        and min(channels) // (2 * factor) >= narrowest
        and all(c % (2 * factor * GROUPS) == 0 for c in channels)
    ):
        factor *= 2
    return factor


def alternate(values: dict[str, Any]) -> dict[str, Any]:
    """The fallback when :func:`shrink` does not build: every block kept, and channel lists
    narrowed to 32 at their narrowest, not 16 (some models hard-code 32 norm groups). A
    config that this shrinks as :func:`shrink` does has no other way: :class:`BuildSkip`."""
    out = shrink(values, truncate=False, narrowest=BLOCK_CHANNELS)
    if out == shrink(values):
        raise BuildSkip("its config has no blocks or channel lists to shrink another way")
    return out


#: How :func:`build_diffusers` shrinks a config, in the order tried.
SHRINKS: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = (shrink, alternate)
