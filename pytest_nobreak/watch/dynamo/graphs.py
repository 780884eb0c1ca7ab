"""The tap where Dynamo hands each graph to the backend: the graph's host syncs, and a wrapper that
counts each call of the compiled graph."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from typing import Any

import torch._dynamo.output_graph as _output_graph
from torch._functorch import config as _functorch_config
from torch.fx._lazy_graph_module import _LazyGraphModule

from asic_backend.lower.host_syncs import find_host_syncs
from pytest_nobreak.watch.dynamo.records import (
    FrameRecord,
    RawGraph,
    RawGraphSyncs,
    SyncSite,
    _compiling_frame,
    _dispatch,
    _sinks,
)
from pytest_nobreak.watch.dynamo.stacks import _stack_above_dynamo
from pytest_nobreak.watch.sites import Frame

#: The syncs AOTAutograd's graphs hold, for the Dynamo graph this thread compiles: a list once
#: AOTAutograd ran, ``None`` before; ``_NOT_COMPILING`` outside any compile (an AOTAutograd run
#: of its own, such as ``torch.export``'s, is none of ours). Restored on the way out.
_compiling = threading.local()


_NOT_COMPILING: Any = object()


def _install_compiler_tap() -> None:
    """Read each graph's host syncs where Dynamo hands it to the backend, and count its calls.

    Every graph is called through a wrapper that tells the sinks of each call (one list check
    when there are none): what a test runs is counted whether it compiled it itself, an
    earlier test did, or it was compiled before any test. The wrapper is installed whether a
    sink listens or not, for that reason.
    """

    original = _output_graph.OutputGraph.call_user_compiler

    @functools.wraps(original)
    def call_user_compiler(self: Any, gm: Any, example_inputs: Any) -> Any:
        __tracebackhide__ = True  # a tap: not in the user's tracebacks
        if getattr(self, "export", False):
            return original(self, gm, example_inputs)
        traced = _analysed(find_host_syncs, gm)  # before the backend, which may rewrite it
        key = _graph_key(gm)
        # A float read may be turned back into tensor math by AOTAutograd, whose graph tells;
        # a hit in its cache skips that graph, and the count would depend on the cache.
        uncached = (
            _functorch_config.patch(enable_autograd_cache=False)
            if any(sync.float_read for sync in traced)
            else contextlib.nullcontext()
        )
        outer = getattr(_compiling, "aot", _NOT_COMPILING)
        _compiling.aot = None
        try:
            with uncached:
                compiled = original(self, gm, example_inputs)
            aot = _compiling.aot
        finally:
            _compiling.aot = outer
        syncs = traced if aot is None else _as_traced(aot, traced)
        frame = _compiling_frame() or _root_record(self)
        graph = RawGraph(
            key=(frame.site, key),
            frame=frame,
            syncs=_graph_syncs(syncs) if syncs else None,
        )
        compiled = _real_forward(compiled)

        def counted(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # a tap: not in the user's tracebacks
            if _sinks:
                _dispatch("on_graph_run", graph)
            return compiled(*args, **kwargs)

        return counted

    _output_graph.OutputGraph.call_user_compiler = call_user_compiler  # type: ignore[method-assign]
    _install_aot_tap(find_host_syncs)


def _graph_syncs(syncs: tuple[Any, ...]) -> RawGraphSyncs:
    return RawGraphSyncs(
        tuple(
            SyncSite(
                op=sync.op,
                form=sync.form,
                fix=sync.fix,
                count=sync.count,
                traced=tuple(Frame(f, line, fn) for f, line, fn in sync.frames),
            )
            for sync in syncs
        ),
        compiled_from=tuple(_stack_above_dynamo(2)),
    )


#: Graph nodes that only compute sizes: a dynamic-shape graph has them, its static twin not.
_SIZE_METHODS = frozenset({"size", "dim", "stride", "numel"})


def _graph_key(gm: Any) -> tuple[str, ...]:
    """The ops of a graph, in order, without the arithmetic on symbolic sizes."""
    try:
        out = []
        for node in gm.graph.nodes:
            if node.op == "call_method" and node.target not in _SIZE_METHODS:
                out.append(f"method:{node.target}")
            elif node.op == "call_module":
                out.append(f"module:{node.target}")
            elif node.op == "call_function":
                target = node.target
                module = getattr(target, "__module__", None) or ""
                name = getattr(target, "__name__", None) or str(target)
                if module in ("_operator", "operator", "math") or name.startswith("sym_"):
                    continue
                out.append(f"{module}.{name}")
        return tuple(out)
    except Exception:  # a graph the key cannot read is its own graph
        return (f"graph:{id(gm)}",)


def _root_record(output: Any) -> FrameRecord:
    """A compile the entry tap did not see start (a graph compiled some other way)."""
    code = getattr(getattr(output, "root_tx", None), "f_code", None)
    if code is None:
        return FrameRecord(site=("<unknown>", 0, "<graph>"), code=("<unknown>", "<graph>"))
    return FrameRecord(
        site=(code.co_filename, code.co_firstlineno, code.co_name),
        code=(code.co_filename, code.co_name),
    )


def _real_forward(compiled: Any) -> Any:
    """What Dynamo itself would call for a lazily recompiled graph module (``eager``'s
    ``gm.forward``): its real ``forward``, made now. Wrapped, Dynamo's own check for one no
    longer sees it, and each call would go through ``nn.Module.__call__`` instead."""

    owner = getattr(compiled, "__self__", None)
    if isinstance(owner, _LazyGraphModule) and getattr(compiled, "__name__", "") == "_lazy_forward":
        _LazyGraphModule.force_recompile(owner)
        return owner.forward
    if isinstance(compiled, _LazyGraphModule):
        _LazyGraphModule.force_recompile(compiled)
    return compiled


def _install_aot_tap(find_host_syncs: Any) -> None:
    """Read the syncs of the graph AOTAutograd compiles, after the pass that may remove some."""
    try:
        # Lazy: feature-detected: an older torch lays AOTAutograd out otherwise.
        from torch._functorch._aot_autograd import graph_compile
    except ImportError:  # an older layout: the Dynamo graph's syncs stand
        return
    original = getattr(graph_compile, "_apply_tensorify_python_scalars", None)
    if original is None:
        return

    @functools.wraps(original)
    def apply(module: Any) -> None:
        __tracebackhide__ = True  # a tap: not in the user's tracebacks
        original(module)
        found = getattr(_compiling, "aot", _NOT_COMPILING)
        if found is not _NOT_COMPILING:
            _compiling.aot = [*(found or ()), *_analysed(find_host_syncs, module)]

    graph_compile._apply_tensorify_python_scalars = apply


def _analysed(find: Any, gm: Any) -> tuple[Any, ...]:
    """``find(gm)``, or no syncs if the analysis fails: it must never fail a compile (the taps
    watch every compile of the process, watched test or not)."""
    try:
        return tuple(find(gm))
    except Exception:
        return ()


#: Aten ops that stand for the same read in Dynamo's graph and AOTAutograd's.
_SAME_READ = {"aten.item": "aten._local_scalar_dense"}


def _as_traced(aot: list[Any], traced: tuple[Any, ...]) -> tuple[Any, ...]:
    """AOTAutograd's syncs, named as the user wrote them: a sync at the same traced stack as
    one of the Dynamo graph, of the same aten op (``aten._local_scalar_dense`` is
    ``Tensor.item``), or the only one there, is that sync; any other keeps its aten name."""
    by_stack: dict[Any, list[Any]] = {}
    for sync in traced:
        by_stack.setdefault(sync.frames, []).append(sync)
    out = []
    for sync in aot:
        here = by_stack.get(sync.frames, [])
        same = [t for t in here if _SAME_READ.get(t.aten, t.aten) == sync.aten]
        known = same[0] if same else (here[0] if len(here) == 1 else None)
        out.append(
            sync if known is None else dataclasses.replace(sync, op=known.op, form=known.form)
        )
    return tuple(out)
