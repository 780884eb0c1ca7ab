"""Attention and state-space heads of a shrunk config: per-head sizes, Mamba-2 heads and
groups, and multimodal rotary sections, each kept consistent with the shrunk head."""

from __future__ import annotations

import math
from typing import Any

from pytest_nobreak.models.hf.sizes import HEAD_KEYS, HIDDEN_KEYS, power_of_two

__all__ = ["SSM_HEADS", "scale_head_dims", "scale_rope_sections", "ssm_heads"]

#: Per-head sizes of attention variants (latent attention's rope/nope/value parts, a
#: partial rotary embedding's width).
_HEAD_DIM_SUFFIXES = ("head_dim", "rotary_dim", "d_head")
#: Low-rank projections, sized against the hidden size.
_RANK_SUFFIX = "_rank"


def scale_head_dims(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Per-head sizes (``qk_rope_head_dim``, ``v_head_dim``, ...) shrink by the factor the head
    dimension did, and low-rank sizes (``kv_lora_rank``) by the hidden size's, each a power of
    two so their sums and splits stay whole."""
    hidden_key = next((k for k in HIDDEN_KEYS if isinstance(values.get(k), int)), "")
    heads_key = next((k for k in HEAD_KEYS if isinstance(values.get(k), int)), "")
    got = (values.get(hidden_key), out.get(hidden_key), values.get(heads_key), out.get(heads_key))
    sizes = [v for v in got if isinstance(v, int) and v > 0]
    if len(sizes) < len(got):
        return
    old_hidden, new_hidden, old_heads, new_heads = sizes
    old_head = values.get("head_dim") or old_hidden // old_heads
    new_head = out.get("head_dim") or new_hidden // new_heads
    head_factor = power_of_two(old_head / max(new_head, 1))
    hidden_factor = power_of_two(old_hidden / new_hidden)
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


def ssm_heads(values: dict[str, Any], out: dict[str, Any]) -> None:
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


def scale_rope_sections(values: dict[str, Any], out: dict[str, Any]) -> None:
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
    hidden = next((out[k] for k in HIDDEN_KEYS if isinstance(out.get(k), int)), None)
    heads = next((out[k] for k in HEAD_KEYS if isinstance(out.get(k), int)), None)
    if head is None and hidden and heads:
        head = int(hidden) // int(heads)
    if head is None:
        return None
    factor = rope.get("partial_rotary_factor", out.get("partial_rotary_factor", 1))
    return int(head * factor) // 2 if isinstance(factor, (int, float)) else head // 2
