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

__all__ = [
    "AUDIO_POSITIONS",
    "FRAMES",
    "IMAGE",
    "SHRINKS",
    "VOCAB",
    "shallow",
    "shrink",
]

#: The shrunk sizes (one source: the docs quote this module's docstring).
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, POSITIONS = 2, 64, 4, 2, 128, 128, 128
EXPERTS, EXPERTS_PER_TOKEN, IMAGE, PATCH, AUDIO_POSITIONS, FRAMES = 4, 2, 32, 8, 32, 4
_SET = {
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "num_layers",
            "n_layer",
            "n_layers",
            "encoder_layers",
            "decoder_layers",
            "num_encoder_layers",
            "num_decoder_layers",
        ),
        LAYERS,
    ),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim"), HIDDEN),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "n_heads",
            "num_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
        ),
        HEADS,
    ),
    "num_key_value_heads": KV_HEADS,
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "n_inner",
            "d_ff",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
        ),
        FFN,
    ),
    "vocab_size": VOCAB,
    **dict.fromkeys(("max_position_embeddings", "max_target_positions"), POSITIONS),
    # Whisper-like encoders take exactly 2x this many audio frames.
    "max_source_positions": AUDIO_POSITIONS,
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), EXPERTS),
    "num_experts_per_tok": EXPERTS_PER_TOKEN,
    # Grouped routing picks groups of experts first: one group holds the 4 left.
    **dict.fromkeys(("n_group", "num_expert_group", "topk_group"), 1),
    # Dense layers before the first MoE one: with 2 layers, the second is MoE.
    "first_k_dense_replace": 1,
    "image_size": IMAGE,
    "num_frames": FRAMES,
    "patch_size": PATCH,
}
_LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
_TOKEN_IDS = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "sep_token_id",
)


