"""Where a break is, as the user reads it: their own line first, every path relative.

Dynamo names the innermost frame of a break, which may be inside torch, the standard library or
an installed package. A user acts on their own code, so a location is the innermost frame of
*their* code; the library frame, if the break was in one, is named next to it; and the user's
lines that called it follow, innermost first. The user's code is every file that is not in the
standard library, an installed package (``site-packages``), torch, this plugin or the bundled
backend, plus the *first-party* packages the user names (``nobreak_first_party``: their own
project installed into site-packages, a monorepo's sibling packages). Paths are relative to the
rootdir (a library file to its install directory).

Every problem also has an *owner* (:func:`owner_of`): whose code it happened in, read from the
frame where it happened, not from the user's calling line. The standard library and generated
code are nobody's: they belong to whoever called them (``os.environ[...] = ...`` in the user's
function is the user's break; ``copy.deepcopy`` called by transformers is transformers').

Pure Python, no torch import.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import linecache
import os
import sys
import sysconfig
from collections.abc import Collection, Sequence

from pytest_nobreak.watch.events import OWN, CallSite

#: Call sites kept per break; the outermost one (the test's own line) is always among them.
MAX_CALL_SITES = 8
#: Libraries that run the tests: the frames from the innermost of these outwards are the test
#: runner's, not the user's (and, under pytester, those of an outer test session).
_RUNNERS = frozenset({"_pytest", "pytest", "pluggy", "unittest"})
#: Packages of this distribution: their frames are never the user's code.
_OWN_PACKAGES = ("pytest_nobreak", "asic_backend", "torch")


@dataclasses.dataclass(frozen=True)
class Frame:
    """A frame of a stack: its file as Python names it (absolute), line and function."""

    file: str
    line: int | None
    function: str | None = None


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a break is for the user (see the module docstring); paths as displayed."""

    file: str | None = None
    line: int | None = None
    source: str | None = None
    call_sites: tuple[CallSite, ...] = ()
    library: str | None = None
    #: Whose code it happened in: :data:`~pytest_nobreak.watch.events.OWN` or a library's name.
    owner: str = OWN


def locate(stack: Sequence[Frame], root: str, first_party: Collection[str] = ()) -> Location:
    """The location of the innermost frame of ``stack`` (outermost frame first); the packages
    named in ``first_party`` are the user's code too."""
    stack = _below_runner(stack)
    if not stack:
        return Location()
    innermost = stack[-1]
    owner = owner_of(stack, first_party)
    user = [frame for frame in stack if is_user_file(frame.file, first_party)]
    library = None if is_user_file(innermost.file, first_party) else describe_library(innermost)
    if not user:  # the path says where in the library; the name says which
        shown = display_path(innermost.file, root)
        return Location(shown, innermost.line, library=library_name(innermost.file), owner=owner)
    here, *callers = reversed(user)
    return Location(
        display_path(here.file, root),
        here.line,
        source_line(here.file, here.line),
        _trim([_call_site(frame, root) for frame in callers]),
        library,
        owner,
    )


def owner_of(stack: Sequence[Frame], first_party: Collection[str] = ()) -> str:
    """Whose code the innermost frame of ``stack`` is: :data:`~pytest_nobreak.watch.events.OWN` for
    the user's (``first_party`` packages included), else the library's name.

    The standard library and generated code (``<string>``) are passed through to their caller.
    A stack of nothing else, or none at all, is the user's: a narrower scope must never hide a
    problem it cannot attribute.
    """
    for frame in reversed(stack):
        if is_user_file(frame.file, first_party):
            return OWN
        if _is_stdlib(frame.file):
            continue
        return library_name(frame.file) or OWN
    return OWN


def _below_runner(stack: Sequence[Frame]) -> list[Frame]:
    for index in range(len(stack) - 1, -1, -1):
        if library_name(stack[index].file) in _RUNNERS:
            return list(stack[index + 1 :])
    return list(stack)


def _call_site(frame: Frame, root: str) -> CallSite:
    return CallSite(display_path(frame.file, root), frame.line, source_line(frame.file, frame.line))


def _trim(sites: list[CallSite]) -> tuple[CallSite, ...]:
    # The outermost site is the test's (or the script's) own line: keep it whatever the depth.
    if len(sites) > MAX_CALL_SITES:
        sites = [*sites[: MAX_CALL_SITES - 1], sites[-1]]
    return tuple(sites)


