"""Read-only questions the lowering passes ask about FX nodes: fake value, dtype, arguments,
where the user wrote the call, and whether a tensor is a parameter the graph can read.

Nothing here edits a graph (see :mod:`asic_backend.rewrite`).

>>> dtype_of(node), ndim_of(node)          # from the fake value Dynamo recorded
(torch.float32, 2)
>>> user_frame(node)                       # the innermost user frame of the call
('model.py', 12, 'y = self.fc(x)')
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = [
    "dtype_of",
    "example_value",
    "get_arg",
    "int_dims",
    "is_graph_input",
    "is_outer_product",
    "is_plain",
    "is_scaled",
    "module_path",
    "ndim_of",
    "op_name",
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


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in [^\n]*\n(?P<src>[^\n]*)')


def user_frame(node: fx.Node) -> tuple[str | None, int | None, str | None]:
    """The innermost user frame of ``node`` (Dynamo keeps user frames only), if recorded."""
    frames = list(_FRAME.finditer(node.meta.get("stack_trace") or ""))
    if not frames:
        return None, None, None
    last = frames[-1]
    return last["file"], int(last["line"]), last["src"].strip() or None


def module_path(path: object) -> str:
    """A module path of ``nn_module_stack`` as the user names it: ``L['self'].fc1`` -> ``fc1``."""
    return re.sub(r"^L\['[^']*'\]\.?", "", str(path))


def where(node: fx.Node) -> str:
    """``file:line (module)`` of the call, or what is known of it, for messages."""
    file, line, _ = user_frame(node)
    stack = node.meta.get("nn_module_stack") or {}
    module = ""
    if stack:
        path, _cls = list(stack.values())[-1]
        module = module_path(path) or "<root>"
    if file is not None:
        return f"{file}:{line}" + (f" ({module})" if module else "")
    return module or node.name
