"""Images cut into patches before the model sees them (the vision towers of Qwen-VL-like, NaViT
and SigLIP2-like models): the patches, and the grid each image's patches make.

Three packings, told apart by the forward's parameters: *packed* (``grid_thw``: every image's
patches in one ``(patches, width)`` tensor, the grids in ``(images, 3)``), *batched*
(``spatial_shapes`` or ``pixel_position_ids``: ``(batch, patches, width)``, each row one image)
and *NaViT* (``target_sizes``: one ``(1, channels, patch, patches * patch)`` strip of images).
Each image is a square grid of patches that every merge and pooling size of the config divides,
so the inputs scale with the batch (an image per item), not with the sequence.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pytest_nobreak.models.hf.call import Call, config_int

__all__ = ["grid_side", "patch_layouts", "patched"]

#: Parameters that give the patch grid of packed images, of batched ones, of a NaViT strip.
_PACKED = ("grid_thw", "image_grid_thw")
_BATCHED = ("spatial_shapes", "pixel_position_ids")
_NAVIT = ("target_sizes",)
#: Sizes that must divide the patch grid's side: patch merges, poolings, windows.
_MERGES = (
    "spatial_merge_size",
    "merge_size",
    "merge_kernel_size",
    "pooling_kernel_size",
    "window_kernel_size",
)


def patched(call: Call) -> str | None:
    """How the model takes its images' patches (``"packed"``, ``"batched"``, ``"navit"``), or
    ``None`` for whole images."""
    for kind, names in (("packed", _PACKED), ("batched", _BATCHED), ("navit", _NAVIT)):
        if any(name in call.params for name in names):
            return kind
    return None


def _merge(config: Any) -> int:
    """The largest merge or pooling size of the config (1 without one)."""
    return max(config_int(config, key) or 1 for key in _MERGES)


def grid_side(config: Any) -> int:
    """Patches per side of each image: twice the largest merge or pooling size (4 without
    one), so a merge leaves a grid of at least 2x2."""
    merge = _merge(config)
    return 2 * merge if merge > 1 else 4


def _patch_layer(model: nn.Module) -> nn.Module | None:
    """The patch embedding: the first linear or convolution layer named for patches (a dual
    encoder's text tower comes first), else the model's first."""
    layers = [
        (name, layer)
        for name, layer in model.named_modules()
        if isinstance(layer, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))
    ]
    named = [layer for name, layer in layers if "patch" in name]
    first = named or [layer for _, layer in layers]
    return first[0] if first else None


def _patch_shapes(model: nn.Module) -> list[tuple[int, ...]]:
    """The shapes one patch may take: flat (the patch embedding's input width), and, for a
    convolution, as the convolution's input (channels, [frames,] height, width)."""
    layer = _patch_layer(model)
    if isinstance(layer, nn.Linear):
        return [(layer.in_features,)]
    if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        kernel = tuple(int(k) for k in layer.weight.shape[1:])  # in_channels/groups, *kernel
        width = 1
        for k in kernel:
            width *= k
        return [(width,), kernel]
    return []


def patch_layouts(call: Call, name: str) -> list[dict[str, torch.Tensor]]:
    """``name`` (the patches) and its grid inputs, one dict per shape a patch may take."""
    kind = patched(call)
    side = grid_side(call.config)
    per_image, batch = side * side, call.batch
    out = []
    for shape in _patch_shapes(call.model):
        if kind == "packed":
            grid = torch.tensor([[1, side, side]] * batch)
            inputs = {name: torch.randn(batch * per_image, *shape)}
            for key in _PACKED:
                if key in call.params:
                    inputs[key] = grid
            if "merge_sizes" in call.params:  # VideoLLaMA3: each image's own merge size
                inputs["merge_sizes"] = torch.full((batch,), _merge(call.config))
        elif kind == "batched":
            inputs = {name: torch.randn(batch, per_image, *shape)}
            if "spatial_shapes" in call.params:
                inputs["spatial_shapes"] = torch.tensor([[side, side]] * batch)
            if "pixel_attention_mask" in call.params:
                inputs["pixel_attention_mask"] = torch.ones(batch, per_image, dtype=torch.long)
            if "pixel_position_ids" in call.params:
                rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
                xy = torch.stack([cols.flatten(), rows.flatten()], dim=-1)  # (x, y) per patch
                inputs["pixel_position_ids"] = xy.expand(batch, -1, -1).clone()
        elif kind == "navit" and len(shape) == 3:
            # One strip of every image's patches side by side, as NaViT packs them.
            channels, height, width = shape
            strip = torch.randn(1, channels, height, batch * per_image * width)
            inputs = {name: strip, "target_sizes": torch.tensor([[side, side]] * batch)}
        else:
            continue
        out.append(inputs)
    return out