def source_line(file: str | None, line: int | None) -> str | None:
    """The text of ``file:line``, stripped, if the file can be read."""
    if not file or not line:
        return None
    text = linecache.getline(file, line).strip()
    return text or None


#: Lines shown above and below the user's line in the HTML report.
CONTEXT_LINES = 3


def source_context(
    file: str | None, line: int | None, root: str, around: int = CONTEXT_LINES
) -> tuple[int | None, tuple[str, ...]]:
    """``(first line number, lines)`` of ``file`` around ``line`` (``around`` either side), with
    their indentation; ``(None, ())`` if the file cannot be read. A relative ``file`` is taken
    from ``root``."""
    if not file or not line or file.startswith("<"):
        return None, ()
    path = file if os.path.isabs(file) else os.path.join(root, file)
    lines = linecache.getlines(path)
    if not 0 < line <= len(lines):
        return None, ()
    start = max(line - around, 1)
    end = min(line + around, len(lines))
    return start, tuple(text.rstrip("\r\n") for text in lines[start - 1 : end])


# --------------------------------------------------------------------------- classification


def is_user_file(path: str, first_party: Collection[str] = ()) -> bool:
    """Whether ``path`` is the user's code (not a library, not generated code); a file of a
    package named in ``first_party`` is."""
    if path.startswith("<"):
        return False
    return _library_root(path) is None or (bool(first_party) and library_name(path) in first_party)


def _is_stdlib(path: str) -> bool:
    """The standard library's (``<frozen os>`` included) or generated code (``<string>``)."""
    if path.startswith("<"):
        return True
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return any(_is_below(path, directory) for directory in _stdlib_dirs())


def library_name(path: str) -> str | None:
    """The library ``path`` belongs to (``torch``, ``os``, ``transformers``), or None."""
    if path.startswith("<"):  # "<frozen os>", "<string>"
        return path.strip("<>").split()[-1]
    root = _library_root(path)
    if root is None:
        return None
    first = os.path.relpath(path, root).split(os.sep)[0]
    return first.removesuffix(".py")


def describe_library(frame: Frame) -> str:
    """``torch (torch/nn/modules/linear.py:125, in forward)``: which library, and where in it."""
    where = display_path(frame.file, os.getcwd())
    if frame.line is not None:
        where += f":{frame.line}"
    if frame.function:
        where += f", in {frame.function}"
    return f"{library_name(frame.file) or 'a library'} ({where})"


def display_path(path: str, root: str) -> str:
    """``path`` as the user reads it: relative to ``root`` for their code, to the install
    directory for a library's, else to the ``sys.path`` entry it was imported from."""
    if path.startswith("<") or not os.path.isabs(path):
        return path
    library_root = _library_root(path)
    bases = [library_root] if library_root else [root, *_containing(path, sys.path)]
    for base in bases:
        if _is_below(path, base):
            return os.path.relpath(path, base)
    return path


def _library_root(path: str) -> str | None:
    """The install directory ``path`` is below if it is a library's file, else None."""
    parts = path.split(os.sep)
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            index = len(parts) - 1 - parts[::-1].index(marker)
            return os.sep.join(parts[: index + 1])
    for directory, base in _library_dirs():
        if _is_below(path, directory):
            return base
    return None


@functools.cache
def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = (paths["stdlib"], paths["platstdlib"])
    return tuple(dict.fromkeys([*dirs, *(os.path.realpath(d) for d in dirs)]))


@functools.cache
def _library_dirs() -> tuple[tuple[str, str], ...]:
    """``(directory, install root)`` of the standard library and of this distribution's
    packages (an editable install or a source checkout keeps them outside site-packages)."""
    out = [(d, d) for d in _stdlib_dirs()]
    for name in _OWN_PACKAGES:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            out.append((location, os.path.dirname(location)))
    # Both spellings: code objects keep the path they were imported by, symlinks included.
    both = out + [(os.path.realpath(d), os.path.realpath(b)) for d, b in out]
    return tuple(dict.fromkeys(both))


def _containing(path: str, candidates: Sequence[str]) -> list[str]:
    below = [c for c in candidates if c and os.path.isabs(c) and _is_below(path, c)]
    return sorted(below, key=len, reverse=True)[:1]


def _is_below(path: str, base: str) -> bool:
    try:
        return os.path.commonpath([path, base]) == base
    except ValueError:  # different drives on Windows
        return False
