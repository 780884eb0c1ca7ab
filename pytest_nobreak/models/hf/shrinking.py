"""Shrinking a ``transformers`` config to a model of a few million parameters.

:func:`shrink` narrows every size (2 layers, hidden size 64, 4 heads (2 key/value heads), FFN
128, vocabulary 128, 128 positions, 4 experts (2 per token), 32x32 images in 8x8 patches, 4
video frames, 32 audio positions, at most 2 stages of 1 block for staged vision models) and
makes the sizes tied to them follow; :func:`shallow` keeps the widths and cuts only depth,
vocabulary and experts, for configs whose widths cannot be narrowed consistently. Works on
config dicts: no torch, no transformers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

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
]

#: The shrunk sizes (one source: the docs quote this module's docstring).
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, POSITIONS = 2, 64, 4, 2, 128, 128, 128
EXPERTS, EXPERTS_PER_TOKEN, IMAGE, PATCH, AUDIO_POSITIONS, FRAMES = 4, 2, 32, 8, 32, 4
#: Depths: of a stack of layers, of an encoder or a decoder, of a vision tower's blocks.
_DEPTH_KEYS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "depth",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
    "num_self_attends_per_block",  # Perceiver's latent transformer
)
_SET = {
    **dict.fromkeys(_DEPTH_KEYS, LAYERS),
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
    "d_latents": HIDDEN,  # Perceiver: its latents' width and count
    "num_latents": 32,
    # EfficientNet's compound scaling: the B0 network, which the per-stage lists describe.
    **dict.fromkeys(("depth_coefficient", "width_coefficient"), 1),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), EXPERTS),
    **dict.fromkeys(
        ("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "moe_topk"),
        EXPERTS_PER_TOKEN,
    ),
    # Grouped routing picks groups of experts first: one group holds the 4 left.
    **dict.fromkeys(("n_group", "num_expert_group", "topk_group"), 1),
    # Dense layers before the first MoE one: with 2 layers, the second is MoE.
    "first_k_dense_replace": 1,
    "image_size": IMAGE,
    "num_frames": FRAMES,
    "patch_size": PATCH,
}
_LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "depth")
_TOKEN_IDS = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "sep_token_id",
)


def shrink(values: dict[str, Any], *, every_kind: bool = True) -> dict[str, Any]:
    """A config dict (``to_dict()``) shrunk by the rules in the module docstring, recursively
    into sub-configs (``text_config``, ``vision_config``, ``encoder``, ...).

    Sizes tied to a shrunk one follow it: an int equal to the old hidden size (``codebook_dim``,
    ``embedding_size``) becomes the new one, a list with one entry per layer (``layer_types``)
    or per stage keeps its first entries, a dict keyed by layer index its first layers.
    """
    values = _unset_filled(values)
    out = dict(values)
    staged = isinstance(values.get("depths"), list) and len(values["depths"]) > 2
    for key, value in values.items():
        if staged and key in ("embed_dim", "hidden_size"):
            continue  # per-stage head counts must keep dividing the stage widths
        if isinstance(value, dict) and "model_type" in value:
            out[key] = shrink(value, every_kind=every_kind)
        elif key in _SET and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, _SET[key]) if key != "num_key_value_heads" else KV_HEADS
        elif key in _SET and isinstance(value, list) and all(type(v) is int for v in value):
            out[key] = [min(v, _SET[key]) for v in value]  # one per layer (Gemma 3n's FFNs)
    if values.get("num_key_value_heads") == values.get("num_attention_heads") is not None:
        out["num_key_value_heads"] = out["num_attention_heads"]  # no grouped queries: none made
    head_dim = values.get("head_dim")
    if isinstance(head_dim, int):
        hidden, heads = out.get("hidden_size", HIDDEN), out.get("num_attention_heads", HEADS)
        out["head_dim"] = max(hidden // max(heads, 1), 1)
    _follow(values, out, every_kind)
    _scale_head_dims(values, out)
    _ssm_heads(values, out)
    if isinstance(head_dim, int) and head_dim == values.get("qk_rope_head_dim"):
        out["head_dim"] = out["qk_rope_head_dim"]  # latent attention's head_dim is its rope part
    _scale_rope_sections(values, out)
    if isinstance(values.get("image_size"), int) and isinstance(values.get("window_size"), int):
        # A window wider than the shrunk patch grid pads every stage to it; 2 divides them all.
        out["window_size"] = min(values["window_size"], 2)
    _one_block_per_stage(values, out)
    _follow_across(values, out)
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
}


def _unset_filled(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the sizes it leaves unset given: those of :data:`_UNSET`, the key/value
    heads (as many as the query heads) and the head width (hidden size over heads)."""
    unset = {key for key, value in values.items() if value is None}
    if not unset:
        return values
    out = dict(values)
    for key in unset & set(_UNSET):
        out[key] = _UNSET[key]
    hidden = next((values[k] for k in _HIDDEN_KEYS if type(values.get(k)) is int), None)
    heads = next((values[k] for k in _HEAD_KEYS if type(values.get(k)) is int), None)
    if "num_key_value_heads" in unset and heads:
        out["num_key_value_heads"] = heads
    if "head_dim" in unset and hidden and heads:
        out["head_dim"] = hidden // heads
    return out


