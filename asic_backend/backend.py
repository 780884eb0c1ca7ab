"""``torch.compile(backend="asic")``: linears and matmuls on the simulated DUT, the rest on host.

The backend lowers the Dynamo graph (:mod:`asic_backend.lower.driver`), then hands it to AOTAutograd
for the host part, as ``aot_eager`` does (``torch/_dynamo/backends/debugging.py``): by default
the aten graph runs as is (fast compiles, eager's kernels); ``host="inductor"`` compiles it with
inductor (``torch/_dynamo/backends/inductor.py``). Before the host compiler, every matmul-class
op left in the aten graph is counted as a host fallback with its MACs
(:mod:`asic_backend.lower.accounting`). The DUT is inference-only: while autograd is live the
graph runs on the host, each of its matmul-class ops a counted host fallback, and outside a
harness that reports them the backend warns once per process.

>>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
>>> with torch.no_grad():
...     y = torch.compile(model, backend="asic")(torch.randn(8, 64))   # preset from the env
>>> be = make_backend(config="gemmini", quantize="none", host="inductor")
>>> y = torch.compile(model, backend=be, fullgraph=True)(torch.randn(8, 64))
>>> y = torch.compile(model, backend="asic", options={"config": "tpu_v1"})(torch.randn(8, 64))
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import fx
from torch._dynamo.backends import debugging
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition

from asic_backend.lower.accounting import (
    AUTOGRAD_REASON,
    BACKWARD_REASON,
    account_host_macs,
    account_host_syncs,
)
from asic_backend.lower.driver import (
    POLICIES,
    LoweringOptions,
    LoweringSummary,
    Policy,
    lower,
    lower_aten,
)
from asic_backend.lower.fx_nodes import example_value
from asic_backend.lower.rewrite import graph_modules, name_ops
from asic_backend.notices import AsicHostWarning, say_once
from asic_backend.ops.fusable import FUSABLE
from asic_backend.ops.library import call_kernels_directly
from asic_backend.runtime import CapturedForward, capturing, straight_call
from asic_backend.sim.config import AsicConfig
from asic_backend.sim.device import Device, get_device
from asic_backend.sim.macs import mac_op

__all__ = ["OPTION_KEYS", "AsicBackend", "AsicHostWarning", "asic_backend", "make_backend"]

log = logging.getLogger(__name__)

HOSTS: tuple[str, ...] = ("aten", "inductor")
#: The keys ``torch.compile(..., backend="asic", options={...})`` accepts: make_backend's arguments.
OPTION_KEYS: tuple[str, ...] = ("config", "quantize", "matmul", "host")

CompiledFn = Callable[..., Any]

_AUTOGRAD_MESSAGE = (
    f"asic backend: {AUTOGRAD_REASON}; each of its matmul-class ops counts as a host fallback"
)


def _choice(name: str, value: object, allowed: Sequence[str]) -> Any:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(
            f"asic backend: {name}={value!r} is not one of {', '.join(map(repr, allowed))}"
        )
    return value


def _resolve_config(config: AsicConfig | str | None) -> AsicConfig | None:
    if config is None or isinstance(config, AsicConfig):
        return config
    if isinstance(config, str):
        return AsicConfig.load(config)
    raise TypeError(
        f"asic backend: config must be an AsicConfig, a preset name or a TOML path, got {config!r}"
    )


class AsicBackend:
    """A configured ``asic`` backend: a Dynamo compiler function (see :func:`make_backend`).

    >>> be = AsicBackend(config="gemmini", quantize="none")
    >>> be
    AsicBackend(config=gemmini, quantize='none', matmul='none', host='aten')
    >>> be.device.key
    'gemmini'
    """

    def __init__(
        self,
        config: AsicConfig | str | None = None,
        quantize: str = "dynamic",
        matmul: str | None = None,
        host: str = "aten",
    ) -> None:
        self.config = _resolve_config(config)
        self.quantize: Policy = _choice("quantize", quantize, POLICIES)
        self.matmul: Policy = _choice(
            "matmul", self.quantize if matmul is None else matmul, POLICIES
        )
        self.host: str = _choice("host", host, HOSTS)

    def __repr__(self) -> str:
        config = "from $ASIC_BACKEND_CONFIG" if self.config is None else self.config.key
        return (
            f"AsicBackend(config={config}, quantize={self.quantize!r}, matmul={self.matmul!r}, "
            f"host={self.host!r})"
        )

    @property
    def device(self) -> Device:
        """The device the next compiled graph runs on (``None`` config: read from the env now)."""
        return get_device(self.config)

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledFn:
        options = LoweringOptions(
            device=self.device.key, quantize=self.quantize, matmul=self.matmul
        )
        if _autograd_live(example_inputs):
            # Every matmul-class op of the graph is then a counted host fallback (accounting).
            say_once(_AUTOGRAD_MESSAGE)
            name_ops(gm)
            return self._host(gm, example_inputs, options, AUTOGRAD_REASON)
        _log_summary(lower(gm, options))
        return self._host(gm, example_inputs, options, None)

    def _host(
        self,
        gm: fx.GraphModule,
        example_inputs: Sequence[Any],
        options: LoweringOptions,
        forward_reason: str | None,
    ) -> CompiledFn:
        """The host part, through AOTAutograd, with the aten passes before the host compiler."""
        if self.host == "inductor":
            # Lazy: Inductor's import takes seconds: only host="inductor" needs it.
            from torch._inductor.compile_fx import compile_fx, compile_fx_inner

            # Lazy: Inductor's import takes seconds: only host="inductor" needs it.
            from torch._inductor.decomposition import select_decomp_table

            # Inductor decomposes small mm/addmm/bmm and every mv/dot into multiplies and sums
            # while AOTAutograd traces, before the accounting pass could see them: keep them.
            keep = {op: fn for op, fn in select_decomp_table().items() if mac_op(op) is None}
            if forward_reason is None:  # DUT ops only exist where autograd is not live
                _fusable(gm)
            inner = _after(options, compile_fx_inner, forward_reason)
            # Inductor's caches key on the graph before the aten passes, which they would skip
            # on a hit (and serve whatever an older backend made of it): off, for this compile.
            with torch._functorch.config.patch(enable_autograd_cache=False):
                compiled: Any = compile_fx(
                    gm,
                    list(example_inputs),
                    inner_compile=inner,
                    decompositions=keep,
                    config_patches={"fx_graph_cache": False, "fx_graph_remote_cache": False},
                )
            return cast(CompiledFn, compiled)

        # Looked up per compile, not at import: the tests read the graph it is handed.
        forward_compiler = debugging.boxed_nop
        captured = CapturedForward()
        if forward_reason is None:  # an inference graph: maybe called straight (runtime.py)
            forward_compiler = capturing(forward_compiler, captured)
        compiler = aot_autograd(
            fw_compiler=_after(options, forward_compiler, forward_reason, direct=True),
            bw_compiler=_after(options, debugging.boxed_nop, BACKWARD_REASON),
            partition_fn=min_cut_rematerialization_partition,
            keep_inference_input_mutations=True,
        )
        return straight_call(compiler(gm, example_inputs), captured, example_inputs)


def _after(
    options: LoweringOptions,
    compiler: Callable[..., Any],
    forward_reason: str | None,
    *,
    direct: bool = False,
) -> Callable[..., Any]:
    """``compiler``, preceded by the aten passes: the lowering of the tagged regions, then the
    accounting of every matmul-class op left on the host; with ``direct`` (an aten graph that
    runs as is), the DUT ops of an inference graph then call their kernels directly."""

    def compile_lowered(gm: fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        reason = BACKWARD_REASON if kwargs.get("is_backward") else forward_reason
        if reason is None:
            _log_summary(lower_aten(gm, options))
            # Only where the DUT runs the graph: under autograd it all runs on the host.
            account_host_syncs(gm, options)
        _log_summary(account_host_macs(gm, options, reason))
        if reason is None and direct:
            for module in graph_modules(gm):
                call_kernels_directly(module)
        return compiler(gm, example_inputs, **kwargs)

    return compile_lowered


def _fusable(gm: fx.GraphModule) -> None:
    """Swap each DUT op that has a fusable form (:data:`asic_backend.ops.fusable.FUSABLE`) for it,
    so Inductor fuses its host work (quantize, rescale) with the neighbouring ops.

    Only on float32 activations on the CPU: with bfloat16 or float16 ones, eager rounds the scale
    to that dtype between steps, which Inductor's fused kernel would skip (one ulp of the scale
    is a different int8 value), and Inductor's GPU kernels may turn a division by a constant
    into a multiply; those keep the op whole and bit-exact.
    """
    for module in graph_modules(gm):
        swapped = False
        for node in module.graph.nodes:
            if node.op != "call_function" or node.target not in FUSABLE:
                continue
            x = example_value(node.args[0]) if isinstance(node.args[0], fx.Node) else None
            # CPU only: Inductor's CPU kernels keep eager's divisions; its GPU ones may not.
            if isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.device.type == "cpu":
                node.target = FUSABLE[node.target]
                swapped = True
        if swapped:
            module.recompile()


def _autograd_live(example_inputs: Sequence[Any]) -> bool:
    # AOTAutograd's own test for building a backward graph (params are among the inputs).
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs
    )


def _log_summary(summary: LoweringSummary) -> None:
    if log.isEnabledFor(logging.DEBUG):
        for site in summary.dut:
            log.debug("asic: DUT  %s", site)
        for fallback in summary.host:
            where = f"{fallback.file}:{fallback.line}" if fallback.file else "?"
            log.debug("asic: HOST %s at %s: %s", fallback.op, where, fallback.reason)


def make_backend(
    config: AsicConfig | str | None = None,
    quantize: str = "dynamic",
    matmul: str | None = None,
    host: str = "aten",
) -> AsicBackend:
    """A ``torch.compile`` backend running linears and matmuls on the simulated ASIC.

    ``config``: an :class:`AsicConfig`, a preset name or a TOML path (``None``:
    ``$ASIC_BACKEND_CONFIG``, else the default preset, read at each compile). ``quantize``:
    ``"dynamic"`` runs float linears as dynamic int8 on the DUT, ``"none"`` leaves them on the
    host (already-quantized TorchAO/PT2E layers go to the DUT either way). ``matmul``: the same
    for activation x activation matmuls (default: as ``quantize``). ``host``: ``"aten"`` runs the
    host part's aten graph as is, ``"inductor"`` compiles it. Unknown values raise ValueError.

    >>> be = make_backend(config="tpu_v1", quantize="dynamic")
    >>> y = torch.compile(model, backend=be, fullgraph=True)(x)
    >>> be.device.snapshot().dut_ops
    """
    return AsicBackend(config=config, quantize=quantize, matmul=matmul, host=host)


def asic_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: Mapping[str, Any] | None = None,
    mode: str | None = None,
) -> CompiledFn:
    """The ``asic`` entry point: ``torch.compile(model, backend="asic", options={...})``.

    ``options`` are :func:`make_backend`'s arguments (``config``, ``quantize``, ``matmul``,
    ``host``); without a ``config`` the device comes from ``$ASIC_BACKEND_CONFIG``.
    """
    if mode not in (None, "default"):
        raise ValueError(
            f"asic backend: mode={mode!r} is not supported; pass options={{...}} instead "
            f"(keys: {', '.join(OPTION_KEYS)})"
        )
    opts = dict(options or {})
    unknown = sorted(set(opts) - set(OPTION_KEYS))
    if unknown:
        raise ValueError(
            f"asic backend: unknown option(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(OPTION_KEYS)}"
        )
    return make_backend(**opts)(gm, example_inputs)
