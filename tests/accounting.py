"""The MAC accounting invariant: nothing does multiply-accumulate work on the host unseen.

For any model, one call's ``DUT MACs + host MACs`` (the device counters) equals what
``torch.utils.flop_counter.FlopCounterMode`` counts for the same call run eagerly, divided by
two, with SDPA on its math path (where FlopCounterMode can see its two matmuls). For the ops
FlopCounterMode has no formula for (``mv``, ``addbmm``, ``_int_mm``, the CPU flash attention
kernel, the fused transformer paths, the ``asic::`` ops) the reference counts with
:data:`REFERENCE_FORMULAS`, written here from each op's definition: not with
:func:`asic_backend.flop_counter_extras`, which comes from the backend's own ``MAC_OPS`` table
and so could not disagree with it.

:func:`checking_every_graph` applies it to every graph compiled with the ``asic`` backend while it
is active: each call of each compiled graph also runs the graph's Dynamo FX module eagerly (on
copies of its tensor inputs, with the RNG state restored) under FlopCounterMode, and raises
:class:`AccountingError` on any difference. Higher-order ops (``cond``, ``while_loop``,
``invoke_subgraph``, checkpointed regions, ...) run as the Python they stand for, the branch
taken or each iteration counted; a graph with one this module cannot run fails its call
instead of going unchecked. ``tests/conftest.py`` turns the check on for every test,
``benchmarks/conftest.py`` for every benchmark (on each graph's first call, checked when the
benchmark ends, so no timed round pays for it), and :mod:`tests.mac_check` in the pytest runs
the tests start in subprocesses.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import fx
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import asic_backend.ops.attention
import asic_backend.ops.conv
import asic_backend.ops.linear
import asic_backend.ops.primitives  # noqa: F401 (each registers its torch.ops.asic ops)
from asic_backend.sim.device import CounterSnapshot, all_devices, total_snapshot

aten = torch.ops.aten
Shape = Sequence[int]


class AccountingError(AssertionError):
    """A compiled call's MACs, DUT plus host, differ from the eager reference (or the graph
    cannot be checked)."""


# ------------------------------------------------------------ the reference's own formulas
# Each takes the op's arguments as FlopCounterMode's shape_wrapper passes them (tensors replaced
# by their shapes) and returns MACs; the table maps them to FLOPs.


def _prod(shape: Shape) -> int:
    return math.prod(int(s) for s in shape)


def _matmul(a: Shape, b: Shape) -> int:
    """``a @ b`` with torch.matmul's rules: a 1-D operand is a row (or column) of one."""
    a2 = [1, *a] if len(a) == 1 else list(a)
    b2 = [*b, 1] if len(b) == 1 else list(b)
    batch = torch.broadcast_shapes(torch.Size(a2[:-2]), torch.Size(b2[:-2]))
    return _prod(batch) * a2[-2] * a2[-1] * b2[-1]


def _linear(x: Shape, w: Shape, transposed: bool = False) -> int:
    """``x [..., K]`` by a weight ``[N, K]`` (``[K, N]`` when ``transposed``)."""
    n = w[-1] if transposed else w[0]
    return _prod(x[:-1]) * x[-1] * n


def _attention(q: Shape, k: Shape, v: Shape) -> int:
    """Scores ``Q Kᵀ`` and ``P V`` for every query head (GQA heads share K and V, not work)."""
    return _prod(q[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])


def _attention_backward(q: Shape, k: Shape, v: Shape) -> int:
    """The scores again, then dV = Pᵀ dO, dP = dO Vᵀ, dQ = dS K and dK = dSᵀ Q."""
    return _prod(q[:-2]) * q[-2] * k[-2] * (3 * q[-1] + 2 * v[-1])