#: Blocks per stage of a network whose stages the shrink keeps (EfficientNet, Hiera).
_REPEATS = ("num_block_repeats", "blocks_per_stage")


def _one_block_per_stage(values: dict[str, Any], out: dict[str, Any]) -> None:
    """One block in each stage; block indices (Hiera's ``global_attention_blocks``) point at
    the last block."""
    for key in _REPEATS:
        repeats = values.get(key)
        if isinstance(repeats, list) and repeats and all(type(v) is int for v in repeats):
            out[key] = [1] * len(repeats)
            for other, blocks in values.items():
                if other.endswith("_blocks") and isinstance(blocks, list) and blocks:
                    out[other] = [len(repeats) - 1]


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
_HEAD_DIM_SUFFIXES = ("head_dim", "rotary_dim", "d_head")
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


#: A state-space mixer's heads, head width and expansion: heads x width = expand x hidden.
_SSM_HEADS = (
    ("mamba_n_heads", "mamba_d_head", "mamba_expand"),
    ("n_mamba_heads", "mamba_headdim", "mamba_expand"),
    ("mamba_num_heads", "mamba_head_dim", "expand"),
    ("num_heads", "head_dim", "expand"),
)
#: Heads of a shrunk state-space mixer.
SSM_HEADS = 8


def _ssm_heads(values: dict[str, Any], out: dict[str, Any]) -> None:
    """A Mamba-2 mixer's heads times their width is the expanded hidden size: keep that true."""
    hidden, old_hidden = out.get("hidden_size"), values.get("hidden_size")
    for heads_key, width_key, expand_key in _SSM_HEADS:
        found = [values.get(k) for k in (heads_key, width_key, expand_key)]
        sizes = [v for v in (*found, hidden, old_hidden) if type(v) is int and v > 0]
        if len(sizes) < 5:
            continue
        heads, width, expand, new_hidden, old = sizes
        if heads * width != expand * old:
            continue
        new_heads = min(int(out[heads_key]), SSM_HEADS, expand * new_hidden)
        out[heads_key], out[width_key] = new_heads, expand * new_hidden // new_heads
        for key in ("n_groups", "mamba_n_groups", "mamba_ngroups"):
            groups = values.get(key)
            if type(groups) is int and groups > 0:
                out[key] = math.gcd(groups, new_heads)  # groups of heads share a state
        return


def _power_of_two(ratio: float) -> int:
    """The largest power of two not above ``ratio`` (1 for a ratio below 2)."""
    factor = 1
    while factor * 2 <= ratio:
        factor *= 2
    return factor


def _follow(values: dict[str, Any], out: dict[str, Any], every_kind: bool) -> None:
    """Make the sizes tied to a shrunk one follow it (see :func:`shrink`)."""
    for hidden_key in _HIDDEN_KEYS:
        old, new = values.get(hidden_key), out.get(hidden_key)
        if isinstance(old, int) and isinstance(new, int) and new != old:
            break
    else:
        old = new = None
    for key, value in values.items():
        if key in _SET or isinstance(value, bool):
            continue
        if old is not None and isinstance(value, int) and value == old and _sizeish(key):
            out[key] = new
    _cut_layers(values, out, every_kind)


