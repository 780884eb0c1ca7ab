"""Refusing a model prepared for quantization (TorchAO QAT or PT2E) but never converted.

Such a model still runs fake-quantizers or observers: in float, so it would compile and run
"fine" on the host, and nothing would ever reach the DUT. The backend stops with one line that
names the layer and the convert step instead.

>>> reject_unconverted(gm)    # gm: the Dynamo graph of a model fresh from prepare_pt2e(...)
NotConvertedError: asic backend: the model was prepared for quantization but not converted
(... at fc1); ... run model = convert_pt2e(model) before compiling it ...
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from torch import fx

from asic_backend.lower.fx_nodes import module_path, where

__all__ = ["CONVERT_HINT", "NotConvertedError", "reject_unconverted"]

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


def reject_unconverted(gm: fx.GraphModule) -> None:
    """Raise :class:`NotConvertedError` if ``gm`` comes from a prepared, unconverted model."""
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        found = _unconverted(node)
        if found is not None:
            flow, what, at = found
            raise NotConvertedError(
                f"asic backend: the model was prepared for quantization but not converted "
                f"({what} at {at or '<root>'}); the DUT runs converted int8 models: run "
                f"{CONVERT_HINT[flow]} before compiling it in inference (train with grad enabled)"
            )


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
            yield module_path(path), cls


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
            return "pt2e", f"{name} (fake quantization)", where(node)
    # A prepared PT2E module calls its observers as submodules of a GraphModule, which Dynamo
    # inlines without a module stack: their source file gives them away.
    observer = _OBSERVER_FILE.search(node.meta.get("stack_trace") or "")
    if observer is not None:
        return "pt2e", f"an observer ({observer[0]})", where(node)
    return None
