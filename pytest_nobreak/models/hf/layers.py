"""Cutting a config's depth: which layers are kept, and the per-layer entries, layer indices
and per-stage blocks that follow the cut."""

from __future__ import annotations

from typing import Any

from pytest_nobreak.models.hf.sizes import LAYER_KEYS, SHRUNK

__all__ = ["cut_layers", "follow_feature_layers", "one_block_per_stage"]

#: Blocks per stage of a network whose stages the shrink keeps (EfficientNet, Hiera).
_REPEATS = ("num_block_repeats", "blocks_per_stage")


def one_block_per_stage(values: dict[str, Any], out: dict[str, Any]) -> None:
    """One block in each stage; block indices (Hiera's ``global_attention_blocks``) point at
    the last block."""
    for key in _REPEATS:
        repeats = values.get(key)
        if isinstance(repeats, list) and repeats and all(type(v) is int for v in repeats):
            out[key] = [1] * len(repeats)
            for other, blocks in values.items():
                if other.endswith("_blocks") and isinstance(blocks, list) and blocks:
                    out[other] = [len(repeats) - 1]


def cut_layers(values: dict[str, Any], out: dict[str, Any], every_kind: bool = True) -> None:
    """Per-layer entries follow the cut in depth: the layers kept are the first ones, plus the
    first of each kind ``layer_types`` names (a hybrid keeps an attention layer, a model with
    indexed layers one of those; the depth grows to hold them). A list with one entry per layer
    keeps the kept layers' entries, a dict keyed by layer index their entries, renumbered; a
    list of layer indices (``index_layers``, ``kv_source_layers``) points at the kept layers."""
    layers_key = next((k for k in LAYER_KEYS if isinstance(values.get(k), int)), None)
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
        if isinstance(value, bool) or (key in SHRUNK and not isinstance(value, list)):
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


#: Keys holding indices into the vision tower's layers, of the model or of a sibling sub-config
#: (Molmo 2's adapter).
_FEATURE_LAYERS = ("vision_feature_layer", "vision_feature_layers")


def follow_feature_layers(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Indices of vision-tower layers whose states a model takes (``vision_feature_layer``)
    point at the layers the cut kept, when they no longer fit its depth: the deepest one at the
    last layer, the next at the one before, and so on, in their order."""
    before, after = values.get("vision_config"), out.get("vision_config")
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return
    key = next((k for k in LAYER_KEYS if type(before.get(k)) is int), None)
    if key is None or type(after.get(key)) is not int or after[key] >= before[key]:
        return
    old, new = before[key], after[key]
    for config in (out, *(v for v in out.values() if isinstance(v, dict))):
        for name in _FEATURE_LAYERS:
            value = config.get(name)
            indices = [value] if type(value) is int else value
            if not (isinstance(indices, list) and indices and all(type(i) is int for i in indices)):
                continue
            if all(-new <= i < new for i in indices):
                continue
            deepest = sorted({i % old for i in indices}, reverse=True)
            rank = {layer: max(new - 1 - n, 0) for n, layer in enumerate(deepest)}
            mapped = [rank[i % old] for i in indices]
            config[name] = mapped[0] if type(value) is int else mapped
