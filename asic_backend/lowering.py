"""FX passes that move every quantized (and, by default, every float) linear and matmul of a
Dynamo graph onto the DUT, as ``asic::`` ops (:mod:`asic_backend.quant_ops`).

They run on the Dynamo graph, before AOTAutograd: there a TorchAO layer is still one ``linear``
whose weight is the tensor subclass (its aten form depends on the host ISA), and a PT2E layer is
still ``dequantize_per_tensor → linear(·, dequantize_per_channel(W))``, the shape inductor's x86
pass (``torch/_inductor/fx_passes/quantization.py``) matches later. In order:

1. a model prepared for QAT (or PT2E) but not converted is refused (:class:`NotConvertedError`);
2. PT2E layers → ``asic::qlinear``, fusing a following ``relu`` and ``quantize_per_tensor``;
3. TorchAO ``Int8Tensor`` / ``IntxUnpackedToInt8Tensor`` linears → ``asic::dyn_qlinear``;
4. float linears and linear-like matmuls (``addmm``/``mm``/``matmul`` by a 2-D operand, e.g.
   GPT-2's ``Conv1D``) → ``asic::dyn_linear`` unless ``quantize="none"``;
5. activation x activation ``matmul``/``bmm`` → ``asic::dyn_matmul`` unless ``matmul="none"``;
6. calls Dynamo keeps opaque (``F.multi_head_attention_forward``) are tagged, and
   :func:`lower_aten` lowers the GEMMs AOTAutograd traces out of them on the aten graph.

Anything the DUT cannot take (dtype, grouping, a fused C++ fast path, …) stays on the host behind
an ``asic::host_fallback`` marker, which counts it on every run, with the user's ``file:line``.

>>> summary = lower(gm, LoweringOptions(device="default"))   # gm: a Dynamo GraphModule
>>> summary.dut, summary.host                                  # what went where, and why
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch import fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from asic_backend import quant_ops
from asic_backend.device import HostFallback
from asic_backend.numerics import INT8_MAX, INT8_MIN

__all__ = [
    "POLICIES",
    "REGION_KEY",
    "LoweringOptions",
    "LoweringSummary",
    "NotConvertedError",
    "Policy",
    "lower",
    "lower_aten",
    "reject_unconverted",
]

Policy = Literal["dynamic", "none"]
POLICIES: tuple[str, ...] = ("dynamic", "none")

_ops = torch.ops.asic
_aten = torch.ops.aten

#: The convert step to name in errors about prepared-but-not-converted models.
CONVERT_HINT = {
    "torchao": 'quantize_(model, QATConfig(step="convert")) (then your int8 config, e.g. '
    "quantize_(model, Int8DynamicActivationInt8WeightConfig()))",
    "pt2e": "model = convert_pt2e(model)",
}


class NotConvertedError(RuntimeError):
    """The model still holds fake-quantizers or observers: it must be converted first.

    A plain ``RuntimeError`` on purpose: Dynamo re-raises it as ``BackendCompilerFailed`` instead
    of silently running the frame eagerly (which it does for fake-tensor errors).
    """


@dataclasses.dataclass(frozen=True)
class LoweringOptions:
    """What to move onto the DUT ``device`` (a device key)."""

    device: str
    quantize: Policy = "dynamic"
    matmul: Policy = "dynamic"


@dataclasses.dataclass
class LoweringSummary:
    """What the passes did: the sites sent to the DUT and those left on the host (with why)."""

    dut: list[str] = dataclasses.field(default_factory=list)
    host: list[HostFallback] = dataclasses.field(default_factory=list)
    #: Opaque calls tagged for :func:`lower_aten` (their GEMMs appear only in the aten graph).
    regions: int = 0


def lower(gm: fx.GraphModule, options: LoweringOptions) -> LoweringSummary:
    """Rewrite ``gm`` (a Dynamo graph) in place; see the module docstring for the passes."""
    reject_unconverted(gm)
    ctx = _Ctx(gm, options)
    for node in list(gm.graph.nodes):
        if node in ctx.erased:  # fused into an earlier node
            continue
        kind = _kind(node)
        if kind == "linear":
            _lower_linear(ctx, node)
        elif kind == "region":
            _tag_region(ctx, node)
        elif kind == "fused":
            _fused_fastpath(ctx, node)
        elif kind is not None:
            _lower_matmul(ctx, node, kind)
    gm.graph.lint()
    gm.recompile()
    return ctx.summary


# -- graph helpers ------------------------------------------------------------------------------


class _Ctx:
    def __init__(self, gm: fx.GraphModule, options: LoweringOptions) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.options = options
        self.summary = LoweringSummary()
        self.erased: set[fx.Node] = set()

    def erase(self, node: fx.Node) -> None:
        self.graph.erase_node(node)
        self.erased.add(node)

    def replace(self, old: fx.Node, new: fx.Node, what: str) -> None:
        for key, value in old.meta.items():
            new.meta.setdefault(key, value)
        old.replace_all_uses_with(new)
        self.erase(old)
        self.summary.dut.append(f"{what} at {_where(old)}")

    def host(self, node: fx.Node, x: fx.Node, reason: str) -> None:
        """Leave ``node`` on the host, counted at run time through a marker on its input ``x``."""
        file, line, source = _user_frame(node)
        site = HostFallback(op=_op_name(node), reason=reason, file=file, line=line, source=source)
        with self.graph.inserting_before(node):
            marked = self.graph.call_function(
                _ops.host_fallback.default,
                (x, self.options.device, site.op, site.reason, file, line, source),
            )
        marked.meta.update(x.meta)
        node.replace_input_with(x, marked)
        self.summary.host.append(site)


def _val(node: Any) -> Any:
    if not isinstance(node, fx.Node):
        return None
    return node.meta.get("example_value", node.meta.get("val"))


def _dtype(node: Any) -> torch.dtype | None:
    v = _val(node)
    return v.dtype if isinstance(v, torch.Tensor) else None


def _ndim(node: Any) -> int | None:
    v = _val(node)
    return v.dim() if isinstance(v, torch.Tensor) else None


def _is_plain(v: Any) -> bool:
    return isinstance(v, FakeTensor) or (
        isinstance(v, torch.Tensor) and not is_traceable_wrapper_subclass(v)
    )


def _is_graph_input(node: fx.Node) -> bool:
    """A tensor the frame receives (parameter, buffer, argument): the same object on every call."""
    return node.op in ("placeholder", "get_attr")


def _real_tensor(gm: fx.GraphModule, node: Any) -> torch.Tensor | None:
    """The real value behind a graph input, when the graph knows it (parameters, buffers)."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "get_attr":
        value = getattr(gm, str(node.target), None)
        return value if isinstance(value, torch.Tensor) else None
    grapharg = node.meta.get("grapharg")
    example = getattr(grapharg, "example", None) if node.op == "placeholder" else None
    return example if isinstance(example, torch.Tensor) else None


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _op_name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return getattr(target, "__name__", str(target)).strip("_")


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in [^\n]*\n(?P<src>[^\n]*)')


