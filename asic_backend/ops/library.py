"""How the DUT's ``asic::`` ops are registered: one ``torch.library`` kernel and a fake each.

``torch.library.custom_op`` wraps every call in Python layers (an autograd function, a
redispatch, a Dynamo-disabling context, an aliasing check): about 19 µs a call on this project's
2-core CI machine, against about 8 µs for the same kernel registered straight with
``torch.library.Library``. A DUT op runs once per layer per call, and at decode shapes that
difference is a fifth of the GEMV itself, so the DUT ops are registered the direct way:

* the schema is inferred from the annotations, as ``custom_op`` does
  (:func:`torch.library.infer_schema`, no mutated arguments);
* the kernel is ``CompositeExplicitAutograd`` (every device, no decomposition);
* the fake kernel is :func:`torch.library.register_fake`'s, so Dynamo, AOTAutograd and Inductor
  trace through with fake or symbolic shapes.

The Autograd kernel refuses a call autograd would record (an input that requires grad, grad
mode on): the DUT is inference-only, and the lowering emits these ops only where autograd is not
live (:mod:`asic_backend.backend`); a direct call with such inputs must fail, not give gradients
that are silently None.

>>> @dut_op("asic::example_double")
... def example_double(x: torch.Tensor) -> torch.Tensor:
...     return x * 2
>>> @example_double.register_fake
... def _(x: torch.Tensor) -> torch.Tensor:
...     return torch.empty_like(x)
>>> torch.ops.asic.example_double(torch.ones(2))
tensor([2., 2.])
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

import torch

__all__ = ["DIRECT_CALLS", "DutOp", "call_kernels_directly", "dut_op"]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_F = TypeVar("_F", bound=Callable[..., Any])

#: The library fragment every DUT op is defined in (kept alive for the process).
_LIB = torch.library.Library("asic", "FRAGMENT")  # type: ignore[no-untyped-call]
# A typed handle on an untyped torch helper (mypy --strict).
_disable_dynamo: Callable[..., Callable[..., Any]] = getattr(torch, "_disable_dynamo")  # noqa: B009


class DutOp(Generic[_P, _R]):
    """An ``asic::`` op: calling it runs the kernel directly (no dispatch);
    ``torch.ops.asic.<name>`` is the registered operator graphs hold."""

    def __init__(self, qualname: str, kernel: Callable[_P, _R]) -> None:
        namespace, _, name = qualname.partition("::")
        if namespace != "asic" or not name:
            raise ValueError(f"a DUT op is named asic::<name>, got {qualname!r}")
        _LIB.define(name + torch.library.infer_schema(kernel, mutates_args=()))  # type: ignore[no-untyped-call]
        # Called eagerly inside a compiled function (after a graph break), the kernel's frames
        # would be handed to Dynamo to trace: it is not, as custom_op's kernels are not.
        kernel_nd = _disable_dynamo(kernel, recursive=True)
        _LIB.impl(name, kernel_nd, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
        _LIB.impl(name, _inference_only(qualname), "Autograd")  # type: ignore[no-untyped-call]
        self.qualname = qualname
        self._name = name
        self._kernel = kernel
        functools.update_wrapper(self, kernel)
        overload = getattr(torch.ops.asic, name).default
        DIRECT_CALLS[overload] = _direct_call(name, overload, kernel)

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if torch.compiler.is_compiling():  # traced: the registered op, one node of the graph
            op: Callable[..., _R] = getattr(torch.ops.asic, self._name)
            return op(*args, **kwargs)
        return self._kernel(*args, **kwargs)

    def register_fake(self, fake: _F) -> _F:
        """Register ``fake`` as the op's fake kernel (shapes and dtypes only); a decorator."""
        torch.library.register_fake(self.qualname, fake, lib=_LIB)
        return fake


def _inference_only(qualname: str) -> Callable[..., Any]:
    """The op's Autograd kernel: the DUT has no backward, so a call that autograd would record
    is an error now, not gradients that silently stay None at ``backward()``."""
    name = qualname.partition("::")[2]
    op = getattr(torch.ops.asic, name).default  # defined before its kernels are registered

    def autograd(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values())
        ):
            raise RuntimeError(
                f"{qualname} is inference-only (the DUT has no backward) and an input requires "
                "grad: call it under torch.no_grad() or torch.inference_mode()"
            )
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)

    return autograd


#: Each DUT op's kernel as a compiled inference graph calls it (:func:`call_kernels_directly`).
DIRECT_CALLS: dict[Any, Callable[..., Any]] = {}


def _direct_call(name: str, overload: Any, kernel: Callable[..., Any]) -> Callable[..., Any]:
    """The kernel, called straight from a graph. The dispatcher's Autograd and Python layers
    around a DUT op cost a few µs a call when the caches are warm, and tens of µs when the model's
    other layers have evicted them: at decode shapes, a tenth of the GEMV. Whoever watches ops
    (a dispatch or function mode such as FlopCounterMode, the profiler) still sees the op."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if (
            torch._C._len_torch_dispatch_stack()
            or torch._C._is_torch_function_mode_enabled()
            or torch.autograd.profiler._is_profiler_enabled
        ):
            return overload(*args, **kwargs)
        return kernel(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"asic_{name}"
    return call


def call_kernels_directly(gm: torch.fx.GraphModule) -> int:
    """Point every DUT-op node of ``gm`` (an aten graph run as is, autograd not live) at its
    kernel's :data:`DIRECT_CALLS` entry; return how many. The graph runs inside Dynamo's
    compiled code, which Dynamo never traces, so the kernel needs no disabling of its own; and
    the lowering emits DUT ops only where autograd is not live, which the Autograd kernel would
    check."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in DIRECT_CALLS:
            node.target = DIRECT_CALLS[node.target]
            changed += 1
    if changed:
        gm.recompile()
    return changed


def dut_op(qualname: str) -> Callable[[Callable[_P, _R]], DutOp[_P, _R]]:
    """Define ``qualname`` (``asic::<name>``) with the decorated function as its kernel."""

    def define(kernel: Callable[_P, _R]) -> DutOp[_P, _R]:
        return DutOp(qualname, kernel)

    return define