def _follow_across(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Sizes tied to another sub-config's hidden size follow it (an audio encoder's
    ``out_hidden_size``, equal to the text model's width; a head's ``audio_hidden_size``,
    equal to the audio encoder's). A size several sub-configs had is the text model's."""
    subs = [k for k, v in values.items() if isinstance(v, dict) and "model_type" in v]
    subs.sort(key=lambda k: k != "text_config")
    sizes: dict[int, int] = {}
    for sub in subs:
        for hidden_key in _HIDDEN_KEYS:
            old, new = values[sub].get(hidden_key), out[sub].get(hidden_key)
            if type(old) is int and type(new) is int and old != new:
                sizes.setdefault(old, new)
                break
    for before, after in [(values, out), *((values[k], out[k]) for k in subs)]:
        for key, value in before.items():
            if type(value) is not int or value not in sizes or key in _SET:
                continue
            if _sizeish(key) and after.get(key) == value:
                after[key] = sizes[value]


def _cut_layers(values: dict[str, Any], out: dict[str, Any], every_kind: bool = True) -> None:
    """Per-layer entries follow the cut in depth: the layers kept are the first ones, plus the
    first of each kind ``layer_types`` names (a hybrid keeps an attention layer, a model with
    indexed layers one of those; the depth grows to hold them). A list with one entry per layer
    keeps the kept layers' entries, a dict keyed by layer index their entries, renumbered; a
    list of layer indices (``index_layers``, ``kv_source_layers``) points at the kept layers."""
    layers_key = next((k for k in _LAYER_KEYS if isinstance(values.get(k), int)), None)
    if layers_key is None or out.get(layers_key) == values[layers_key]:
        return
    old = values[layers_key]
    new = min(int(out[layers_key]), old)
    kept: set[int] = set()
    kinds = values.get("layer_types")
    if every_kind and isinstance(kinds, list) and len(kinds) == old:
        kept = {kinds.index(kind) for kind in dict.fromkeys(map(str, kinds))}
    parts = _depth_parts(values, layers_key)
    if parts:  # the depth is the sum of sections (input, recurrent, output): one layer each
        kept = {sum(values[k] for k in parts[:i]) for i in range(len(parts))}
        out.update(dict.fromkeys(parts, 1))
        new = len(parts)
    kept |= set(range(old)[: max(new - len(kept), 0)])
    for layer in range(old):  # the first free ones, up to the depth asked for
        if len(kept) >= new:
            break
        kept.add(layer)
    order = sorted(kept)
    out[layers_key] = len(order)
    where = {layer: rank for rank, layer in enumerate(order)}
    for key, value in values.items():
        if isinstance(value, bool) or (key in _SET and not isinstance(value, list)):
            continue
        if isinstance(value, list) and len(value) == old > 2:
            source = out[key] if isinstance(out.get(key), list) else value
            picked = [source[i] for i in order]
            out[key] = _pointing(key, picked, where) if _is_layer_list(key, value, old) else picked
        elif isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
            out[key] = {type(k)(where[int(k)]): v for k, v in value.items() if int(k) in where}
        elif _is_layer_list(key, value, old):
            out[key] = _pointing(key, value, where)


def _depth_parts(values: dict[str, Any], layers_key: str) -> list[str]:
    """Counts of layers that add up to the depth (``n_input_layers``, ``n_recurrent_layers``,
    ``n_output_layers``), or none."""
    parts = [
        key
        for key, value in values.items()
        if key != layers_key
        and key.endswith("_layers")
        and type(value) is int
        and 0 < value < values[layers_key]
    ]
    return parts if len(parts) > 1 and sum(values[k] for k in parts) == values[layers_key] else []


def _is_layer_list(key: str, value: Any, layers: int) -> bool:
    """A list of layer indices (``moe_layers``, ``index_layers``, ``kv_source_layers``), not of
    per-layer flags (``no_rope_layers``): with one entry per layer, each entry points at its
    own layer or an earlier one."""
    if not ("layer" in key and isinstance(value, list) and value):
        return False
    if not all(type(v) is int and 0 <= v < layers for v in value):
        return False
    return len(value) != layers or all(v <= i for i, v in enumerate(value))


def _pointing(key: str, indices: list[int], where: dict[int, int]) -> list[int]:
    """Layer indices mapped to the kept layers': those not kept dropped (a list that would be
    left empty points at the nearest kept layer instead)."""
    mapped = [where[i] for i in indices if i in where]
    if mapped or not indices:
        return mapped
    nearest = min(where, key=lambda layer: abs(layer - indices[0]))
    return [where[nearest]]


def _scale_rope_sections(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Multimodal rotary sections (``mrope_section``: time, height, width) split half a head:
    they keep their proportions and sum to half the shrunk head."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = values.get(key)
        if not isinstance(rope, dict):
            continue
        sections = rope.get("mrope_section")
        if not (isinstance(sections, list) and sections and all(type(v) is int for v in sections)):
            continue
        old_half, new_half = sum(sections), _half_head(out, rope)
        if new_half is None or new_half == old_half or new_half < len(sections):
            continue
        scaled = [max(v * new_half // old_half, 1) for v in sections]
        scaled[0] += new_half - sum(scaled)
        out[key] = {**rope, "mrope_section": scaled}


def _half_head(out: dict[str, Any], rope: dict[str, Any]) -> int | None:
    """Half the rotary part of a head of the shrunk config (a partial rotary embedding turns
    only ``partial_rotary_factor`` of it)."""
    head = None
    for key in ("qk_rope_head_dim", "head_dim"):
        value = out.get(key)
        if isinstance(value, int) and value > 1:
            head = value
            break
    hidden = next((out[k] for k in _HIDDEN_KEYS if isinstance(out.get(k), int)), None)
    heads = next((out[k] for k in _HEAD_KEYS if isinstance(out.get(k), int)), None)
    if head is None and hidden and heads:
        head = int(hidden) // int(heads)
    if head is None:
        return None
    factor = rope.get("partial_rotary_factor", out.get("partial_rotary_factor", 1))
    return int(head * factor) // 2 if isinstance(factor, (int, float)) else head // 2


def _sizeish(key: str) -> bool:
    return any(part in key for part in ("dim", "size", "hidden", "width", "channels", "groups"))


def first_layers(values: dict[str, Any]) -> dict[str, Any]:
    """:func:`shrink`, keeping only the first layers even when ``layer_types`` names kinds they
    lack (a kind that cannot be built from the config's defaults, such as an indexed attention
    layer whose token budget is unset)."""
    return shrink(values, every_kind=False)


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
            out[key] = min(value, _SET[key])
    depths = values.get("depths")
    if isinstance(depths, list):
        out["depths"] = [1] * len(depths)
        for key in _LAYER_KEYS:
            if values.get(key) == len(depths):
                out[key] = len(depths)  # a count of the stages, which are all kept
    _cut_layers(values, out)
    _scale_rope_sections(values, out)
    if any(out.get(k) != values.get(k) for k in _LAYER_KEYS):
        for key in ("out_features", "out_indices", "stage_names"):
            out.pop(key, None)  # a backbone's outputs, derived from its stages: recomputed
    _remap_token_ids(out, out.get("vocab_size"))
    return out


def proportional(values: dict[str, Any], *, finer: int = 1) -> dict[str, Any]:
    """:func:`shallow`, then every width divided by one power of two (the same for the whole
    config and its sub-configs), so sums, splits and ratios between widths stay whole: the
    fallback for a config too big when shallow and too intricate for :func:`shrink`. Counts
    (heads, experts, groups of heads), spatial sizes and input features keep their values;
    every vocabulary is cut to :data:`VOCAB`. ``finer`` divides the widths that much more."""
    values = _unset_filled(values)
    out = shallow(values)
    factor = _width_factor(values) * finer
    _cut_vocabularies(out)
    if factor > 1:
        _divide_widths(out, factor)
        _follow_rope_sections(values, out)
    return out


def slim(values: dict[str, Any]) -> dict[str, Any]:
    """:func:`proportional` with widths four times narrower: for a config still too big."""
    return proportional(values, finer=4)


def _follow_rope_sections(values: dict[str, Any], out: dict[str, Any]) -> None:
    _scale_rope_sections(values, out)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            _follow_rope_sections(value, out[key])


#: Parts of a key that name a width (of a hidden state, a projection, a channel stack).
_WIDTH_PARTS = ("hidden", "dim", "width", "channels", "intermediate", "ffn", "_rank", "n_embd")
_WIDTH_KEYS = ("d_model", "d_ff", "n_inner", "embed_dim", "emb_dim", "d_inner", "d_kv")
#: Parts of a key that name something else that happens to be a size: spatial and temporal
#: extents, counts, input features the data fixes, token ids.
_NOT_WIDTH = (
    "image",
    "patch",
    "kernel",
    "window",
    "stride",
    "position",
    "max_",
    "vocab",
    "num_channels",
    "in_channels",
    "input_channels",
    "out_channels",
    "mel",
    "feature_size",
    "sampling",
    "hop",
    "token",
    "pool",
    "frame",
    "sample",
    "chunk",
    "context",
    "bucket",
    "grid",
    "spatial",
    "temporal",
    "num_",
    "layers",
    "_id",
)


def _is_width(key: str) -> bool:
    if key in _WIDTH_KEYS:
        return True
    return any(p in key for p in _WIDTH_PARTS) and not any(p in key for p in _NOT_WIDTH)


def _width_factor(values: dict[str, Any]) -> int:
    """The largest power of two that brings the widest hidden size towards :data:`HIDDEN` while
    every head keeps at least 16 dimensions (rotary sections split a head in three)."""
    hidden = _first_int(values, (*_HIDDEN_KEYS, "embed_dim", "emb_dim", "dim"))
    if hidden is None:
        return 1
    heads = _first_int(values, _HEAD_KEYS) or 1
    head = _first_int(values, ("head_dim",)) or max(hidden // heads, 1)
    return max(min(_power_of_two(hidden / HIDDEN), _power_of_two(head / 16)), 1)


def _first_int(values: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    """The first of ``keys`` that is an int here, else in the text sub-config."""
    for where in (values, values.get("text_config")):
        if isinstance(where, dict):
            for key in keys:
                value = where.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return None


def _divide_widths(out: dict[str, Any], factor: int) -> None:
    for key, value in list(out.items()):
        if isinstance(value, dict):
            if "model_type" in value or key.endswith("_config"):
                out[key] = dict(value)
                _divide_widths(out[key], factor)
        elif not _is_width(key):
            continue
        elif isinstance(value, int) and not isinstance(value, bool):
            out[key] = _divided(value, factor)
        elif isinstance(value, list) and value and all(type(v) is int for v in value):
            out[key] = [_divided(v, factor) for v in value]


def _divided(value: int, factor: int) -> int:
    """``value / factor`` when that is whole and at least 2, else by the largest power of two
    that is (an odd size stays: it is a count or a fixed size, not a width)."""
    while factor > 1 and (value % factor or value // factor < 2):
        factor //= 2
    return value // factor


def _cut_vocabularies(out: dict[str, Any]) -> None:
    for key, value in list(out.items()):
        if isinstance(value, dict) and ("model_type" in value or key.endswith("_config")):
            out[key] = dict(value)
            _cut_vocabularies(out[key])
        elif "vocab" in key and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, VOCAB)
    _remap_token_ids(out, out.get("vocab_size"))


#: How :func:`build_hf` shrinks a config, in the order tried: narrow; shallow; shallow with
#: every width divided alike; narrow to the first layers only; every width divided alike and
#: narrower still.
SHRINKS: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = (
    shrink,
    shallow,
    proportional,
    first_layers,
    slim,
)
_SHALLOW = {key for key in _SET if key in _DEPTH_KEYS or key == "vocab_size" or "expert" in key}