def _user_frame(node: fx.Node) -> tuple[str | None, int | None, str | None]:
    """The innermost user frame of ``node`` (Dynamo keeps user frames only), if recorded."""
    frames = list(_FRAME.finditer(node.meta.get("stack_trace") or ""))
    if not frames:
        return None, None, None
    last = frames[-1]
    return last["file"], int(last["line"]), last["src"].strip() or None


def _where(node: fx.Node) -> str:
    file, line, _ = _user_frame(node)
    stack = node.meta.get("nn_module_stack") or {}
    module = ""
    if stack:
        path, _cls = list(stack.values())[-1]
        module = re.sub(r"^L\['[^']*'\]\.?", "", str(path)) or "<root>"
    if file is not None:
        return f"{file}:{line}" + (f" ({module})" if module else "")
    return module or node.name


# -- 1. prepared but not converted -------------------------------------------------------------

_FAKE_QUANT_OPS = frozenset(
    {
        "fake_quantize_per_tensor_affine",
        "fake_quantize_per_channel_affine",
        "fused_moving_avg_obs_fake_quant",
        "_fake_quantize_learnable_per_tensor_affine",
        "_fake_quantize_learnable_per_channel_affine",
    }
)


_OBSERVER_FILE = re.compile(r"quantization/(?:pt2e/)?(?:observer|fake_quantize)\.py")


def _module_classes(node: fx.Node) -> Iterable[tuple[str, type]]:
    for path, cls in (node.meta.get("nn_module_stack") or {}).values():
        if isinstance(cls, type):
            yield re.sub(r"^L\['[^']*'\]\.?", "", str(path)), cls


