"""Where the user is while Dynamo works: the Python stack above Dynamo's compiler, and the
function a compiled frame stands for."""

from __future__ import annotations

import functools
import os
import re
import sys
from typing import Any

import torch
import torch._dynamo
import torch._dynamo.convert_frame as _convert_frame

from pytest_nobreak.watch.sites import Frame

#: Dynamo calls the rest of a frame after a break through a function named after it.
#: This package's folder: a frame of its taps is Dynamo at work (it called them).
_TAPS_DIR = os.path.dirname(os.path.abspath(__file__))


_RESUME_RE = re.compile(r"^torch_dynamo_resume_in_(?P<name>\w+)_at_\d+$")


def _callers_of(file: str | None, function: str | None, depth: int) -> tuple[Frame, ...] | None:
    """The frames above the innermost running frame of ``function`` in ``file``, outermost
    first, or ``None`` when no such frame runs."""
    frame: Any = sys._getframe(depth)
    while frame is not None:
        code = frame.f_code
        if code.co_filename == file and code.co_name == function:
            return tuple(reversed(_frames_outward(frame.f_back)))
        frame = frame.f_back
    return None


def _frames_outward(frame: Any) -> list[Frame]:
    out = []
    while frame is not None:
        out.append(Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out


def _frames(stack: Any) -> list[Frame]:
    """A ``StackSummary`` (Dynamo's ``real_stack``) as frames; empty if there is none."""
    try:
        return [Frame(f.filename, f.lineno, f.name) for f in stack or () if f.filename]
    except (AttributeError, TypeError):
        return []


def _stack_above_dynamo(depth: int) -> list[Frame]:
    """The Python stack outside Dynamo's compiler, outermost first, from ``depth`` frames up.

    Everything inside the outermost ``convert_frame`` frame (or one of this package's taps)
    is Dynamo at work, and a backend it called; outside it are the calls that entered the
    compiled region: the user's.
    """
    frames = []
    frame: Any = sys._getframe(depth + 1)
    while frame is not None:
        frames.append(Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    frames.reverse()
    for index, entry in enumerate(frames):
        if entry.file == _convert_frame.__file__ or os.path.dirname(entry.file or "") == _TAPS_DIR:
            return frames[:index]
    return frames


def _user_stack(real_stack: Any, compiled: Frame | None, depth: int) -> tuple[Frame, ...]:
    """The callers above Dynamo, then its ``real_stack`` (else the ``compiled`` frame, where
    Dynamo was when it gave up), outermost first (see :func:`_merge_resumed`)."""
    return _merge_resumed([*_stack_above_dynamo(depth + 1), *_inner(real_stack, compiled)])


def _inner(real_stack: Any, compiled: Frame | None) -> list[Frame]:
    return _frames(real_stack) or ([compiled] if compiled is not None else [])


def _merge_resumed(frames: list[Frame]) -> tuple[Frame, ...]:
    """After a break, Dynamo runs the rest of the frame as a ``torch_dynamo_resume_in_f_at_N``
    function called from ``f`` itself; that pair is one frame of the user's code, ``f`` at the
    resume function's line."""
    out: list[Frame] = []
    for frame in frames:
        resumed = _RESUME_RE.match(frame.function or "")
        if resumed and out and out[-1].function == resumed["name"]:
            out[-1] = Frame(frame.file, frame.line, resumed["name"])
        else:
            out.append(frame)
    return tuple(out)


def _compiled_callable(frame: Any) -> tuple[str | None, Frame | None]:
    """The name and definition of what the user compiled, for the frame Dynamo compiles.

    A compiled module (and any callable Dynamo cannot compile directly) runs inside torch's
    ``wrap_inline`` wrapper, a frame of torch's with the callable in its locals as ``fn``.
    """
    code = frame.f_code
    if code.co_filename.startswith(_torch_dir()):
        described = _describe_callable(frame.f_locals.get("fn"))
        if described is not None:
            return described
    name = getattr(code, "co_qualname", code.co_name)
    return name, Frame(code.co_filename, code.co_firstlineno, name)


def _describe_callable(fn: Any) -> tuple[str, Frame | None] | None:
    """``("MLP.forward", <its definition>)`` for a module, the qualified name of a function."""
    for _ in range(10):  # functools.wraps chains; bounded, a cycle must not hang a test
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            break
        fn = inner
    if getattr(fn, "__func__", None) in _MODULE_CALLS:
        fn = fn.__self__  # a module's __call__: what runs is its forward
    if fn is None:
        return None
    name: str | None
    if isinstance(fn, torch.nn.Module):
        name = f"{type(fn).__qualname__}.forward"
        code = getattr(type(fn).forward, "__code__", None)
    else:
        function = getattr(fn, "__func__", fn)
        code = getattr(function, "__code__", None)
        name = getattr(function, "__qualname__", None) or getattr(code, "co_name", None)
    if code is None or name is None:
        return None
    return name, Frame(code.co_filename, code.co_firstlineno, name)


_MODULE_CALLS = tuple(
    getattr(torch.nn.Module, name)
    for name in ("__call__", "_wrapped_call_impl", "_call_impl")
    if hasattr(torch.nn.Module, name)
)


@functools.cache
def _torch_dir() -> str:
    return os.path.dirname(torch.__file__) + os.sep
