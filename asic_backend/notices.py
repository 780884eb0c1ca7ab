"""The backend's once-per-process warnings, and the switch a reporter uses to take them over.

The backend cannot fail anything: when a graph runs on the host it can only say so. Outside a
test harness it says so once per process (an :class:`AsicHostWarning`). A harness that reports
every host fallback itself (pytest-nobreak's marked tests, ``pytest_nobreak.watch()``) wraps its
block in :func:`host_fallbacks_reported`, and the warning stays unsaid (and unspent) there.

Torch-free, so the plugin can import it at no cost.

>>> with host_fallbacks_reported():
...     compiled(x)          # host fallbacks are counted and reported, not warned about
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import threading
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["AsicHostWarning", "host_fallbacks_reported", "say_once"]

log = logging.getLogger("asic_backend.backend")


class AsicHostWarning(UserWarning):
    """A compiled graph runs on the host, not on the DUT (e.g. because autograd is live)."""


_reported: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "asic_host_fallbacks_reported", default=False
)
_said: set[str] = set()
_said_lock = threading.Lock()


@contextmanager
def host_fallbacks_reported() -> Iterator[None]:
    """In this block, host fallbacks are reported by the caller: no once-per-process warning."""
    token = _reported.set(True)
    try:
        yield
    finally:
        _reported.reset(token)


def say_once(message: str) -> None:
    """Warn ``message`` (an :class:`AsicHostWarning`) once per process, unless reported."""
    if _reported.get():
        return
    with _said_lock:
        if message in _said:
            return
        _said.add(message)
    log.info(message)
    warnings.warn(message, AsicHostWarning, stacklevel=_user_stacklevel())


#: Packages whose frames sit between the user's call and the backend: torch, and a harness that
#: wraps Dynamo's entry points (pytest-nobreak's taps), looked up by name, never imported.
_BETWEEN = ("torch", "pytest_nobreak")


def _library_frame(filename: str) -> bool:
    """Whether ``filename`` is the backend's, torch's, a harness's that wraps torch, or a stdlib
    wrapper between them."""
    dirs = [os.path.dirname(__file__) + os.sep]
    for name in _BETWEEN:
        module = sys.modules.get(name)
        if module is not None and module.__file__:
            dirs.append(os.path.dirname(module.__file__) + os.sep)
    return filename.startswith(tuple(dirs)) or os.path.basename(filename) in (
        "contextlib.py",
        "functools.py",
    )


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the innermost frame outside the backend and torch: the user's
    compiled call, so the warning points at their line."""
    frame: types.FrameType | None = sys._getframe(2)  # say_once's caller: stacklevel 2
    level = 2
    while frame is not None:
        if not _library_frame(frame.f_code.co_filename):
            return level
        frame, level = frame.f_back, level + 1
    return 2