def _unconverted(node: fx.Node) -> tuple[str, str, str] | None:
    """(flow, what, where) when ``node`` belongs to a fake-quantizer or an observer."""
    for path, cls in _module_classes(node):
        name, module = cls.__name__, cls.__module__
        if module.startswith("torchao.quantization.qat") or name.startswith("FakeQuantized"):
            return "torchao", f"{name} (QAT fake quantization)", path
        if module.startswith(("torchao.quantization.pt2e", "torch.ao.quantization")) and (
            name.endswith(("Observer", "FakeQuantize"))
        ):
            return "pt2e", f"{name} (a PT2E observer)", path
    if node.op == "call_function":
        name = str(getattr(node.target, "__name__", "")).split(".")[0]
        if name in _FAKE_QUANT_OPS:
            return "pt2e", f"{name} (fake quantization)", _where(node)
    # A prepared PT2E module calls its observers as submodules of a GraphModule, which Dynamo
    # inlines without a module stack: their source file gives them away.
    observer = _OBSERVER_FILE.search(node.meta.get("stack_trace") or "")
    if observer is not None:
        return "pt2e", f"an observer ({observer[0]})", _where(node)
    return None


def reject_unconverted(gm: fx.GraphModule) -> None:
    """Raise :class:`NotConvertedError` if ``gm`` comes from a prepared, unconverted model."""
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        found = _unconverted(node)
        if found is not None:
            flow, what, where = found
            raise NotConvertedError(
                f"asic backend: the model was prepared for quantization but not converted "
                f"({what} at {where or '<root>'}); the DUT runs converted int8 models: run "
                f"{CONVERT_HINT[flow]} before compiling it in inference (train with grad enabled)"
            )


# -- classification -----------------------------------------------------------------------------

_LINEAR: frozenset[Any] = frozenset({torch._C._nn.linear, _aten.linear.default})
_BY_TARGET: dict[Any, str] = {
    torch.matmul: "matmul",
    operator.matmul: "matmul",
    _aten.matmul.default: "matmul",
    torch.mm: "mm",
    _aten.mm.default: "mm",
    torch.bmm: "bmm",
    _aten.bmm.default: "bmm",
    torch.addmm: "addmm",
    _aten.addmm.default: "addmm",
}
_BY_METHOD = {
    "matmul": "matmul",
    "__matmul__": "matmul",
    "mm": "mm",
    "bmm": "bmm",
    "addmm": "addmm",
}


#: Torch functions Dynamo keeps as one opaque call although their bodies hold linears and batched
#: matmuls. AOTAutograd traces those bodies, so their GEMMs are lowered on the aten graph.
_REGIONS: frozenset[Any] = frozenset({torch.nn.functional.multi_head_attention_forward})
#: Fused C++ inference fast paths, and how many linears each runs where the DUT cannot see them.
_FUSED: dict[Any, int] = {
    torch._transformer_encoder_layer_fwd: 4,
    torch._native_multi_head_attention: 2,
}


def _kind(node: fx.Node) -> str | None:
    if node.op == "call_function":
        if node.target in _LINEAR:
            return "linear"
        if node.target in _REGIONS:
            return "region"
        if node.target in _FUSED:
            return "fused"
        return _BY_TARGET.get(node.target)
    if node.op == "call_method":
        return _BY_METHOD.get(str(node.target))
    return None


# -- 2./3./4. linear ----------------------------------------------------------------------------


def _lower_linear(ctx: _Ctx, node: fx.Node) -> None:
    x, w, b = _arg(node, 0, "input"), _arg(node, 1, "weight"), _arg(node, 2, "bias")
    if not (isinstance(x, fx.Node) and isinstance(w, fx.Node)):
        return
    if _pt2e_dq(x) is not None and _pt2e_dq(w) is not None:
        _lower_pt2e(ctx, node, x, w, b)
        return
    wv = _val(w)
    if wv is not None and not _is_plain(wv):
        _lower_torchao(ctx, node, x, w, b, wv)
        return
    if ctx.options.quantize == "none":
        return
    reason = _float_unsupported(x, w)
    if reason is not None:
        ctx.host(node, x, reason)
        return
    base, transposed = _strip_transpose(w)
    _emit_dyn_linear(ctx, node, x, base, b, transposed, "linear")


