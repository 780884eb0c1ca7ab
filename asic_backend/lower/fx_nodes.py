"""Read-only questions the lowering passes ask about FX nodes: fake value, dtype, arguments,
where the user wrote the call, and whether a tensor is a parameter the graph can read.

Nothing here edits a graph (see :mod:`asic_backend.lower.rewrite`).

>>> dtype_of(node), ndim_of(node)          # from the fake value Dynamo recorded
(torch.float32, 2)
>>> user_frame(node)                       # the user's line of the call
('/src/model.py', 12, 'y = self.fc(x)')
"""

from __future__ import annotations

import functools
import linecache
import os
import re
import sys
import sysconfig
from collections.abc import Iterable
from typing import Any

import torch
import torch._dynamo.eval_frame
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = [
    "dtype_of",
    "example_value",
    "get_arg",
    "graph_modules",
    "int_dims",
    "is_graph_input",
    "is_outer_product",
    "is_plain",
    "is_scaled",
    "module_path",
    "ndim_of",
    "op_name",
    "origin_frame",
    "real_tensor",
    "user_frame",
    "where",
]


def example_value(node: Any) -> Any:
    """The fake value of ``node`` (Dynamo's ``example_value``, AOTAutograd's ``val``), if any."""
    if not isinstance(node, fx.Node):
        return None
    return node.meta.get("example_value", node.meta.get("val"))


def dtype_of(node: Any) -> torch.dtype | None:
    v = example_value(node)
    return v.dtype if isinstance(v, torch.Tensor) else None


def ndim_of(node: Any) -> int | None:
    v = example_value(node)
    return v.dim() if isinstance(v, torch.Tensor) else None


def is_plain(v: Any) -> bool:
    """Whether ``v`` is a plain tensor, not a tensor subclass such as a TorchAO weight."""
    return isinstance(v, FakeTensor) or (
        isinstance(v, torch.Tensor) and not is_traceable_wrapper_subclass(v)
    )


def is_graph_input(node: fx.Node) -> bool:
    """A tensor the frame receives (parameter, buffer, argument): the same object on every call."""
    return node.op in ("placeholder", "get_attr")


def real_tensor(gm: fx.GraphModule, node: Any) -> torch.Tensor | None:
    """The real value behind a graph input, when the graph knows it (parameters, buffers)."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "get_attr":
        value = getattr(gm, str(node.target), None)
        return value if isinstance(value, torch.Tensor) else None
    grapharg = node.meta.get("grapharg")
    example = getattr(grapharg, "example", None) if node.op == "placeholder" else None
    return example if isinstance(example, torch.Tensor) else None


def graph_modules(gm: fx.GraphModule) -> list[fx.GraphModule]:
    """``gm`` and the subgraphs of its higher-order ops (``torch.cond`` branches, nested compile
    regions, ...), which run GEMMs of their own: every pass walks them all."""
    return [m for _, m in gm.named_modules() if isinstance(m, fx.GraphModule)]


def get_arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``index`` of the call, passed positionally or as ``name=``."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def is_scaled(node: fx.Node, first: int) -> bool:
    """Whether an ``addmm``/``baddbmm`` has ``beta``/``alpha`` (from argument ``first``) != 1."""
    beta, alpha = get_arg(node, first, "beta", 1), get_arg(node, first + 1, "alpha", 1)
    return bool(beta != 1 or alpha != 1)


def is_outer_product(b: fx.Node) -> bool:
    """Whether ``a @ b`` has K == 1: an outer product (e.g. rotary angles), not a GEMM, and
    int8 would ruin it. Only a statically known K counts, so a dynamic K is not guarded on."""
    shape = example_value(b).shape
    return bool(statically_known_true(shape[-2 if len(shape) >= 2 else 0] == 1))


def int_dims(args: Iterable[Any]) -> list[int] | None:
    """``permute(1, 0)`` / ``permute((1, 0))`` / ``transpose(0, 1)`` dims as ints (else None)."""
    dims: list[int] = []
    for arg in args:
        for d in arg if isinstance(arg, list | tuple) else [arg]:
            if not isinstance(d, int):
                return None
            dims.append(d)
    return dims


def op_name(node: fx.Node) -> str:
    """A short name for the op a node calls (``linear``, ``matmul``, ``mm``, …)."""
    if node.op == "call_method":
        return str(node.target)
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return getattr(target, "__name__", str(target)).strip("_")


_FRAME = re.compile(
    r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>[^\n]*)\n(?P<src>[^\n]*)'
)


def user_frame(node: fx.Node) -> tuple[str | None, int | None, str | None]:
    """The user's line of the call: ``(file, line, source)``, or Nones if unknown.

    The innermost frame of the user's code in the node's stack trace (Dynamo records the
    frames it traced through). A graph traced from library code alone (``torch.compile`` of an
    ``nn.Linear``, a model from an installed package) has none: its user line is the one that
    called the compiled region, known only while Dynamo compiles it. A graph compiled once and
    then called from another line is still attributed to the line of its first call.
    """
    frames = list(_FRAME.finditer(node.meta.get("stack_trace") or ""))
    for frame in reversed(frames):
        if _is_user_file(frame["file"]):
            return frame["file"], int(frame["line"]), frame["src"].strip() or None
    return _compiling_caller()


def origin_frame(node: fx.Node) -> tuple[str | None, int | None, str | None]:
    """Where the call was traced: ``(file, line, function)`` of the innermost frame of the
    node's stack trace that is not the standard library's, whoever's code it is (a library's
    module, the user's function), or Nones if unknown. Whose problem a host fallback is (the
    plugin's ``owner``) is read from it."""
    frames = list(_FRAME.finditer(node.meta.get("stack_trace") or ""))
    for frame in reversed(frames):
        file = frame["file"]
        if not _is_stdlib(file):
            return file, int(frame["line"]), frame["function"].strip() or None
    return None, None, None


