"""How a compiled inference graph is called: through AOTAutograd's runtime wrappers, or straight
where they would do nothing.

AOTAutograd wraps the graph it compiled in layers that, at each call, dedupe aliased arguments,
thread effect tokens, wrap and unwrap tensor subclasses, replay input mutations, rebuild outputs
that alias inputs, and turn autocast and grad mode off around the graph
(``torch/_functorch/_aot_autograd/runtime_wrappers.py``). For the graph of most inference models
none of that applies, yet the layers cost a dozen Python frames a call: at decode, with the
caches cold as a model's other layers leave them, about a tenth of an 8-token MLP's DUT time
on top of its GEMMs (docs/benchmarks.md).

So where :func:`needs_no_wrappers` finds, in the metadata AOTAutograd traced, that every layer
would pass its call through untouched, the backend hands Dynamo :func:`straight_call` instead:
the graph on the same arguments, grad mode off as the wrappers would set it. Everything else,
and every graph's first call (where AOTAutograd checks custom ops' aliasing), keeps the
wrappers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._functorch._aot_autograd.schemas import OutputType, ViewAndMutationMeta
from torch._guards import TracingContext
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = ["CapturedForward", "capturing", "needs_no_wrappers", "straight_call"]

CompiledFn = Callable[..., Any]


@dataclasses.dataclass
class CapturedForward:
    """What the inference compiler made of one aten graph: the boxed callable (``None`` until
    it ran, or where it was not boxed), how many arguments it takes, and whether AOTAutograd's
    runtime wrappers would pass its calls through untouched."""

    run: CompiledFn | None = None
    arity: int = -1
    plain: bool = False


def capturing(compiler: CompiledFn, captured: CapturedForward) -> CompiledFn:
    """``compiler`` (an AOTAutograd inference compiler), recording into ``captured`` what it
    returns and whether the graph needs the runtime wrappers."""

    def compile_and_capture(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        run = compiler(gm, example_inputs, **kwargs)
        context = TracingContext.try_get()
        captured.run = run if getattr(run, "_boxed_call", False) else None
        captured.arity = len(example_inputs)
        captured.plain = needs_no_wrappers(
            None if context is None else context.fw_metadata, example_inputs
        )
        return run

    return compile_and_capture


def needs_no_wrappers(meta: ViewAndMutationMeta | None, example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd's runtime wrappers leave every call of an inference graph as it is:
    no input mutated (in data or metadata), every output a fresh tensor (none an input or a view
    of one, nor of another output), no effect tokens, no tensor subclass among the inputs, no
    grad-mode change inside the graph. (Autocast is :func:`straight_call`'s to check:
    AOTAutograd turns it off around the compiler.)"""
    if meta is None:
        return False
    if any(info.mutates_data or info.mutates_metadata for info in meta.input_info):
        return False
    if any(info.output_type != OutputType.non_alias for info in meta.output_info):
        return False
    if meta.num_intermediate_bases or meta.tokens or meta.grad_enabled_mutation is not None:
        return False
    return not any(is_traceable_wrapper_subclass(t) for t in example_inputs)


def straight_call(aot_fn: CompiledFn, captured: CapturedForward, arity: int) -> CompiledFn:
    """``aot_fn`` (what AOTAutograd returned for a graph of ``arity`` arguments) or, where
    ``captured`` says its wrappers do nothing and the graph takes the same arguments (none
    deduplicated, no parameters prepended) and autocast is off (with it on, the graph holds its
    casts, and the wrappers turn it off around each call), a function that calls the graph
    directly from the second call on. Called where AOTAutograd was, in the same autocast
    state."""
    run = captured.run
    if run is None or not captured.plain or captured.arity != arity:
        return aot_fn
    if torch._C._is_any_autocast_enabled():
        return aot_fn
    first = True

    def call(*args: Any) -> Any:
        nonlocal first
        if first:  # AOTAutograd's first-call checks
            first = False
            return aot_fn(*args)
        grad = torch.is_grad_enabled()
        if not grad:
            return run(list(args))
        torch._C._set_grad_enabled(False)
        try:
            return run(list(args))
        finally:
            torch._C._set_grad_enabled(True)

    return call
