"""Shrinking a ``transformers`` config to a model of a few million parameters.

:func:`shrink` narrows every size (2 layers, hidden size 64, 4 heads (2 key/value heads), FFN
128, vocabulary 128, 128 positions, 4 experts (2 per token), 32x32 images in 8x8 patches, 4
video frames, 32 audio positions, at most 2 stages of 1 block for staged vision models) and
makes the sizes tied to them follow; :func:`shallow` keeps the widths and cuts only depth,
vocabulary and experts, for configs whose widths cannot be narrowed consistently. Works on
config dicts: no torch, no transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_nobreak.models.hf.heads import scale_head_dims, scale_rope_sections, ssm_heads
from pytest_nobreak.models.hf.layers import cut_layers, follow_feature_layers, one_block_per_stage
from pytest_nobreak.models.hf.sizes import (
    AUDIO_POSITIONS,
    CODEC_CHANNELS,
    DEPTH_KEYS,
    EXPERTS,
    EXPERTS_PER_TOKEN,
    FFN,
    FRAMES,
    HEAD_KEYS,
    HEADS,
    HIDDEN,
    HIDDEN_KEYS,
    IMAGE,
    KV_HEADS,
    LAYER_KEYS,
    SHRUNK,
    SLIDING_WINDOW,
    VOCAB,
    remap_token_ids,
    sizeish,
)
from pytest_nobreak.models.hf.widths import cut_vocabularies, divide_widths, width_factor

__all__ = [
    "AUDIO_POSITIONS",
    "FRAMES",
    "IMAGE",
    "SHRINKS",
    "VOCAB",
    "first_layers",
    "proportional",
    "shallow",
    "shrink",
    "slim",
    "whole_backbone",
]


def shrink(
    values: dict[str, Any], *, every_kind: bool = True, whole_backbone: bool = False
) -> dict[str, Any]:
    """A config dict (``to_dict()``) shrunk by the rules in the module docstring, recursively
    into sub-configs (``text_config``, ``vision_config``, ``encoder``, ...).

    Sizes tied to a shrunk one follow it: an int equal to the old hidden size (``codebook_dim``,
    ``embedding_size``) becomes the new one, a list with one entry per layer (``layer_types``)
    or per stage keeps its first entries, a dict keyed by layer index its first layers.
    ``every_kind=False`` keeps the first layers only (see :func:`first_layers`);
    ``whole_backbone`` shrinks a backbone sub-config with :func:`shallow` (see
    :func:`whole_backbone`).
    """
    values = _unset_filled(values)
    out = dict(values)
    staged = isinstance(values.get("depths"), list) and len(values["depths"]) > 2
    for key, value in values.items():
        if staged and key in ("embed_dim", "hidden_size"):
            continue  # per-stage head counts must keep dividing the stage widths
        if isinstance(value, dict) and "model_type" in value:
            if whole_backbone and key == "backbone_config":
                out[key] = shallow(value)
            else:
                out[key] = shrink(value, every_kind=every_kind, whole_backbone=whole_backbone)
        elif key in SHRUNK and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = min(value, SHRUNK[key]) if key != "num_key_value_heads" else KV_HEADS
        elif key in SHRUNK and isinstance(value, list) and all(type(v) is int for v in value):
            out[key] = [min(v, SHRUNK[key]) for v in value]  # one per layer (Gemma 3n's FFNs)
    if values.get("num_key_value_heads") == values.get("num_attention_heads") is not None:
        out["num_key_value_heads"] = out["num_attention_heads"]  # no grouped queries: none made
    head_dim = values.get("head_dim")
    if isinstance(head_dim, int):
        hidden, heads = out.get("hidden_size", HIDDEN), out.get("num_attention_heads", HEADS)
        out["head_dim"] = max(hidden // max(heads, 1), 1)
    _follow(values, out, every_kind)
    scale_head_dims(values, out)
    ssm_heads(values, out)
    if isinstance(head_dim, int) and head_dim == values.get("qk_rope_head_dim"):
        out["head_dim"] = out["qk_rope_head_dim"]  # latent attention's head_dim is its rope part
    scale_rope_sections(values, out)
    if isinstance(values.get("image_size"), int) and isinstance(values.get("window_size"), int):
        # A window wider than the shrunk patch grid pads every stage to it; 2 divides them all.
        out["window_size"] = min(values["window_size"], 2)
    one_block_per_stage(values, out)
    _follow_across(values, out)
    follow_feature_layers(values, out)
    width = values.get("width_coefficient")
    if "downsampling_ratios" in values and type(values.get("encoder_hidden_size")) is int:
        # A codec's (DAC's) first encoder channels, which double per down-sampling stage.
        out["encoder_hidden_size"] = min(values["encoder_hidden_size"], CODEC_CHANNELS)
    head = values.get("hidden_dim")
    if isinstance(width, float) and type(head) is int and out.get("width_coefficient") != width:
        # EfficientNet's head width is scaled by its width coefficient too.
        out["hidden_dim"] = round(head * out["width_coefficient"] / width)
    depths = values.get("depths") or []
    if staged:
        # Staged models (Swin, ConvNeXt, ResNet): keep 2 stages of 1 block; every per-stage
        # list of the same length keeps its first two entries so the stages stay consistent.
        for key, value in values.items():
            if isinstance(value, list) and len(value) == len(depths):
                out[key] = value[:2]
            elif isinstance(value, list) and len(value) == len(depths) - 1 and "ratio" in key:
                out[key] = value[:1]  # between stages (down-sampling ratios): the one kept
        out["depths"] = [1, 1]
        if "num_stages" in out:
            out["num_stages"] = 2
    for key in ("out_features", "out_indices", "stage_names"):
        out.pop(key, None)  # a backbone's outputs, derived from its stages: recomputed
    embed = values.get("embed_dim")
    # A staged model's width doubles per stage: its final width follows the kept stages.
    if (
        staged
        and isinstance(embed, int)
        and values.get("hidden_size") == embed * 2 ** (len(depths) - 1)
    ):
        out["hidden_size"] = values["embed_dim"] * 2 ** (len(out["depths"]) - 1)
    remap_token_ids(out, out.get("vocab_size"))
    return out


#: Sizes some configs leave unset by default (``None``) though their model needs them: what
#: a released checkpoint of the architecture sets, before shrinking.
_UNSET = {
    "vocab_size": VOCAB,
    "n_routed_experts": EXPERTS,
    "num_experts": EXPERTS,
    "n_shared_experts": 1,
    "num_experts_per_tok": EXPERTS_PER_TOKEN,
    "top_k_experts": EXPERTS_PER_TOKEN,
    "n_group": 1,
    "topk_group": 1,
    "prediction_length": 8,  # time series: the steps forecast (its context defaults to it)
    "pad_token_id": 0,  # ESM's position ids count the tokens that are not padding
    "moe_intermediate_size": FFN,
}


def _unset_filled(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the sizes it leaves unset given: those of :data:`_UNSET`, the key/value
    heads (as many as the query heads), the head width (hidden size over heads), a sliding
    window for sliding layers, and rotary parameters for each kind of layer."""
    unset = {key for key, value in values.items() if value is None}
    kinds = values.get("layer_types")
    rope_unset = isinstance(kinds, list) and values.get("rope_parameters") == {}
    if not unset and not rope_unset:
        return values
    out = dict(values)
    if rope_unset and isinstance(kinds, list):
        # Rotary parameters per kind of layer, which the model looks up by its layer types
        # (Cohere Compass): a released checkpoint's, the default rotation.
        out["rope_parameters"] = {
            str(kind): {"rope_type": "default", "rope_theta": 10000.0} for kind in kinds
        }
    for key in unset & set(_UNSET):
        out[key] = _UNSET[key]
    hidden = next((values[k] for k in HIDDEN_KEYS if type(values.get(k)) is int), None)
    heads = next((values[k] for k in HEAD_KEYS if type(values.get(k)) is int), None)
    if "num_key_value_heads" in unset and heads:
        out["num_key_value_heads"] = heads
    if "head_dim" in unset and hidden and heads:
        out["head_dim"] = hidden // heads
    sliding = isinstance(kinds, list) and "sliding_attention" in kinds
    # Step 3.7 builds a sliding mask for every forward; only its head count tells.
    sliding = sliding or bool(values.get("num_sliding_attention_heads"))
    if "sliding_window" in unset and sliding:
        out["sliding_window"] = SLIDING_WINDOW  # sliding layers need a window
    return out


