"""How a compiled inference graph is called: through AOTAutograd's runtime wrappers, or straight
where they would do nothing.

AOTAutograd wraps the graph it compiled in layers that, at each call, dedupe aliased arguments,
thread effect tokens, wrap and unwrap tensor subclasses, replay input mutations, rebuild outputs
that alias inputs, mark outputs' dynamic dims for the next graph, and turn autocast and grad
mode off around the graph (``torch/_functorch/_aot_autograd/runtime_wrappers.py``). For the
graph of most inference models none of that applies, yet the layers cost a dozen Python frames
a call: 4 to 6 µs warm, 30 to 50 µs with the caches cold as a model's other layers leave them
(an 8-token MLP 2048 → 8192 → 2048, two threads, AVX-512 VNNI host: about 1% of its DUT
time).

So where :func:`needs_no_wrappers` finds, in the metadata AOTAutograd traced, that every layer
would pass its call through untouched, the backend hands Dynamo :func:`straight_call` instead:
the graph on the same arguments, grad mode off as the wrappers would set it. The first call
still goes through the wrappers (AOTAutograd checks custom ops' aliasing then), and it decides:
a tensor subclass among its arguments or its outputs keeps them for good (the metadata the
compiler sees is of the subclasses' inner tensors, so only the call can tell).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
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
        captured.plain = needs_no_wrappers(None if context is None else context.fw_metadata)
        return run

    return compile_and_capture


def needs_no_wrappers(meta: ViewAndMutationMeta | None) -> bool:
    """Whether AOTAutograd's runtime wrappers leave every call of an inference graph as it is,
    by its metadata: no input mutated (in data or metadata), every output a fresh tensor (none
    an input or a view of one, nor of another output), no output dim marked dynamic, no effect
    tokens, no grad-mode change inside the graph. (Autocast and tensor subclasses are
    :func:`straight_call`'s to check: AOTAutograd turns autocast off around the compiler and
    hands it the subclasses' inner tensors.)"""
    if meta is None:
        return False
    if any(info.mutates_data or info.mutates_metadata for info in meta.input_info):
        return False
    if any(info.output_type != OutputType.non_alias for info in meta.output_info):
        return False
    if getattr(meta, "dynamic_outputs", False):  # the wrappers mark them for the next graph
        return False
    return not (
        meta.num_intermediate_bases or meta.tokens or meta.grad_enabled_mutation is not None
    )


def straight_call(
    aot_fn: CompiledFn, captured: CapturedForward, example_inputs: Sequence[Any]
) -> CompiledFn:
    """``aot_fn`` (what AOTAutograd returned for the graph Dynamo gave with ``example_inputs``)
    or, where ``captured`` says its wrappers do nothing, the graph takes the same arguments (none
    deduplicated, no parameters prepended, none a list that AOTAutograd flattens) and autocast
    is off (with it on, the graph holds its casts, and the wrappers turn it off around each
    call), a function that calls the graph directly from the second call on, unless the first
    call's arguments or outputs hold a tensor subclass. Called where AOTAutograd was, in the
    same autocast state."""
    run = captured.run
    if run is None or not captured.plain or captured.arity != len(example_inputs):
        return aot_fn
    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        return aot_fn
    if torch._C._is_any_autocast_enabled():
        return aot_fn
    straight = False
    first = True

    def call(*args: Any) -> Any:
        nonlocal first, straight
        if straight:
            if not torch.is_grad_enabled():
                return run(list(args))
            torch._C._set_grad_enabled(False)
            try:
                return run(list(args))
            finally:
                torch._C._set_grad_enabled(True)
        out = aot_fn(*args)
        if first:  # Dynamo's guards hold the arguments' types, and so the outputs', from now on
            first = False
            straight = _plain(args) and _plain(out if isinstance(out, (list, tuple)) else (out,))
        return out

    return call


def _plain(values: Iterable[Any]) -> bool:
    return not any(is_traceable_wrapper_subclass(v) for v in values)
