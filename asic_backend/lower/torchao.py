"""TorchAO converted int8 layers → ``asic::dyn_qlinear``.

On the Dynamo graph a TorchAO layer is still one ``linear`` whose weight is the tensor subclass
(its aten form depends on the host ISA). ``Int8Tensor`` (``Int8DynamicActivationInt8WeightConfig``,
QAT converted) and ``IntxUnpackedToInt8Tensor`` with 8-bit symmetric per-channel weights
(``Int8DynamicActivationIntxWeightConfig``) go to the DUT, their activations quantized on the
host exactly as TorchAO does. Weight-only, groupwise, asymmetric-weight and static-activation
layers stay on the host, each counted with its reason.

>>> if not is_plain(example_value(w)):      # a tensor-subclass weight
...     lower_torchao(rw, linear_node, x, w, bias, example_value(w))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from asic_backend.lower.fx_nodes import dtype_of, real_tensor
from asic_backend.lower.rewrite import Rewrite
from asic_backend.ops import linear as quant_ops
from asic_backend.sim import numerics
from asic_backend.sim.numerics import INT8_MAX, INT8_MIN

__all__ = ["INT_MM_TARGETS", "lower_int_mm", "lower_torchao"]

#: ``torch._int_mm``, as a model calls it and as an exported program's graph holds it.
INT_MM_TARGETS: frozenset[Any] = frozenset({torch._int_mm, torch.ops.aten._int_mm.default})


def lower_int_mm(rw: Rewrite, node: fx.Node) -> None:
    """An int8 x int8 -> int32 ``_int_mm`` (a TorchAO layer in an exported program) is a DUT
    GEMM as it stands: already quantized, it goes to the DUT whatever the quantize policy."""
    a, b = node.args[0] if node.args else None, node.args[1] if len(node.args) > 1 else None
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return
    if dtype_of(a) not in (torch.int8, torch.uint8) or dtype_of(b) != torch.int8:
        rw.host(node, f"_int_mm of {dtype_of(a)} x {dtype_of(b)}: the DUT multiplies int8 only")
        return
    out = rw.call_before(node, torch.ops.asic.int_mm.default, (a, b, rw.options.device))
    rw.replace(node, out, "_int_mm -> asic::int_mm")


def lower_torchao(rw: Rewrite, node: fx.Node, x: fx.Node, w: fx.Node, b: Any, wv: Any) -> None:
    """Replace the linear ``node`` whose weight ``w`` has the fake value ``wv`` (a subclass)."""
    plan = _plan(wv, dtype_of(x))
    if isinstance(plan, dict) and type(wv).__name__ == "IntxUnpackedToInt8Tensor":
        # The fake value holds no data: only the real weight shows whether its zero point is 0.
        # (Int8Tensor's is ignored, as TorchAO's own int8 path does.)
        zp = getattr(real_tensor(rw.gm, w), "zero_point", None)
        if zp is None or not numerics.is_symmetric_weight_zp(zp):
            plan = (
                numerics.ASYMMETRIC_WEIGHTS
                if zp is not None
                else "weights whose zero point cannot be checked at compile time: "
                "the DUT takes symmetric int8 weights"
            ) + " (weight_mapping_type=SYMMETRIC)"
    if isinstance(plan, str):
        rw.host(node, plan)
        return
    g = rw.graph
    with g.inserting_before(node):
        parts = {}
        for name in ("qdata", "scale") + (("act_pre_scale",) if plan["pre_scale"] else ()):
            parts[name] = g.call_function(getattr, (w, name))
            parts[name].meta["example_value"] = getattr(wv, name)
        new = g.call_function(
            torch.ops.asic.dyn_qlinear.default,
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
                rw.options.device,
            ),
        )
    rw.replace(node, new, f"{type(wv).__name__} linear -> asic::dyn_qlinear")


def _plan(wv: Any, x_dtype: torch.dtype | None) -> dict[str, Any] | str:
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