def shrink(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict (``to_dict()``) shrunk by the rules in the module docstring, recursively
    into sub-configs (``text_config``, ``vision_config``, ``encoder``, ...).

    Sizes tied to a shrunk one follow it: an int equal to the old hidden size (``codebook_dim``,
    ``embedding_size``) becomes the new one, a list with one entry per layer (``layer_types``)
    or per stage keeps its first entries, a dict keyed by layer index its first layers.
    """
    out = dict(values)
    staged = isinstance(values.get("depths"), list) and len(values["depths"]) > 2
    for key, value in values.items():
        if staged and key in ("embed_dim", "hidden_size"):
            continue  # per-stage head counts must keep dividing the stage widths
        if isinstance(value, dict) and "model_type" in value:
            out[key] = shrink(value)
        elif key in _SET and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, _SET[key]) if key != "num_key_value_heads" else KV_HEADS
    if values.get("num_key_value_heads") == values.get("num_attention_heads") is not None:
        out["num_key_value_heads"] = out["num_attention_heads"]  # no grouped queries: none made
    head_dim = values.get("head_dim")
    if isinstance(head_dim, int):
        hidden, heads = out.get("hidden_size", HIDDEN), out.get("num_attention_heads", HEADS)
        out["head_dim"] = max(hidden // max(heads, 1), 1)
    _follow(values, out)
    _scale_head_dims(values, out)
    if isinstance(head_dim, int) and head_dim == values.get("qk_rope_head_dim"):
        out["head_dim"] = out["qk_rope_head_dim"]  # latent attention's head_dim is its rope part
    if isinstance(values.get("image_size"), int) and isinstance(values.get("window_size"), int):
        # A window wider than the shrunk patch grid pads every stage to it; 2 divides them all.
        out["window_size"] = min(values["window_size"], 2)
    depths = values.get("depths") or []
    if staged:
        # Staged models (Swin, ConvNeXt, ResNet): keep 2 stages of 1 block; every per-stage
        # list of the same length keeps its first two entries so the stages stay consistent.
        for key, value in values.items():
            if isinstance(value, list) and len(value) == len(depths):
                out[key] = value[:2]
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
    _remap_token_ids(out, out.get("vocab_size"))
    return out


def _remap_token_ids(out: dict[str, Any], vocab: Any) -> None:
    """Token ids beyond the shrunk vocabulary (special, image and audio placeholder tokens)
    move to its top, each to an id of its own and in their old order, so a model that splices
    features in at its placeholders still finds each one."""
    text = out.get("text_config")
    if not isinstance(vocab, int) and isinstance(text, dict):
        vocab = text.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 8:
        return
    keys = [
        key
        for key, value in out.items()
        if (key in _TOKEN_IDS or key.endswith(("_token_id", "_token_index")))
        and isinstance(value, int)
        and not isinstance(value, bool)
        and value >= vocab
    ]
    placeholders = sorted((k for k in keys if k not in _TOKEN_IDS), key=lambda k: (out[k], k))
    for key in keys:
        if key in _TOKEN_IDS:
            out[key] = vocab - 1  # pad/bos/eos may share an id: the last one is theirs
    for rank, key in enumerate(placeholders):
        out[key] = vocab - 1 - len(placeholders) + rank
    for value in out.values():
        if isinstance(value, dict) and "model_type" in value and "vocab_size" not in value:
            _remap_token_ids(value, vocab)


#: Per-head sizes of attention variants (latent attention's rope/nope/value parts, a
#: partial rotary embedding's width).
_HEAD_DIM_SUFFIXES = ("head_dim", "rotary_dim")
_HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
#: Low-rank projections, sized against the hidden size.
_RANK_SUFFIX = "_rank"


def _scale_head_dims(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Per-head sizes (``qk_rope_head_dim``, ``v_head_dim``, ...) shrink by the factor the head
    dimension did, and low-rank sizes (``kv_lora_rank``) by the hidden size's, each a power of
    two so their sums and splits stay whole."""
    hidden_key = next((k for k in _HIDDEN_KEYS if isinstance(values.get(k), int)), "")
    heads_key = next((k for k in _HEAD_KEYS if isinstance(values.get(k), int)), "")
    got = (values.get(hidden_key), out.get(hidden_key), values.get(heads_key), out.get(heads_key))
    sizes = [v for v in got if isinstance(v, int) and v > 0]
    if len(sizes) < len(got):
        return
    old_hidden, new_hidden, old_heads, new_heads = sizes
    old_head = values.get("head_dim") or old_hidden // old_heads
    new_head = out.get("head_dim") or new_hidden // new_heads
    head_factor = _power_of_two(old_head / max(new_head, 1))
    hidden_factor = _power_of_two(old_hidden / new_hidden)
    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or key == "head_dim":
            continue
        if key.endswith(_HEAD_DIM_SUFFIXES) and head_factor > 1:
            out[key] = max(value // head_factor, 2)
        elif key.endswith(_RANK_SUFFIX) and value >= 16 and hidden_factor > 1:
            out[key] = max(value // hidden_factor, 16)


def _power_of_two(ratio: float) -> int:
    """The largest power of two not above ``ratio`` (1 for a ratio below 2)."""
    factor = 1
    while factor * 2 <= ratio:
        factor *= 2
    return factor


def _follow(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Make the sizes tied to a shrunk one follow it (see :func:`shrink`)."""
    for hidden_key in _HIDDEN_KEYS:
        old, new = values.get(hidden_key), out.get(hidden_key)
        if isinstance(old, int) and isinstance(new, int) and new != old:
            break
    else:
        old = new = None
    layers_key = next((k for k in _LAYER_KEYS if isinstance(values.get(k), int)), None)
    old_layers = values.get(layers_key) if layers_key else None
    new_layers = out.get(layers_key) if layers_key else None
    for key, value in values.items():
        if key in _SET or isinstance(value, bool):
            continue
        if old is not None and isinstance(value, int) and value == old and _sizeish(key):
            out[key] = new
        elif old_layers and isinstance(value, list) and len(value) == old_layers > 2:
            out[key] = value[:new_layers]
        elif (
            old_layers
            and isinstance(value, dict)
            and value
            and all(isinstance(k, (int, str)) and str(k).isdigit() for k in value)
        ):
            out[key] = {k: v for k, v in value.items() if int(k) < int(new_layers or LAYERS)}


def _sizeish(key: str) -> bool:
    return any(part in key for part in ("dim", "size", "hidden", "width", "channels", "groups"))


def shallow(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict with only its depth, vocabulary and expert counts shrunk (widths kept):
    the fallback for a config whose widths :func:`shrink` cannot narrow consistently. Lists and
    dicts with one entry per layer keep their first layers; staged models keep every stage, of
    one block each."""
    out = dict(values)
    for key, value in values.items():
        if isinstance(value, dict) and "model_type" in value:
            out[key] = shallow(value)
        elif key in _SHALLOW and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, _SET[key])
    layers_key = next((k for k in _LAYER_KEYS if isinstance(values.get(k), int)), None)
    if layers_key:
        old, new = values[layers_key], out[layers_key]
        for key, value in values.items():
            if key in _SHALLOW or isinstance(value, bool):
                continue
            if isinstance(value, list) and len(value) == old > 2:
                out[key] = value[:new]
            elif isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
                out[key] = {k: v for k, v in value.items() if int(k) < new}
    if isinstance(values.get("depths"), list):
        out["depths"] = [1] * len(values["depths"])
    _remap_token_ids(out, out.get("vocab_size"))
    return out


#: How :func:`build_hf` shrinks a config, in the order tried: narrow, then shallow.
SHRINKS: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = (shrink, shallow)
_SHALLOW = {
    key
    for key, value in _SET.items()
    if value == LAYERS or key in ("vocab_size", "num_experts_per_tok") or "expert" in key
}
