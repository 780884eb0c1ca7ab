"""Why a model of ``--nobreak-model`` is not built: :class:`BuildSkip`, the one-line reason,
and the size limit a shrunk model must keep."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MAX_PARAMS", "BuildSkip", "first_line", "instantiate"]

#: A model still bigger than this after shrinking is skipped (its config defies the rules):
#: building and compiling it would take most of the per-model time limit.
MAX_PARAMS = 20_000_000


class BuildSkip(Exception):
    """This architecture cannot be built offline, or its inputs inferred: the check is skipped
    with this reason."""


def first_line(exc: BaseException) -> str:
    """``Type: message``, on one line (a header line ending in ``:`` keeps the next one)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:  # a header ("Class validation error ...:")
        text = f"{text} {lines[1]}"
    return f"{type(exc).__name__}: {text[:240]}"


def instantiate(make: Callable[[Any], Any], config: Any, name: str) -> Any:
    """``make(config)``, its weights from seed 0, once its parameters (counted on the meta
    device, before any is allocated) are within :data:`MAX_PARAMS`. Raises :class:`BuildSkip`
    for a model too big, or one that cannot be built (``name`` says which)."""
    # Lazy: torch is imported only where a model is built (the plugin's import stays light).
    import torch

    try:
        with torch.device("meta"):
            params = sum(p.numel() for p in make(config).parameters())
        if params > MAX_PARAMS:
            raise BuildSkip(
                f"still {params / 1e6:.0f}M parameters after shrinking (limit "
                f"{MAX_PARAMS / 1e6:.0f}M)"
            )
        torch.manual_seed(0)
        return make(config)
    except BuildSkip:
        raise
    except Exception as exc:
        raise BuildSkip(f"{name} cannot be built: {first_line(exc)}") from None
