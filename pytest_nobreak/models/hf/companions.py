"""The inputs that go with an ``hf:`` model's main one: by the parameter's name where the name
says what it is (token ids, boxes, the mask or padding of an input made before, a language),
else by the shape and type the forward's docstring gives.

Masks keep everything: an attention mask or a 0/1 mask is all ones, a boolean mask of what was
observed all ``True``, any other boolean mask (padding, masked patches: it marks what is left
out) all ``False``. Other integer inputs are zeros (the first language, frequency, time step or
segment): an index valid in any table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from pytest_nobreak.models.hf.call import Call, config_int, sub
from pytest_nobreak.models.hf.shrinking import IMAGE, VOCAB

__all__ = ["NEEDED", "companion", "time_steps", "token_ids"]

#: Optional parameters a forward may still not do without (it raises, or indexes ``None``):
#: made, as the required ones are, when the inputs without them are not accepted.
NEEDED = (
    "input_ids",
    "bbox",
    "lang_ids",
    "visual_feats",
    "visual_pos",
    "image_attention_mask",
)
#: Dimension names (in docstring shapes) that are the batch, and the sequence.
_BATCH = frozenset({"batch_size", "batch"})
_SEQUENCE = re.compile(r"(sequence|seq)_len(gth)?$|^(episode_length|frames|num_frames)$|tokens")
#: Dimension names that are an image's side.
_IMAGE_SIDES = frozenset({"height", "width", "image_size", "frame_size"})
#: Dimension names that stand for a config size of another name.
_ALIASES = {
    "dim": "hidden_size",
    "hidden_dim": "hidden_size",
    "embed_dim": "hidden_size",
    "num_features": "num_time_features",
}
#: The config sizes of an audio frame's features.
_FEATURES = ("num_mel_bins", "feature_size", "input_feat_size", "input_feat_per_channel")
#: A count with no config size nor sequence behind it (``num_boxes``, ``num_visual_features``).
_SMALL = 4
#: Arguments documented without *optional* that are targets or switches, not inputs.
_NOT_INPUTS = re.compile(r"labels?$|^return_|^output_|^encoder_outputs$|^cache$|^use_cache$")


def token_ids(config: Any, batch: int, seq: int) -> torch.Tensor:
    """Random token ids in the lower half of the vocabulary (special and placeholder tokens
    sit at its top)."""
    vocab = config_int(config, "vocab_size") or VOCAB
    return torch.randint(1, max(vocab // 2, 2), (batch, seq))


def time_steps(call: Call, value: torch.Tensor) -> tuple[int, int]:
    """``(batch, steps)`` of an input with a time (or token) axis: its second axis, or, for
    features laid out channels first (mel bins by frames), its last."""
    if value.dim() >= 3:
        bins = {config_int(call.config, key) for key in _FEATURES} - {None}
        if value.shape[1] in bins and value.shape[-1] not in bins:
            return value.shape[0], value.shape[-1]
    return value.shape[0], value.shape[1] if value.dim() > 1 else 1


def companion(call: Call, name: str) -> Any:
    """A value for the forward's parameter ``name``, or ``None`` when nothing says what it
    is: its name first, then its docstring's shape."""
    for pattern, make in _BY_NAME:
        if pattern.search(name):
            value = make(call, name)
            if value is not None:
                return value
    return _documented(call, name)


def _of_input(call: Call, name: str) -> torch.Tensor | None:
    """The mask or padding of an input made before (``input_features_mask`` of
    ``input_features``, ``past_values_padding`` of ``past_values``, ``tasks_attention_mask``
    of ``tasks_input_ids``): one per time step or token."""
    ids = call.inputs.get(name.removesuffix("attention_mask") + "input_ids")
    if name.endswith("_attention_mask") and isinstance(ids, torch.Tensor):
        return torch.ones(ids.shape, dtype=_dtype(call, name, torch.long))
    for made, value in call.inputs.items():
        if name.startswith(made + "_") and isinstance(value, torch.Tensor):
            if "padding" in name or _dtype(call, name, torch.long) == torch.bool:
                return torch.zeros(time_steps(call, value), dtype=_dtype(call, name, torch.long))
            return torch.ones(time_steps(call, value), dtype=torch.long)
    return None


def _image_mask(call: Call, name: str) -> torch.Tensor | None:
    """Which of a stack of images each token sees (IDEFICS): all."""
    pixels = call.inputs.get("pixel_values")
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 5:
        return None
    return torch.ones(call.batch, call.seq, pixels.shape[1], dtype=torch.long)


def _ids(call: Call, name: str) -> torch.Tensor:
    if name in ("position_ids", "decoder_position_ids"):
        return torch.arange(call.seq).expand(call.batch, -1)
    return token_ids(call.config, call.batch, call.seq)


def _like_pixels(call: Call, name: str) -> torch.Tensor | None:
    """A prompt image or mask beside the image (SegGPT): of the image's shape."""
    pixels = call.inputs.get("pixel_values")
    return torch.randn(pixels.shape) if isinstance(pixels, torch.Tensor) else None


