"""The MAC accounting invariant: nothing does multiply-accumulate work on the host unseen.

For any model, one call's ``DUT MACs + host MACs`` (the device counters) equals what
``torch.utils.flop_counter.FlopCounterMode`` counts for the same call run eagerly, divided by
two, with SDPA on its math path (where FlopCounterMode can see its two matmuls) and
:func:`asic_backend.flop_counter_extras` for the ops it has no formula for (``mv``, ``addbmm``,
``_int_mm``, the CPU flash attention kernel, ...).

:func:`checking_every_graph` applies it to every graph compiled with the ``asic`` backend while it
is active: each call of each compiled graph also runs the graph's Dynamo FX module eagerly (on
copies of its tensor inputs, with the RNG state restored) under FlopCounterMode, and raises
:class:`AccountingError` on any difference. ``tests/conftest.py`` turns it on for every test.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import fx
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from asic_backend import flop_counter_extras
from asic_backend.sim.device import CounterSnapshot, total_snapshot


class AccountingError(AssertionError):
    """A compiled call's MACs, DUT plus host, differ from the eager reference."""


def reference_macs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """The MACs of one eager call of ``fn``: FlopCounterMode's FLOPs / 2 (SDPA on its math path,
    unless the graph needs the CPU kernel's output layout: torch 2.12's exported MHA ``view``s
    it, and ``flop_counter_extras`` counts that kernel)."""
    try:
        flops = _flops(fn, True, *args, **kwargs)
    except RuntimeError as exc:
        if "view size is not compatible" not in str(exc):
            raise
        flops = _flops(fn, False, *args, **kwargs)
    assert flops % 2 == 0, flops
    return flops // 2


def _flops(fn: Callable[..., Any], math: bool, *args: Any, **kwargs: Any) -> int:
    with (
        torch.no_grad(),
        sdpa_kernel(SDPBackend.MATH) if math else contextlib.nullcontext(),
        FlopCounterMode(display=False, custom_mapping=flop_counter_extras()) as counter,
    ):
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


def accounted(before: CounterSnapshot, after: CounterSnapshot) -> int:
    """DUT MACs + host MACs counted between two snapshots."""
    return (after.macs - before.macs) + (after.host_macs - before.host_macs)


def _copy_input(value: Any) -> Any:
    # Plain tensors (inputs, parameters, buffers) are copied so the reference run cannot mutate
    # what the test sees; tensor subclasses (TorchAO weights) are read-only in a forward.
    if type(value) in (torch.Tensor, torch.nn.Parameter):
        return value.detach().clone()
    return value


def _no_eager_reference(gm: fx.GraphModule) -> bool:
    """Graphs FlopCounterMode cannot count run eagerly: ones calling ``asic::`` ops themselves,
    and ones with higher-order ops (run as a graph, ``cond`` counts 0 and ``invoke_subgraph``
    raises); the tests of those compare with the eager model instead."""
    for node in gm.graph.nodes:
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and target.namespace == "asic":
            return True
        if isinstance(target, torch._ops.HigherOrderOperator):
            return True
    return False


def _checked(compiled: Callable[..., Any], reference: fx.GraphModule) -> Callable[..., Any]:
    @torch._dynamo.disable  # type: ignore[untyped-decorator]
    def check(inputs: list[Any], before: CounterSnapshot, after: CounterSnapshot) -> None:
        with torch.random.fork_rng():
            expected = reference_macs(reference, *inputs)
        got = accounted(before, after)
        if got != expected:
            raise AccountingError(
                f"MAC accounting: the DUT counted {after.macs - before.macs} and the host "
                f"{after.host_macs - before.host_macs} MACs (total {got}), but the graph does "
                f"{expected} MACs eagerly (FlopCounterMode / 2):\n{reference.code}"
            )

    # Not traced either: torch 2.12 runs an exported program's fullgraph code with Dynamo's
    # callback set, and the snapshot's generator would be an error there.
    @torch._dynamo.disable  # type: ignore[untyped-decorator]
    def call(*args: Any) -> Any:  # Dynamo calls a backend's function with the inputs unpacked
        inputs = [_copy_input(a) for a in args]
        before = total_snapshot()
        out = compiled(*args)
        check(inputs, before, total_snapshot())
        return out

    return call


@contextmanager
def checking_every_graph() -> Iterator[None]:
    """Check the invariant on every call of every graph compiled with the asic backend."""
    from asic_backend import backend

    original = backend.AsicBackend.__call__

    def compile_checked(
        self: backend.AsicBackend, gm: fx.GraphModule, example_inputs: Any
    ) -> Callable[..., Any]:
        if _no_eager_reference(gm):
            return original(self, gm, example_inputs)
        reference = fx.GraphModule(gm, copy.deepcopy(gm.graph))  # before the lowering edits gm
        return _checked(original(self, gm, example_inputs), reference)

    backend.AsicBackend.__call__ = compile_checked  # type: ignore[method-assign]
    try:
        yield
    finally:
        backend.AsicBackend.__call__ = original  # type: ignore[method-assign]