def _conv(
    x: Shape,
    w: Shape,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    groups: int,
) -> int:
    """A convolution: every output point meets ``C_in / groups`` channels of its kernel; a
    transposed one: every input point meets the whole ``[C_out / groups, k...]`` of its kernel."""
    spatial = len(w) - 2
    kernel = _prod(w[2:])
    if transposed:  # w [C_in, C_out / groups, k...]
        return x[0] * x[1] * _prod(x[2:]) * w[1] * kernel
    out = [
        (x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
        for i in range(spatial)
    ]
    return x[0] * w[0] * _prod(out) * (x[1] // groups) * kernel


def _encoder_layer(src: Shape, *args: Any) -> int:
    """``_transformer_encoder_layer_fwd(src [B, L, E], E, heads, qkv_weight [3E, E], ...,
    ffn_weight_1 [F, E], ...)``: the in-projection, QKᵀ and PV, the out-projection, two FFN
    matmuls."""
    e, ffn = src[-1], args[13][0]
    tokens, length = _prod(src[:-1]), src[-2]
    return tokens * e * 3 * e + 2 * tokens * length * e + tokens * e * e + 2 * tokens * e * ffn


def _native_mha(query: Shape, key: Shape, *args: Any) -> int:
    """``_native_multi_head_attention(q [B, L, E], k [B, S, E], v, ...)``: the three
    projections, QKᵀ and PV, the out-projection."""
    e, length, source = query[-1], query[-2], key[-2]
    batch = _prod(query[:-2])
    projections = batch * (length + 2 * source) * e * e + batch * length * e * e
    return projections + 2 * batch * length * source * e


def _asic_ops() -> dict[Any, Callable[..., int]]:
    asic = torch.ops.asic
    conv = lambda x, w, _b, s, p, d, g, t, *_: _conv(x, w, s, p, d, t, g)  # noqa: E731
    qconv = lambda x, _xs, _xz, w, _ws, _wz, _b, s, p, d, g, t, *_: _conv(x, w, s, p, d, t, g)  # noqa: E731
    linear = lambda x, w, _b, transposed, *_: _linear(x, w, transposed)  # noqa: E731
    return {
        asic.dyn_linear: linear,
        asic.dyn_linear_fusable: linear,
        asic.dyn_weight_mm: lambda x, w, transposed, *_: _linear(x, w, transposed),
        asic.dyn_qlinear: lambda x, w, *_: _linear(x, w),
        asic.qlinear: lambda x, _s, _z, w, *_: _linear(x, w),
        asic.mm_i32: lambda a, w, *_: _linear(a, w),
        asic.linear_requant: lambda a, w, *_: _linear(a, w),
        asic.dyn_matmul: lambda a, b, *_: _matmul(a, b),
        asic.int_mm: lambda a, b, *_: _matmul(a, b),
        asic.dyn_sdpa: lambda q, k, v, *_: _attention(q, k, v),
        asic.dyn_conv: conv,
        asic.dyn_conv_fusable: conv,
        asic.dyn_weight_conv: lambda x, w, s, p, d, g, t, *_: _conv(x, w, s, p, d, t, g),
        asic.qconv: qconv,
    }


def _as_flops(macs: Callable[..., int]) -> Callable[..., int]:
    def flops(*args: Any, out_shape: Any = None, **_scalars: Any) -> int:  # alpha, beta, ...
        return 2 * macs(*args)

    return flops


def _formulas() -> dict[Any, Callable[..., int]]:
    mm = lambda a, b, *_: _matmul(a, b)  # noqa: E731
    add_mm = lambda _input, a, b, *_: _matmul(a, b)  # noqa: E731
    add_bmm = lambda _input, a, b, *_: a[0] * _matmul(a[1:], b[1:])  # noqa: E731 (summed over the batch)
    sdpa = lambda q, k, v, *_: _attention(q, k, v)  # noqa: E731
    macs: dict[Any, Callable[..., int]] = {
        aten.mv: mm,
        aten.dot: mm,
        aten.vdot: mm,
        aten._int_mm: mm,
        aten.matmul: mm,
        aten.addmv: add_mm,
        aten.addmv_: add_mm,
        aten.addmm_: add_mm,
        aten.baddbmm_: add_mm,
        aten.addbmm: add_bmm,
        aten.addbmm_: add_bmm,
        aten.linear: lambda x, w, *_: _linear(x, w),
        aten.scaled_dot_product_attention: sdpa,
        aten._scaled_dot_product_attention_math: sdpa,
        aten._scaled_dot_product_flash_attention_for_cpu: sdpa,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: (
            lambda _grad, q, k, v, *_: _attention_backward(q, k, v)
        ),
        aten._transformer_encoder_layer_fwd: _encoder_layer,
        aten._native_multi_head_attention: _native_mha,
        **_asic_ops(),
    }
    return {packet: _as_flops(formula) for packet, formula in macs.items()}


#: FlopCounterMode ``custom_mapping`` entries (FLOPs) for the MAC ops it has no formula for.
#: tests/asic/test_macs.py holds them to hand-computed counts and to the backend's
#: ``flop_counter_extras()``, and fails when the backend counts an op this table lacks.
REFERENCE_FORMULAS: dict[Any, Callable[..., int]] = _formulas()


# ------------------------------------------------------------------------ the reference run


def reference_macs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """The MACs of one eager call of ``fn``: FlopCounterMode's FLOPs / 2 (SDPA on its math path,
    unless the graph needs the CPU kernel's output layout: torch 2.12's exported MHA ``view``s
    it, and :data:`REFERENCE_FORMULAS` counts that kernel)."""
    try:
        flops = _flops(fn, True, *args, **kwargs)
    except RuntimeError as exc:
        if "view size is not compatible" not in str(exc):
            raise
        flops = _flops(fn, False, *args, **kwargs)
    assert flops % 2 == 0, flops
    return flops // 2


def _flops(fn: Callable[..., Any], math_path: bool, *args: Any, **kwargs: Any) -> int:
    with (
        torch.no_grad(),
        sdpa_kernel(SDPBackend.MATH) if math_path else contextlib.nullcontext(),
        FlopCounterMode(display=False, custom_mapping=REFERENCE_FORMULAS) as counter,
    ):
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


def accounted(before: CounterSnapshot, after: CounterSnapshot) -> int:
    """DUT MACs + host MACs counted between two snapshots."""
    return (after.macs - before.macs) + (after.host_macs - before.host_macs)


def _run(gm: fx.GraphModule, *args: Any) -> Any:
    return _Eager(gm).run(*args)


def _while_loop(cond: Any, body: Any, carried: Sequence[Any], extra: Sequence[Any]) -> Any:
    values = tuple(carried)
    while bool(_run(cond, *values, *extra)):
        values = tuple(_run(body, *values, *extra))
    return values


def _map(body: Any, xs: Sequence[torch.Tensor], extra: Sequence[Any]) -> Any:
    rows = [_run(body, *(x[i] for x in xs), *extra) for i in range(xs[0].shape[0])]
    return tuple(torch.stack([row[j] for row in rows]) for j in range(len(rows[0])))


#: How each higher-order op a Dynamo graph may hold runs eagerly, as the Python it stands for
#: (FlopCounterMode runs neither ``cond`` nor ``while_loop`` itself in torch 2.13). A graph with
#: another one fails its call with :class:`AccountingError`: add it here.
HIGHER_ORDER_OPS: dict[str, Callable[..., Any]] = {
    "cond": lambda pred, yes, no, operands: _run(yes if bool(pred) else no, *operands),
    "while_loop": _while_loop,
    "map_impl": _map,
    "invoke_subgraph": lambda body, _identifier, *operands: _run(body, *operands),
    # A torch.autograd.Function: its forward graph returns (output, values saved for backward).
    "autograd_function_apply": lambda fwd, _bwd, *args, **_options: _run(fwd, *args)[0],
    "tag_activation_checkpoint": lambda body, *args, **_options: _run(body, *args),
    "wrap": lambda body, *args: _run(body, *args),
    "wrap_activation_checkpoint": lambda body, *args, **_options: _run(body, *args),
    "wrap_with_set_grad_enabled": lambda _enabled, body, *args: _run(body, *args),
    "wrap_with_autocast": lambda device, dtype, enabled, cache, body, *args: _autocast(
        device, dtype, enabled, cache, body, *args
    ),
}


def _autocast(device: str, dtype: Any, enabled: bool, cache: Any, body: Any, *args: Any) -> Any:
    with torch.autocast(device, dtype=dtype, enabled=enabled, cache_enabled=cache):
        return _run(body, *args)


class _Eager(fx.Interpreter):
    """A Dynamo graph run op by op, its higher-order ops as :data:`HIGHER_ORDER_OPS` says."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if isinstance(target, torch._ops.HigherOrderOperator):
            return HIGHER_ORDER_OPS[target.name()](*args, **kwargs)
        return super().call_function(target, args, kwargs)


def _higher_order_ops(gm: fx.GraphModule) -> set[str]:
    return {
        node.target.name()
        for module in gm.modules()
        if isinstance(module, fx.GraphModule)
        for node in module.graph.nodes
        if isinstance(node.target, torch._ops.HigherOrderOperator)
    }


def _snapshot(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` as Dynamo made it, sub-graphs included: the lowering rewrites them in place."""
    copied = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    for name, child in gm.named_children():
        if isinstance(child, fx.GraphModule):
            setattr(copied, name, _snapshot(child))
    return copied


@contextmanager
def _devices_untouched() -> Iterator[None]:
    """The reference run of a graph that calls ``asic::`` ops runs them: on the devices' counters
    as they were, so the test sees the compiled call's figures only."""
    saved = [(device, _state(device)) for device in all_devices()]
    try:
        yield
    finally:
        for device, state in saved:
            vars(device).update(state)


def _state(device: Any) -> dict[str, Any]:
    """A device's counters, sites and per-GEMM records, copied as deep as they are mutated (the
    costs themselves are shared and frozen; its memo of them is a cache, kept)."""
    return {
        **{name: value for name, value in vars(device).items() if type(value) is int},
        "_sites": {site: copy.copy(stats) for site, stats in device._sites.items()},
        "_costs": copy.copy(device._costs),
        "_shapes": {key: list(entry) for key, entry in device._shapes.items()},
    }


def _copy_input(value: Any) -> Any:
    # Plain tensors (inputs, parameters, buffers) are copied so the reference run cannot mutate
    # what the test sees; tensor subclasses (TorchAO weights) are read-only in a forward.
    if type(value) in (torch.Tensor, torch.nn.Parameter):
        return value.detach().clone()
    return value


@dataclasses.dataclass
class Checked:
    """What a :func:`checking_every_graph` block checked: graphs compiled, calls compared."""

    graphs: int = 0
    calls: int = 0
    pending: list[Callable[[], None]] = dataclasses.field(default_factory=list)


class _Graph:
    """One compiled graph and its reference, compared on each call (or its first, deferred)."""

    def __init__(
        self, compiled: Callable[..., Any], reference: fx.GraphModule, checked: Checked, lazy: bool
    ) -> None:
        self.compiled, self.reference, self.checked, self.lazy = compiled, reference, checked, lazy
        self.unknown = sorted(_higher_order_ops(reference) - set(HIGHER_ORDER_OPS))
        self.interpret = bool(_higher_order_ops(reference))
        self.calls = 0

    def expected(self, inputs: list[Any]) -> int:
        run = (lambda *a: _run(self.reference, *a)) if self.interpret else self.reference
        with torch.random.fork_rng(), _devices_untouched():
            return reference_macs(run, *inputs)

    def compare(self, inputs: list[Any], got: tuple[int, int]) -> None:
        expected = self.expected(inputs)
        self.checked.calls += 1
        if sum(got) != expected:
            raise AccountingError(
                f"MAC accounting: the DUT counted {got[0]} and the host {got[1]} MACs (total "
                f"{sum(got)}), but the graph does {expected} MACs eagerly (FlopCounterMode / 2):"
                f"\n{self.reference.code}"
            )

    def __call__(self, *args: Any) -> Any:
        if self.unknown:
            raise AccountingError(
                f"MAC accounting cannot check a graph with {', '.join(self.unknown)}: say in "
                f"tests/accounting.py HIGHER_ORDER_OPS how it runs eagerly\n{self.reference.code}"
            )
        self.calls += 1
        if self.lazy and self.calls > 1:
            return self.compiled(*args)
        inputs = [_copy_input(a) for a in args]
        before = total_snapshot()
        out = self.compiled(*args)
        after = total_snapshot()
        got = (after.macs - before.macs, after.host_macs - before.host_macs)
        if self.lazy:
            self.checked.pending.append(lambda: self.compare(inputs, got))
        else:
            self.compare(inputs, got)
        return out


_active: list[Checked] = []
_unchecked: list[Callable[..., Any]] = []  # AsicBackend.__call__ before the outermost block


def active() -> bool:
    """Whether a :func:`checking_every_graph` block is open in this process."""
    return bool(_active)


@contextmanager
def checking_every_graph(first_call_only: bool = False) -> Iterator[Checked]:
    """Check the invariant on every call of every graph compiled with the asic backend.

    ``first_call_only``: check each graph's first call, after the block (a benchmark's timed
    rounds then pay only for the first call's input copies).
    """
    from asic_backend import backend, notices

    previous = backend.AsicBackend.__call__
    library_frame = notices._library_frame
    # A block inside another (a test of the check, under the suite's) replaces it while open:
    # each graph is compared once, by the innermost block.
    original = _unchecked[0] if _unchecked else previous
    checked = Checked()

    def compile_checked(
        self: backend.AsicBackend, gm: fx.GraphModule, example_inputs: Any
    ) -> Callable[..., Any]:
        reference = _snapshot(gm)  # before the lowering edits gm
        checked.graphs += 1
        graph = _Graph(original(self, gm, example_inputs), reference, checked, first_call_only)
        # Not traced: torch 2.12 runs an exported program's fullgraph code with Dynamo's
        # callback set, and the snapshot's generator would be an error there.
        return torch._dynamo.disable(graph)  # type: ignore[no-any-return]

    backend.AsicBackend.__call__ = compile_checked  # type: ignore[method-assign]
    # The check sits between Dynamo and the backend: the backend's warnings skip it, as they
    # skip torch, to point at the user's line.
    notices._library_frame = lambda filename: filename == __file__ or library_frame(filename)
    _active.append(checked)
    _unchecked.append(original)
    try:
        yield checked
    finally:
        _unchecked.pop()
        _active.remove(checked)
        notices._library_frame = library_frame
        backend.AsicBackend.__call__ = previous  # type: ignore[method-assign]
    for compare in checked.pending:
        compare()