def _boxes(call: Call, name: str) -> torch.Tensor:
    """A box per token, (x0, y0, x1, y1) with x0 <= x1 and y0 <= y1: integers in the range of
    the model's 2-D position table (LayoutLM, UDOP), else fractions of the page (BROS)."""
    corners = torch.rand(call.batch, call.seq, 2, 2).sort(dim=3).values  # x, y: (low, high)
    boxes = corners.transpose(2, 3).reshape(call.batch, call.seq, 4)
    table = config_int(call.config, "max_2d_position_embeddings")
    return (boxes * (table - 1)).long() if table else boxes


def _per_item(value: int, dtype: torch.dtype, *rest: int) -> Callable[[Call, str], torch.Tensor]:
    """One ``value`` per batch item (of shape ``(batch, *rest)``)."""
    return lambda call, name: torch.full((call.batch, *rest), value, dtype=dtype)


def _embeds(call: Call, name: str) -> torch.Tensor | None:
    """Embeddings or hidden states given for steps: of the hidden size (``d_model``) when the
    docstring gives no shape; a cross-attention's source (``encoder_hidden_states``) of its own
    width."""
    width = call.size("hidden_size", call.size("d_model", 64))
    if name == "encoder_hidden_states":
        width = call.size("encoder_hidden_size", width)
    elif call.docs.get(name) and call.docs[name].dims:
        return None
    return torch.randn(call.batch, call.seq, width)


#: What a parameter's name says it is, tried in this order.
_BY_NAME: tuple[tuple[re.Pattern[str], Callable[[Call, str], Any]], ...] = (
    (re.compile(r"^image_attention_mask$"), _image_mask),
    (re.compile(r"_(mask|padding)$"), _of_input),
    (re.compile(r"(^|_)input_ids$|^task_inputs$|^position_ids$"), _ids),
    (re.compile(r"^prompt_(pixel_values|masks)$"), _like_pixels),
    (re.compile(r"^bbox$"), _boxes),
    (re.compile(r"^lang_ids$"), _per_item(0, torch.long)),  # the first language
    (re.compile(r"^freq$"), _per_item(0, torch.long, 1)),  # TimesFM: (batch, 1), not (batch,)
    (re.compile(r"^classes_structure$"), _per_item(1, torch.long)),  # OmDet: a class an image
    (re.compile(r"_embeds$|hidden_states$|^inputs$"), _embeds),  # Perceiver: any inputs
)


def _dtype(call: Call, name: str, default: torch.dtype) -> torch.dtype:
    """The parameter's tensor type, by its docstring or annotation, else ``default``."""
    doc = call.docs.get(name)
    param = call.params.get(name)
    said = (doc.type if doc else "") + " " + str(param.annotation if param else "")
    if "Bool" in said:
        return torch.bool
    if "Long" in said or "Int" in said:
        return torch.long
    return default


def _documented(call: Call, name: str) -> torch.Tensor | None:
    """A tensor of the docstring's shape and type (see the module's docstring for values)."""
    doc = call.docs.get(name)
    if doc is None or not doc.dims or "Tensor" not in doc.type or _NOT_INPUTS.search(name):
        return None
    shape = [_dim(call, dim) for dim in doc.dims]
    sizes = tuple(size for size in shape if size is not None)
    if len(sizes) < len(shape):
        return None
    dtype = _dtype(call, name, torch.float)
    if dtype == torch.bool:
        return torch.full(sizes, "observed" in name or "attention" in name, dtype=torch.bool)
    if "mask" in name:
        return torch.ones(sizes, dtype=dtype)
    return torch.zeros(sizes, dtype=dtype) if dtype == torch.long else torch.randn(sizes)


def _dim(call: Call, dim: str) -> int | None:
    """The size a docstring's dimension stands for: a sum of products (``num_channels *
    patch_size**2``, ``tokens + config.block_size``) of the sizes of its factors."""
    total = 0
    for term in dim.split("+"):
        size = 1
        for factor in re.sub(r"(\w+)\s*\*\*\s*2", r"\1*\1", term).split("*"):
            one = _factor(call, factor.strip())
            if one is None:
                return None
            size *= one
        total += size
    return total


def _factor(call: Call, name: str) -> int | None:
    """A dimension name's size: a number, the batch, a config size (``hidden_size``,
    ``config.block_size``, ``len(config.target_layer_ids)``), an image side, the sequence, or a
    small count (``num_boxes``)."""
    if name.isdigit():
        return int(name)
    if name in _BATCH:
        return call.batch
    counted = re.fullmatch(r"len\(config\.(\w+)\)", name)
    if counted:  # one per entry of a config list (the layers whose states are stacked)
        entries = getattr(call.config, counted.group(1), None)
        return len(entries) if isinstance(entries, (list, tuple)) else None
    name = name.removeprefix("config.")
    if name in _IMAGE_SIDES:
        return config_int(call.config, "image_size") or IMAGE
    size = sub(call.config, _ALIASES.get(name, name), None)
    if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
        return size  # zero too: a series without time features has (batch, steps, 0) of them
    if _SEQUENCE.search(name) or "length" in name:
        return call.steps
    return _SMALL if re.fullmatch(r"num_\w+", name) else None