def _is_stdlib(path: str) -> bool:
    if path.startswith("<"):  # "<frozen os>", generated code
        return True
    if any(m in path.split(os.sep) for m in _PACKAGE_DIRS):
        return False  # an installed package, even where site-packages is below the stdlib
    return path.startswith(_stdlib_prefixes())


@functools.cache
def _stdlib_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.join(d, "") for d in (paths["stdlib"], paths["platstdlib"]))


def _compiling_caller() -> tuple[str | None, int | None, str | None]:
    """The user's frame that entered the compiled region being compiled now, if any.

    Dynamo compiles inside the call that entered the region (``torch/_dynamo/eval_frame.py``);
    the first frame of the user's code outside the outermost of those frames made that call.
    """
    stack = []
    frame: Any = sys._getframe(1)
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    entry = _eval_frame_file()
    entries = [i for i, f in enumerate(stack) if f.f_code.co_filename == entry]
    for caller in stack[entries[-1] + 1 :] if entries else ():
        file = caller.f_code.co_filename
        if _is_user_file(file):
            return file, caller.f_lineno, linecache.getline(file, caller.f_lineno).strip() or None
    return None, None, None


@functools.cache
def _eval_frame_file() -> str:

    return torch._dynamo.eval_frame.__file__


def _is_user_file(path: str) -> bool:
    """Whether ``path`` is the user's code: not generated, torch, the standard library, an
    installed package or this backend."""
    if path.startswith("<") or any(m in path.split(os.sep) for m in _PACKAGE_DIRS):
        return False
    return not any(path.startswith(prefix) for prefix in _library_prefixes())


_PACKAGE_DIRS = ("site-packages", "dist-packages")


@functools.cache
def _library_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = (
        paths["stdlib"],
        paths["platstdlib"],
        os.path.dirname(torch.__file__),
        os.path.dirname(__file__),  # asic_backend
    )
    return tuple(os.path.join(d, "") for d in dirs)


def module_path(path: object) -> str:
    """A module path of ``nn_module_stack`` as the user names it: ``L['self'].fc1`` -> ``fc1``."""
    return re.sub(r"^L\['[^']*'\]\.?", "", str(path))


def where(node: fx.Node) -> str:
    """``file:line (module)`` of the call, or what is known of it, for messages; the file
    relative to the working directory when below it."""
    file, line, _ = user_frame(node)
    stack = node.meta.get("nn_module_stack") or {}
    module = ""
    if stack:
        path, _cls = list(stack.values())[-1]
        module = module_path(path) or "<root>"
    if file is not None:
        return f"{_shown(file)}:{line}" + (f" ({module})" if module else "")
    return module or node.name


def _shown(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if relative.startswith(os.pardir) else relative
