"""Dividing every width of a config by one power of two (the proportional fallback): what
is a width, by how much, and the vocabularies cut beside them."""

from __future__ import annotations

from typing import Any

from pytest_nobreak.models.hf.sizes import (
    HEAD_KEYS,
    HIDDEN,
    HIDDEN_KEYS,
    VOCAB,
    power_of_two,
    remap_token_ids,
)

__all__ = ["cut_vocabularies", "divide_widths", "width_factor"]

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


def width_factor(values: dict[str, Any]) -> int:
    """The largest power of two that brings the widest hidden size towards :data:`HIDDEN` while
    every head keeps at least 16 dimensions (rotary sections split a head in three)."""
    hidden = _first_int(values, (*HIDDEN_KEYS, "embed_dim", "emb_dim", "dim"))
    if hidden is None:
        return 1
    heads = _first_int(values, HEAD_KEYS) or 1
    head = _first_int(values, ("head_dim",)) or max(hidden // heads, 1)
    return max(min(power_of_two(hidden / HIDDEN), power_of_two(head / 16)), 1)


def _first_int(values: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    """The first of ``keys`` that is an int here, else in the text sub-config."""
    for where in (values, values.get("text_config")):
        if isinstance(where, dict):
            for key in keys:
                value = where.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return None


def divide_widths(out: dict[str, Any], factor: int) -> None:
    for key, value in list(out.items()):
        if isinstance(value, dict):
            if "model_type" in value or key.endswith("_config"):
                out[key] = dict(value)
                divide_widths(out[key], factor)
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


def cut_vocabularies(out: dict[str, Any]) -> None:
    for key, value in list(out.items()):
        if isinstance(value, dict) and ("model_type" in value or key.endswith("_config")):
            out[key] = dict(value)
            cut_vocabularies(out[key])
        elif "vocab" in key and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, VOCAB)
    remap_token_ids(out, out.get("vocab_size"))