def _float_unsupported(x: fx.Node, w: fx.Node) -> str | None:
    """Why a float linear cannot run as dynamic int8 on the DUT (None: it can)."""
    reason = _dtype_unsupported(x, w)
    if reason is None and _ndim(w) != 2:
        return f"a {_ndim(w)}-D weight: the DUT takes 2-D [out_features, in_features] weights"
    return reason


def _dtype_unsupported(a: fx.Node, b: fx.Node) -> str | None:
    ad, bd = _dtype(a), _dtype(b)
    if ad in quant_ops.FLOAT_DTYPES and bd == ad:
        return None
    got = f"{ad}" if ad == bd else f"{ad} x {bd}"
    return (
        f"{got} operands: the DUT path quantizes float32/bfloat16/float16 only "
        "(cast to float32 to run it on the DUT)"
    )


_TRANSPOSE_FUNCTIONS: frozenset[Any] = frozenset(
    {
        torch.t,
        torch.transpose,
        torch.permute,
        _aten.t.default,
        _aten.transpose.int,
        _aten.permute.default,
    }
)


def _int_dims(args: Iterable[Any]) -> list[int] | None:
    """``permute(1, 0)`` / ``permute((1, 0))`` / ``transpose(0, 1)`` dims as ints (else None)."""
    dims: list[int] = []
    for arg in args:
        for d in arg if isinstance(arg, list | tuple) else [arg]:
            if not isinstance(d, int):
                return None
            dims.append(d)
    return dims


def _strip_transpose(w: fx.Node) -> tuple[fx.Node, bool]:
    """``(base, swapped)`` when ``w`` is a 2-D transpose or permutation of ``base`` (``W.t()``,
    ``W.T``, ``W.permute(1, 0)``, …), so a weight parameter is quantized (and cached) as itself
    rather than as a fresh view; ``(w, False)`` otherwise."""
    src = w.args[0] if w.args else None
    if _ndim(w) != 2 or not isinstance(src, fx.Node) or _ndim(src) != 2:
        return w, False
    if w.op == "call_function" and w.target is getattr:
        return (src, True) if w.args[1] in ("T", "mT") else (w, False)
    name = str(w.target) if w.op == "call_method" else getattr(w.target, "__name__", "")
    if not (
        (w.op == "call_function" and w.target in _TRANSPOSE_FUNCTIONS)
        or (w.op == "call_method" and name in ("t", "transpose", "permute"))
    ):
        return w, False
    dims = _int_dims(w.args[1:])
    if dims == []:  # t()
        return src, True
    if dims is None or len(dims) != 2:
        return w, False
    first, second = (d % 2 for d in dims)
    # transpose(d0, d1) swaps when the dims differ; permute(dims) when they are (1, 0).
    return src, (first != second) if "transpose" in name else (first, second) == (1, 0)


def _emit_dyn_linear(
    ctx: _Ctx,
    node: fx.Node,
    x: fx.Node,
    w: fx.Node,
    b: Any,
    w_transposed: bool,
    what: str,
) -> None:
    with ctx.graph.inserting_before(node):
        new = ctx.graph.call_function(
            _ops.dyn_linear.default,
            (x, w, b, w_transposed, _is_graph_input(w), ctx.options.device),
        )
    ctx.replace(node, new, f"{what} -> asic::dyn_linear")


# -- TorchAO converted weights ------------------------------------------------------------------


