"""The ``diffusers`` model classes: which exist, the sweep, building one shrunk, in eval mode."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import nn

from pytest_nobreak.models.diffusers.shrinking import shrink
from pytest_nobreak.models.skips import MAX_PARAMS, BuildSkip, first_line, instantiate
from pytest_nobreak.models.spec import SpecError

__all__ = ["MAX_PARAMS", "build_diffusers", "check_diffusers", "diffusers_set"]

#: Exported names that are never a model class (close matches of a misspelt class are looked
#: for among the others).
_NOT_MODELS = ("Pipeline", "Scheduler", "Mixin", "Config", "Processor", "Output", "Guider")


def _library() -> ModuleType:
    try:
        # Lazy: diffusers is an optional extra: imported when a diffusers: model is used.
        import diffusers
    except ImportError as exc:
        raise SpecError(
            f"--nobreak-model diffusers:...: needs diffusers, which cannot be imported ({exc}); "
            "pip install diffusers"
        ) from None
    return diffusers


def _exported(library: ModuleType) -> list[str]:
    """The names ``diffusers`` exports (its lazy module lists them without importing any)."""
    return sorted(n for n in dir(library) if n[:1].isupper())


def _model_class(library: ModuleType, name: str) -> type[nn.Module] | None:
    """The class ``diffusers.<name>`` when it is a model (a ``ModelMixin``), else ``None``."""
    try:
        value = getattr(library, name)
    except Exception:  # an optional dependency missing: that class is not available here
        return None
    mixin = library.ModelMixin
    if isinstance(value, type) and issubclass(value, mixin) and value is not mixin:
        return value
    return None


def check_diffusers(name: str) -> str | None:
    """A one-line problem with ``diffusers:<name>`` (what to write instead), or ``None``."""
    library = _library()
    names = _exported(library)
    if name not in names:
        candidates = [n for n in names if not any(part in n for part in _NOT_MODELS)]
        close = difflib.get_close_matches(name, candidates, n=3)
        hint = f" (did you mean {', '.join('diffusers:' + c for c in close)}?)" if close else ""
        return f"diffusers {library.__version__} has no class {name!r}{hint}"
    try:
        value = getattr(library, name)
    except Exception as exc:
        return f"diffusers cannot import {name}: {first_line(exc)}"
    if _model_class(library, name) is None:
        kind = type(value).__name__ if not isinstance(value, type) else "class"
        return f"{name} is a {kind}, not a model (a diffusers ModelMixin subclass)"
    return None


def diffusers_set(name: str) -> list[str]:
    """The SPECs ``diffusers:<name>`` expands to: every model class the installed ``diffusers``
    exports, sorted (every xdist worker collects the same)."""
    assert name == "*", name
    library = _library()
    return [f"diffusers:{n}" for n in _exported(library) if _model_class(library, n) is not None]


def _defaults(cls: type[nn.Module]) -> dict[str, Any]:
    """The config a class builds with when given nothing: its ``__init__``'s defaults."""
    out: dict[str, Any] = {}
    for key, param in inspect.signature(cls.__init__).parameters.items():
        if key == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.default is inspect.Parameter.empty:
            raise BuildSkip(
                f"{cls.__name__} has no default for {key!r}: it is built from other models "
                "or data, not from a config alone"
            )
        out[key] = param.default
    return out


def build_diffusers(
    name: str, shrinker: Callable[[dict[str, Any]], dict[str, Any]] = shrink
) -> nn.Module:
    """``diffusers.<name>`` built from its shrunk config, in eval mode, weights from seed 0.
    Raises :class:`BuildSkip`."""
    library = _library()
    cls = _model_class(library, name)
    if cls is None:
        raise BuildSkip(check_diffusers(name) or f"diffusers cannot import {name}")
    try:
        config = shrinker(_defaults(cls))
    except BuildSkip:
        raise
    except Exception as exc:
        raise BuildSkip(f"its config cannot be shrunk: {first_line(exc)}") from None
    make: Any = getattr(cls, "from_config", None) or cls
    model = instantiate(make, config, name)
    _unzero(model)
    built: nn.Module = model.eval()
    return built


def _unzero(model: nn.Module) -> None:
    """Weights a class zero-initializes by design (a ControlNet's zero convolutions, so that it
    starts training as a no-op) get random values (seed 0, a layer's default init): left at
    zero they make the output exactly zero, which leaves the DUT's nothing to compare with."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2 and param.is_floating_point() and not bool(param.any()):
                nn.init.kaiming_uniform_(param, a=math.sqrt(5), generator=generator)