def _follow(values: dict[str, Any], out: dict[str, Any], every_kind: bool) -> None:
    """Make the sizes tied to a shrunk one follow it (see :func:`shrink`)."""
    for hidden_key in HIDDEN_KEYS:
        old, new = values.get(hidden_key), out.get(hidden_key)
        if isinstance(old, int) and isinstance(new, int) and new != old:
            break
    else:
        old = new = None
    for key, value in values.items():
        if key in SHRUNK or isinstance(value, bool):
            continue
        if old is not None and isinstance(value, int) and value == old and sizeish(key):
            out[key] = new
        elif old is not None and isinstance(value, list) and value and set(value) == {old}:
            out[key] = [new] * len(value)  # one per level of a detector's neck, all that size
    cut_layers(values, out, every_kind)


def _follow_across(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Sizes tied to another sub-config's hidden size follow it (an audio encoder's
    ``out_hidden_size``, equal to the text model's width; a head's ``audio_hidden_size``,
    equal to the audio encoder's). A size several sub-configs had is the text model's."""
    subs = [k for k, v in values.items() if isinstance(v, dict) and "model_type" in v]
    subs.sort(key=lambda k: k != "text_config")
    sizes: dict[int, int] = {}
    for sub in subs:
        for hidden_key in HIDDEN_KEYS:
            old, new = values[sub].get(hidden_key), out[sub].get(hidden_key)
            if type(old) is int and type(new) is int and old != new:
                sizes.setdefault(old, new)
                break
    for before, after in [(values, out), *((values[k], out[k]) for k in subs)]:
        for key, value in before.items():
            if type(value) is not int or value not in sizes or key in SHRUNK:
                continue
            if sizeish(key) and after.get(key) == value:
                after[key] = sizes[value]


def first_layers(values: dict[str, Any]) -> dict[str, Any]:
    """:func:`shrink`, keeping only the first layers even when ``layer_types`` names kinds they
    lack (a kind that cannot be built from the config's defaults, such as an indexed attention
    layer whose token budget is unset)."""
    return shrink(values, every_kind=False)


def whole_backbone(values: dict[str, Any]) -> dict[str, Any]:
    """:func:`shrink`, but a backbone sub-config keeps every stage (of one block) and its
    outputs, as :func:`shallow` does: a detector's neck takes the widths of the stages it
    names (RT-DETR's ``encoder_in_channels``)."""
    return shrink(values, whole_backbone=True)


def shallow(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict with only its depth, vocabulary and expert counts shrunk (widths kept):
    the fallback for a config whose widths :func:`shrink` cannot narrow consistently. Lists and
    dicts with one entry per layer keep their first layers; staged models keep every stage, of
    one block each."""
    values = _unset_filled(values)
    out = dict(values)
    for key, value in values.items():
        if isinstance(value, dict) and "model_type" in value:
            out[key] = shallow(value)
        elif key in _SHALLOW and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, SHRUNK[key])
    depths = values.get("depths")
    if isinstance(depths, list):
        out["depths"] = [1] * len(depths)
        for key in LAYER_KEYS:
            if values.get(key) == len(depths):
                out[key] = len(depths)  # a count of the stages, which are all kept
    cut_layers(values, out)
    follow_feature_layers(values, out)
    scale_rope_sections(values, out)
    if any(out.get(k) != values.get(k) for k in LAYER_KEYS):
        for key in ("out_features", "out_indices", "stage_names"):
            out.pop(key, None)  # a backbone's outputs, derived from its stages: recomputed
    remap_token_ids(out, out.get("vocab_size"))
    return out


def proportional(values: dict[str, Any], *, finer: int = 1) -> dict[str, Any]:
    """:func:`shallow`, then every width divided by one power of two (the same for the whole
    config and its sub-configs), so sums, splits and ratios between widths stay whole: the
    fallback for a config too big when shallow and too intricate for :func:`shrink`. Counts
    (heads, experts, groups of heads), spatial sizes and input features keep their values;
    every vocabulary is cut to :data:`VOCAB`. ``finer`` divides the widths that much more."""
    values = _unset_filled(values)
    out = shallow(values)
    factor = width_factor(values) * finer
    cut_vocabularies(out)
    if factor > 1:
        divide_widths(out, factor)
        _follow_rope_sections(values, out)
    return out


def slim(values: dict[str, Any]) -> dict[str, Any]:
    """:func:`proportional` with widths four times narrower: for a config still too big."""
    return proportional(values, finer=4)


def _follow_rope_sections(values: dict[str, Any], out: dict[str, Any]) -> None:
    scale_rope_sections(values, out)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            _follow_rope_sections(value, out[key])


#: How :func:`build_hf` shrinks a config, in the order tried: narrow; shallow; shallow with
#: every width divided alike; narrow to the first layers only; every width divided alike and
#: narrower still; narrow but for a backbone's stages.
SHRINKS: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = (
    shrink,
    shallow,
    proportional,
    first_layers,
    slim,
    whole_backbone,
)
_SHALLOW = {key for key in SHRUNK if key in DEPTH_KEYS or key == "vocab_size" or "expert" in key}