def _torchao_plan(wv: Any, x_dtype: torch.dtype | None) -> dict[str, Any] | str:
    """The ``asic::dyn_qlinear`` constants for a TorchAO weight, or why the DUT cannot take it."""
    cls = type(wv).__name__
    if not type(wv).__module__.startswith("torchao"):
        return f"the weight is a {cls} tensor subclass; the DUT takes int8 per-channel weights"
    if x_dtype not in quant_ops.FLOAT_DTYPES:
        return f"{x_dtype} activations: TorchAO's int8 path quantizes float32/bfloat16/float16"
    if wv.dim() != 2:
        return f"a {wv.dim()}-D {cls} weight: the DUT takes 2-D weights"
    k = wv.shape[-1]
    group = list(getattr(wv, "block_size", [1, k]))[-1]
    if group != k and not (cls == "Int8Tensor" and list(wv.block_size) == list(wv.shape)):
        return (
            f"groupwise {cls} weights (group size {group}): the DUT accumulates whole rows; "
            "use per-channel weights (PerAxis(0) / PerRow())"
        )
    if cls == "Int8Tensor":
        kwargs = wv.act_quant_kwargs
        if kwargs is None:
            return (
                "weight-only int8 (no activation quantization): the DUT multiplies int8 by int8; "
                "use Int8DynamicActivationInt8WeightConfig"
            )
        if wv.act_quant_scale is not None:
            return "static activation scales (act_quant_scale) are not supported on the DUT yet"
        granularity = type(kwargs.granularity).__name__
        mapping = kwargs.mapping_type.name
        if granularity not in ("PerRow", "PerToken", "PerTensor") or mapping not in (
            "SYMMETRIC",
            "ASYMMETRIC",
        ):
            return f"activation quantization {granularity}/{mapping} is not supported on the DUT"
        qmin, qmax = (INT8_MIN // 2, INT8_MAX // 2) if kwargs.reduce_range else (INT8_MIN, INT8_MAX)
        return {
            "symmetric": mapping == "SYMMETRIC",
            "per_token": granularity != "PerTensor",
            "qmin": qmin,
            "qmax": qmax,
            "eps": quant_ops.F32_EPS,
            "scale_f32": True,
            "pre_scale": wv.act_pre_scale is not None,
        }
    if cls == "IntxUnpackedToInt8Tensor":
        act = wv.activation_quantization
        if act is None:
            return (
                "weight-only intx (no activation quantization): the DUT multiplies int8 by int8; "
                "use Int8DynamicActivationIntxWeightConfig"
            )
        if getattr(act, "value", act) != "int8_asym_per_token":
            return f"activation quantization {act} is not supported on the DUT"
        assert x_dtype is not None
        return {
            "symmetric": False,
            "per_token": True,
            "qmin": INT8_MIN,
            "qmax": INT8_MAX,
            # IntxUnpackedToInt8Tensor leaves eps and the scale dtype to the activation's dtype.
            "eps": float(torch.finfo(x_dtype).smallest_normal),
            "scale_f32": False,
            "pre_scale": False,
        }
    return f"the weight is a {cls}; the DUT takes Int8Tensor / IntxUnpackedToInt8Tensor weights"


def _lower_torchao(ctx: _Ctx, node: fx.Node, x: fx.Node, w: fx.Node, b: Any, wv: Any) -> None:
    plan = _torchao_plan(wv, _dtype(x))
    if isinstance(plan, dict) and type(wv).__name__ == "IntxUnpackedToInt8Tensor":
        real = _real_tensor(ctx.gm, w)
        zp = getattr(real, "zero_point", None)
        if zp is None or bool(torch.as_tensor(zp).ne(0).any()):
            plan = (
                "asymmetric weights (a non-zero weight zero point)"
                if zp is not None
                else "weights whose zero point cannot be checked at compile time"
            ) + ": the DUT takes symmetric int8 weights (weight_mapping_type=SYMMETRIC)"
    if isinstance(plan, str):
        ctx.host(node, x, plan)
        return
    g = ctx.graph
    with g.inserting_before(node):
        parts = {}
        for name in ("qdata", "scale") + (("act_pre_scale",) if plan["pre_scale"] else ()):
            parts[name] = g.call_function(getattr, (w, name))
            parts[name].meta["example_value"] = getattr(wv, name)
        new = g.call_function(
            _ops.dyn_qlinear.default,
            (
                x,
                parts["qdata"],
                parts["scale"],
                b,
                parts.get("act_pre_scale"),
                plan["symmetric"],
                plan["per_token"],
                plan["qmin"],
                plan["qmax"],
                plan["eps"],
                plan["scale_f32"],
                ctx.options.device,
            ),
        )
    ctx.replace(node, new, f"{type(wv).__name__} linear -> asic::dyn_qlinear")


# -- PT2E (quantized_decomposed) ----------------------------------------------------------------

_QD = "quantized_decomposed::"


def _qd_name(node: Any) -> str | None:
    if isinstance(node, fx.Node) and node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and target.namespace == "quantized_decomposed":
            return f"{target._opname}.{target._overloadname}"
    return None


def _pt2e_dq(node: fx.Node) -> str | None:
    name = _qd_name(node)
    return name if name is not None and name.startswith("dequantize_per_") else None


def _lower_pt2e(ctx: _Ctx, node: fx.Node, x: fx.Node, w: fx.Node, b: Any) -> None:
    reason = _pt2e_unsupported(ctx, x, w)
    if reason is not None:
        ctx.host(node, x, reason)
        return
    g = ctx.graph
    out_dtype = _dtype(node) or torch.float32
    y_scale, y_zp, y_qmin, y_qmax = 0.0, 0, 0, 0
    relu, quant = None, None
    fused = _output_quant(node)
    if fused is not None:
        relu, quant = fused
        q_args: tuple[Any, ...] = quant.args
        y_scale, y_zp, y_qmin, y_qmax = float(q_args[1]), *(int(v) for v in q_args[2:5])
        out_dtype = q_args[5]
        if relu is not None:
            y_qmin = max(y_qmin, y_zp)  # relu, then quantize == clamp at the zero point
    with g.inserting_before(node):
        qparams = [
            _as_tensor_node(g, value, dtype)
            for value, dtype in (
                (x.args[1], torch.float64),
                (x.args[2], torch.int64),
                (w.args[1], torch.float32),
                (w.args[2], torch.int64),
            )
        ]
        x_scale, x_zp, w_scale, w_zp = qparams
        new = g.call_function(
            _ops.qlinear.default,
            (
                x.args[0],
                x_scale,
                x_zp,
                w.args[0],
                w_scale,
                w_zp,
                b,
                y_scale,
                y_zp,
                y_qmin,
                y_qmax,
                out_dtype,
                ctx.options.device,
            ),
        )
    what = "PT2E linear"
    if quant is not None:
        new.meta.update(quant.meta)
        quant.replace_all_uses_with(new)
        ctx.erase(quant)
        if relu is not None:
            ctx.erase(relu)
        what += " + relu + quantize" if relu is not None else " + quantize"
    ctx.replace(node, new, f"{what} -> asic::qlinear")
    for dq in (x, w):
        if not dq.users:
            ctx.erase(dq)


def _as_tensor_node(g: fx.Graph, value: Any, dtype: torch.dtype) -> fx.Node:
    """A qparam as a graph tensor: static ones are Python numbers in PT2E graphs."""
    if isinstance(value, fx.Node):
        return value
    return g.call_function(_aten.scalar_tensor.default, (value,), {"dtype": dtype})


def _pt2e_unsupported(ctx: _Ctx, x: fx.Node, w: fx.Node) -> str | None:
    xdq, wdq = _pt2e_dq(x), _pt2e_dq(w)
    if xdq not in ("dequantize_per_tensor.default", "dequantize_per_tensor.tensor"):
        return f"activations dequantized by {xdq}: the DUT takes per-tensor activations"
    if _dtype(x.args[0]) not in (torch.int8, torch.uint8):
        return f"{_dtype(x.args[0])} activations: the DUT takes int8/uint8"
    if wdq == "dequantize_per_channel.default":
        if int(_arg(w, 3, "axis")) != 0:
            return "per-channel weights along axis 1: the DUT scales output channels (axis 0)"
    elif wdq != "dequantize_per_tensor.default":
        return f"weights dequantized by {wdq}: the DUT takes per-channel or per-tensor int8 weights"
    if _dtype(w.args[0]) != torch.int8 or _ndim(w.args[0]) != 2:
        return f"{_dtype(w.args[0])} weights: the DUT takes 2-D int8 weights"
    w_zp = w.args[2]
    zp = _real_tensor(ctx.gm, w_zp) if isinstance(w_zp, fx.Node) else torch.tensor(w_zp)
    if zp is not None and bool(zp.ne(0).any()):
        return (
            "asymmetric weights (a non-zero weight zero point): "
            "the DUT takes symmetric int8 weights"
        )
    return None


_RELU: frozenset[Any] = frozenset({_aten.relu.default, torch.relu, torch.nn.functional.relu})


def _output_quant(node: fx.Node) -> tuple[fx.Node | None, fx.Node] | None:
    """``(relu or None, quantize_per_tensor)`` that only consume ``node``'s output, if any."""
    if len(node.users) != 1:
        return None
    (user,) = node.users
    relu = None
    if (user.op == "call_function" and user.target in _RELU and not user.kwargs.get("inplace")) or (
        user.op == "call_method" and user.target == "relu"
    ):
        if len(user.users) != 1:
            return None
        relu, (user,) = user, user.users
    source = relu if relu is not None else node
    if _qd_name(user) != "quantize_per_tensor.default" or user.args[0] is not source:
        return None
    if user.args[5] not in (torch.int8, torch.uint8):
        return None
    return relu, user


# -- 4./5. matmul family ------------------------------------------------------------------------


def _lower_matmul(ctx: _Ctx, node: fx.Node, kind: str) -> None:
    if node.kwargs.get("out") is not None:
        return
    if kind == "addmm":
        bias, a, b = _arg(node, 0, "input"), _arg(node, 1, "mat1"), _arg(node, 2, "mat2")
        if _scaled(node, 3):
            if ctx.options.quantize == "dynamic":
                ctx.host(node, a, "addmm with alpha/beta != 1 is not lowered to the DUT")
            return
    else:
        bias, a, b = (
            None,
            _arg(node, 0, "input"),
            _arg(node, 1, "other" if kind == "matmul" else "mat2"),
        )
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return
    a_nd, b_nd = _ndim(a), _ndim(b)
    if a_nd is None or b_nd is None:
        return
    linear_like = b_nd == 2 and a_nd >= 1
    policy = ctx.options.quantize if linear_like else ctx.options.matmul
    if policy == "none":
        return
    k = _val(b).shape[-2 if b_nd >= 2 else 0]
    if statically_known_true(k == 1):  # no guard on a dynamic K
        return  # K == 1 is an outer product (e.g. rotary angles): no GEMM, and int8 would ruin it
    reason = _dtype_unsupported(a, b)
    if reason is not None:
        ctx.host(node, a, reason)
        return
    if linear_like:
        if a_nd == 1:
            return _lower_vector_matmul(ctx, node, a, b)
        base, transposed = _strip_transpose(b)
        # ``a @ B`` with B [K, N] is linear(a, Bᵀ): pass B as is, flagged as transposed.
        _emit_dyn_linear(ctx, node, a, base, bias, not transposed, kind)
        return
    if a_nd == 1 or b_nd == 1:
        return _lower_vector_matmul(ctx, node, a, b)
    with ctx.graph.inserting_before(node):
        new = ctx.graph.call_function(_ops.dyn_matmul.default, (a, b, ctx.options.device))
    ctx.replace(node, new, f"{kind} -> asic::dyn_matmul")


def _lower_vector_matmul(ctx: _Ctx, node: fx.Node, a: fx.Node, b: fx.Node) -> None:
    """A matmul with a 1-D operand, as the DUT's 2-D one between an unsqueeze and a squeeze."""
    g = ctx.graph
    a_vec, b_vec = _ndim(a) == 1, _ndim(b) == 1
    with g.inserting_before(node):
        a2 = g.call_function(torch.unsqueeze, (a, 0)) if a_vec else a
        b2 = g.call_function(torch.unsqueeze, (b, -1)) if b_vec else b
        if _ndim(b) == 2 or b_vec:
            out = g.call_function(
                _ops.dyn_linear.default,
                (a2, b2, None, True, _is_graph_input(b) and not b_vec, ctx.options.device),
            )
        else:
            out = g.call_function(_ops.dyn_matmul.default, (a2, b2, ctx.options.device))
        if b_vec:
            out = g.call_function(torch.squeeze, (out, -1))
        if a_vec:
            out = g.call_function(torch.squeeze, (out, -2 if not b_vec else -1))
    ctx.replace(node, out, "matrix-vector matmul -> asic::dyn_linear")


# -- opaque regions and fused fast paths -------------------------------------------------------

#: The ``node.meta["custom"]`` key that marks a region; AOTAutograd copies ``custom`` metadata
#: onto every aten node it traces out of the tagged call.
REGION_KEY = "asic_region"


def _tag_region(ctx: _Ctx, node: fx.Node) -> None:
    if ctx.options.quantize == "none" and ctx.options.matmul == "none":
        return
    node.meta["custom"] = {**(node.meta.get("custom") or {}), REGION_KEY: _op_name(node)}
    ctx.summary.regions += 1


def _fused_fastpath(ctx: _Ctx, node: fx.Node) -> None:
    x = node.args[0]
    if ctx.options.quantize == "none" or not isinstance(x, fx.Node):
        return
    ctx.host(
        node,
        x,
        f"PyTorch's fused inference fast path ({_op_name(node)}) runs its "
        f"{_FUSED[node.target]} linears on the host: call "
        "torch.backends.mha.set_fastpath_enabled(False) to run them on the DUT",
    )


# -- the aten graph of tagged regions ----------------------------------------------------------

_ATEN_TRANSPOSE: frozenset[Any] = frozenset({_aten.t.default, _aten.permute.default})


def lower_aten(gm: fx.GraphModule, options: LoweringOptions) -> LoweringSummary:
    """Lower the ``mm``/``addmm``/``bmm``/``baddbmm`` that AOTAutograd traced out of the regions
    :func:`lower` tagged (e.g. ``F.multi_head_attention_forward``), in place, on the aten graph."""
    ctx = _Ctx(gm, options)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or REGION_KEY not in (node.meta.get("custom") or {}):
            continue
        if node.target in (_aten.mm.default, _aten.addmm.default):
            _lower_aten_mm(ctx, node)
        elif node.target in (_aten.bmm.default, _aten.baddbmm.default):
            _lower_aten_bmm(ctx, node)
    gm.graph.lint()
    gm.recompile()
    return ctx.summary


def _aten_gemm_ok(a: Any, b: Any) -> bool:
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return False
    if _dtype(a) not in quant_ops.FLOAT_DTYPES or _dtype(b) != _dtype(a):
        return False
    return not bool(statically_known_true(_val(b).shape[-2] == 1))  # outer products stay


def _scaled(node: fx.Node, first: int) -> bool:
    """Whether an ``addmm``/``baddbmm`` has ``beta``/``alpha`` other than 1."""
    beta, alpha = _arg(node, first, "beta", 1), _arg(node, first + 1, "alpha", 1)
    return bool(beta != 1 or alpha != 1)


def _lower_aten_mm(ctx: _Ctx, node: fx.Node) -> None:
    if ctx.options.quantize == "none":
        return
    addmm = node.target is _aten.addmm.default
    bias, a, b = (node.args[0], node.args[1], node.args[2]) if addmm else (None, *node.args[:2])
    if (addmm and _scaled(node, 3)) or not _aten_gemm_ok(a, b):
        return
    assert isinstance(b, fx.Node)
    base, transposed = b, True  # a @ B with B [K, N] is linear(a, Bᵀ)
    if b.target in _ATEN_TRANSPOSE and _ndim(b.args[0]) == 2:
        dims = _int_dims(b.args[1:])
        if dims in ([], [1, 0], [-1, -2]):
            base, transposed = b.args[0], False  # type: ignore[assignment]
    args = (a, base, bias, transposed, _is_graph_input(base), ctx.options.device)
    _emit_aten(ctx, node, _ops.dyn_linear.default, args, "aten linear -> asic::dyn_linear")


def _lower_aten_bmm(ctx: _Ctx, node: fx.Node) -> None:
    if ctx.options.matmul == "none":
        return
    baddbmm = node.target is _aten.baddbmm.default
    a, b = node.args[1:3] if baddbmm else node.args[:2]
    if (baddbmm and _scaled(node, 3)) or not _aten_gemm_ok(a, b):
        return
    g = ctx.graph
    with g.inserting_before(node):
        out = g.call_function(_ops.dyn_matmul.default, (a, b, ctx.options.device))
        out.meta["val"] = _fake_run(out)
        if baddbmm:
            out = g.call_function(_aten.add.Tensor, (node.args[0], out))
            out.meta["val"] = _fake_run(out)
    ctx.replace(node, out, "aten bmm -> asic::dyn_matmul")


def _emit_aten(ctx: _Ctx, node: fx.Node, op: Any, args: tuple[Any, ...], what: str) -> None:
    with ctx.graph.inserting_before(node):
        new = ctx.graph.call_function(op, args)
    new.meta["val"] = _fake_run(new)
    ctx.replace(node, new, what)


def _fake_run(node: fx.Node) -> Any:
    """The fake value of a new aten node (inductor reads ``meta["val"]`` of every node)."""
    args, kwargs = torch.utils._pytree.tree_map_only(
        fx.Node, lambda n: n.meta["val"], (node.args, node.kwargs)
    )
    mode = detect_fake_mode(torch.utils._pytree.tree_leaves((args, kwargs)))
    assert mode is not None
    with mode:
        return node.target(*args, **kwargs)  # type: ignore[operator]
