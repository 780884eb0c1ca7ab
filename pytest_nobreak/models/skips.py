"""Why a model of ``--nobreak-model`` is not built: :class:`BuildSkip`, and the one-line reason."""

from __future__ import annotations

__all__ = ["BuildSkip", "first_line"]


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
