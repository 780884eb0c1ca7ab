"""The call an ``hf:`` model's inputs are made for: the model, its forward's parameters, what
its docstring says of each, the batch and sequence sizes, and lookups in its config."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Mapping
from typing import Any

from torch import nn

__all__ = ["Call", "Documented", "config_int", "documented", "first_width", "sub"]

#: The sub-configs a size may sit in when the top config lacks it.
_SUBS = ("text_config", "vision_config", "audio_config", "encoder_config", "encoder")


def sub(config: Any, attr: str, default: Any) -> Any:
    """``config.attr``, else that of its text/vision/audio/encoder sub-config, else of any
    other sub-config (``asr_config``)."""
    value = getattr(config, attr, None)
    if value is not None:
        return value
    attrs = getattr(config, "__dict__", {})
    others = [v for k, v in attrs.items() if k.endswith("_config") and k not in _SUBS]
    for part in [getattr(config, name, None) for name in _SUBS] + others:
        value = getattr(part, attr, None)
        if value is not None:
            return value
    return default


def config_int(config: Any, attr: str) -> int | None:
    """``attr`` of the config (or a sub-config) when it is a positive int (the largest entry of
    a list such as ``merge_kernel_size``), else ``None``."""
    value = sub(config, attr, None)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        value = max(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def first_width(model: nn.Module) -> int | None:
    """The input width of the model's first linear, 1-D convolution or layer norm (in the order
    its modules were made), or ``None``."""
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            return layer.in_features
        if isinstance(layer, nn.Conv1d):
            return layer.in_channels
        if isinstance(layer, nn.LayerNorm) and layer.normalized_shape:
            return int(layer.normalized_shape[-1])
    return None


@dataclasses.dataclass(frozen=True)
class Documented:
    """What a forward's docstring says of one parameter: its type (``torch.LongTensor``), its
    shape's dimension names (``("batch_size", "sequence_length")``; empty when not given) and
    whether it is marked optional."""

    type: str
    dims: tuple[str, ...]
    optional: bool


#: ``name (`type` of shape `(dims)`, *optional*):``, the entry ``auto_docstring`` writes (some
#: write the shape in brackets).
_ENTRY = re.compile(
    r"^\s*(\w+) \(['`]([^'`]*)['`](?: of shape ['`][(\[]([^'`]*)[)\]]['`])?([^\n]*)\):"
)


@functools.lru_cache(maxsize=256)
def documented(doc: str | None) -> Mapping[str, Documented]:
    """The arguments a forward's docstring documents (the part before its ``Returns:``)."""
    out: dict[str, Documented] = {}
    for line in (doc or "").split("Returns:")[0].splitlines():
        found = _ENTRY.match(line)
        if found is None:
            continue
        name, kind, shape, rest = found.groups()
        dims = tuple(d.strip() for d in (shape or "").split(",") if d.strip())
        out.setdefault(name, Documented(kind, dims, "optional" in rest))
    return out


@dataclasses.dataclass
class Call:
    """One call's inputs in the making: ``inputs`` grows as each is made, so an input can
    follow the shape of one made before it (a mask its features, a grid its patches)."""

    model: nn.Module
    batch: int
    seq: int
    inputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The steps of a docstring's ``sequence_length``: the sequence, or a time series' past.
    steps: int = 0

    def __post_init__(self) -> None:
        self.steps = self.steps or self.seq

    @property
    def config(self) -> Any:
        """The model's config."""
        return self.model.config

    @functools.cached_property
    def params(self) -> Mapping[str, inspect.Parameter]:
        """The forward's parameters, without ``*args``/``**kwargs``."""
        return {
            name: param
            for name, param in inspect.signature(self.model.forward).parameters.items()
            if param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
        }

    @functools.cached_property
    def docs(self) -> Mapping[str, Documented]:
        """The forward's documented arguments."""
        return documented(self.model.forward.__doc__)

    def required(self, name: str) -> bool:
        """Whether the forward fails without ``name``: no default value."""
        param = self.params.get(name)
        return param is not None and param.default is inspect.Parameter.empty

    def size(self, attr: str, default: int) -> int:
        """A positive int size of the config (or a sub-config), else ``default``."""
        value = config_int(self.config, attr)
        return default if value is None else value
