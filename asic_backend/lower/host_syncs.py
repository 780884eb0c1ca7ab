"""Host syncs: the nodes of a compiled graph that make the host wait for a device value.

On an accelerator a graph runs asynchronously: the host queues work and moves on. A node whose
result the host must *see* to go on stops that: the device drains its queue, copies the value
back, and idles while the host decides what comes next. With
``torch._dynamo.config.capture_scalar_outputs`` (or ``capture_dynamic_output_shape_ops``) such
reads stay inside the graph instead of breaking it, so nothing in Dynamo's own counters shows
them. They are read here from what the graph records, not from a list of op names, so that new
ops are caught:

- a node that **binds an unbacked symbol** (``node.meta["unbacked_bindings"]``, else the
  unbacked symbols of its fake value that none of its inputs carry), unless it makes it from
  unbacked symbols the host already holds (``x[i]`` with a data-dependent ``i`` binds the
  wrapped index: its inputs carry symbols, and its aten op is not tagged as below): a
  data-dependent scalar
  (``.item()``, ``int(t)``, ``float(t)``, an integer ``t.tolist()``) or a data-dependent size
  (``nonzero``, boolean-mask indexing, ``unique``, ``masked_select``, ``repeat_interleave``
  with tensor repeats, ...);
- an op tagged ``torch.Tag.data_dependent_output`` (``aten._local_scalar_dense``), or tagged
  ``torch.Tag.dynamic_output_shape`` where the graph records no fake value to tell (the tag is
  also on ``aten.index``, which only a boolean index makes data-dependent: with a fake value,
  the symbols it binds decide);
- a **copy from a device to the host**: a node whose tensor inputs live on an accelerator and
  whose tensor output lives on the CPU (``t.cpu()``, ``t.to("cpu")``).

The forms are :data:`FORMS`; :func:`find_host_syncs` groups a graph's syncs by the user's line.
Pure analysis: nothing here edits a graph or touches data.

>>> torch._dynamo.config.capture_scalar_outputs = True
>>> def backend(gm, example_inputs):
...     print([(s.op, s.form, s.count) for s in find_host_syncs(gm)])
...     return gm.forward
>>> torch.compile(lambda h: h * h.abs().max().item(), backend=backend)(torch.randn(4))
[('Tensor.item', 'data-dependent scalar', 1)]
"""

from __future__ import annotations

import dataclasses
import functools
import linecache
import operator
import re
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from asic_backend.lower.fx_nodes import example_value, graph_modules

__all__ = ["FORMS", "HostSync", "find_host_syncs", "sync_form"]

#: Why a node is a host sync, by form: the one list of what is recognised (see the module doc).
FORMS: dict[str, str] = {
    "scalar": "data-dependent scalar",
    "shape": "data-dependent shape",
    "output": "data-dependent output",
    "copy": "device-to-host copy",
}

#: How to remove each form, for reports (``torch._check`` bounds a value; it does not remove the
#: read that produced it).
FIXES: dict[str, str] = {
    "scalar": (
        "keep the value a tensor (a 0-d tensor broadcasts: `h * h.abs().max()` instead of "
        "`h * h.abs().max().item()`); torch._check() bounds do not remove the sync"
    ),
    "shape": (
        "keep the shape static: `torch.where(mask, h, 0)` instead of `h[mask]`, "
        "`torch.nonzero_static(x, size=n)` instead of `nonzero`, or pad to a known size; "
        "torch._check() bounds do not remove the sync"
    ),
    "output": "keep the result on the device as a tensor instead of reading it on the host",
    "copy": "keep the tensor on the device; copy results to the host once, after the model ran",
}

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]*)')


@dataclasses.dataclass(frozen=True)
class HostSync:
    """The host syncs of one graph at one place of the code.

    ``op`` is the call as the user wrote it (``Tensor.item``, ``boolean mask indexing``,
    ``torch.unique``); ``form`` a value of :data:`FORMS`; ``frames`` the traced stack of the
    call, outermost first, as ``(file, line, function)``; ``count`` how many sync nodes of the
    graph come from it (one call of the graph runs each of them once).
    """

    op: str
    form: str
    frames: tuple[tuple[str, int, str], ...] = ()
    count: int = 1
    #: The aten op called (``aten.item``, ``aten.nonzero``), when known: what tells two syncs
    #: of one line apart.
    aten: str | None = None
    #: A float read (``.item()`` of a float tensor): AOTAutograd may turn it back into tensor
    #: math, and then it is no sync where the graph runs.
    float_read: bool = False

    @property
    def fix(self) -> str:
        return FIXES[next(key for key, text in FORMS.items() if text == self.form)]


def find_host_syncs(gm: fx.GraphModule) -> tuple[HostSync, ...]:
    """Every host sync of ``gm`` (its subgraphs included), one entry per op and traced stack,
    in graph order."""
    found: dict[HostSync, int] = {}
    for module in graph_modules(gm):
        for node in module.graph.nodes:
            form = sync_form(node)
            if form is None:
                continue
            op = _aten_op(node)
            key = HostSync(
                op=op_label(node),
                form=form,
                frames=_frames(node),
                aten=_aten_name(op),
                float_read=isinstance(example_value(node), torch.SymFloat),
            )
            found[key] = found.get(key, 0) + 1
    return tuple(dataclasses.replace(sync, count=count) for sync, count in found.items())


def sync_form(node: fx.Node) -> str | None:
    """The :data:`FORMS` text of ``node`` if it is a host sync, else ``None``."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return None
    if _reads_host_scalars_only(node):
        return None
    value = example_value(node)
    tags = _tags(_aten_op(node))
    if _binds_unbacked(node, value) and not _derived(node, tags):
        return FORMS["scalar" if _is_scalar(value) else "shape"]
    if tags and torch.Tag.data_dependent_output in tags:
        return FORMS["output"]
    if tags and torch.Tag.dynamic_output_shape in tags and value is None:
        # No fake value to tell whether this call's size depends on data: the tag says it may.
        return FORMS["shape"]
    if _is_device_to_host(node, value):
        return FORMS["copy"]
    return None


def _reads_host_scalars_only(node: fx.Node) -> bool:
    """Whether every tensor ``node`` reads is a Python number Dynamo passes in as a 0-d tensor
    (a float argument of a recompiled frame, read back with ``.item()``): it never left the host."""
    tensors = [a for a in node.all_input_nodes if isinstance(example_value(a), torch.Tensor)]
    return bool(tensors) and all(
        a.op == "placeholder" and getattr(a.meta.get("grapharg"), "pass_arg_as_tensor", False)
        for a in tensors
    )


def _binds_unbacked(node: fx.Node, value: Any) -> bool:
    if node.meta.get("unbacked_bindings"):
        return True
    mine = _unbacked(value)
    if not mine:
        return False
    inherited: set[Any] = set()
    for arg in node.all_input_nodes:
        inherited |= _unbacked(example_value(arg))
    return bool(mine - inherited)


def _unbacked(value: Any) -> set[Any]:
    """The unbacked symbols of a graph value; none for a value the helper cannot walk (a
    stream, a module, a hook: Dynamo puts those in graphs too)."""
    if value is None:
        return set()
    try:
        return set(free_unbacked_symbols(value))
    except Exception:  # it asserts on types it does not know
        return set()


def _derived(node: fx.Node, tags: tuple[Any, ...] | None) -> bool:
    """Whether the symbols ``node`` binds are made from unbacked symbols the host already has
    (``x[i]`` with a data-dependent ``i`` binds the wrapped index), not from tensor data: its
    inputs carry unbacked symbols and its aten op is not tagged as reading data."""
    data = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)
    if tags is None or any(tag in tags for tag in data):
        return False
    return any(_unbacked(value) for value in _input_values(node))


def _input_values(node: fx.Node) -> list[Any]:
    return [example_value(arg) for arg in node.all_input_nodes] + [
        a for a in (*node.args, *node.kwargs.values()) if isinstance(a, torch.SymInt)
    ]


def _aten_op(node: fx.Node) -> Any:
    """The aten op a node calls, by its name where it calls a torch function or method
    (``torch.nonzero`` and ``Tensor.nonzero`` are ``aten.nonzero``), else ``None``."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return target
    if target is operator.getitem:
        return torch.ops.aten.index if _has_bool_index(node) else torch.ops.aten.select
    if node.op == "call_method":
        name = str(target)
    else:
        name = _torch_names().get(id(target), "").rpartition(".")[2]
    return getattr(torch.ops.aten, name, None) if name else None


def _aten_name(op: Any) -> str | None:
    """``aten.nonzero`` for the op (any overload), else ``None``."""
    if isinstance(op, torch._ops.OpOverload):
        op = op.overloadpacket
    return str(op).replace("::", ".") if isinstance(op, torch._ops.OpOverloadPacket) else None


def _is_scalar(value: Any) -> bool:
    return isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool | int | float | bool)


def _tags(op: Any) -> tuple[Any, ...] | None:
    """The tags of an aten op (an overload packet: of any of its overloads); ``None`` when
    ``op`` is not one."""
    if isinstance(op, torch._ops.OpOverload):
        return tuple(op.tags)
    if isinstance(op, torch._ops.OpOverloadPacket):
        names: list[str] = op.overloads()  # type: ignore[no-untyped-call]
        return tuple(dict.fromkeys(t for name in names for t in getattr(op, name).tags))
    return None


#: The calls that copy a tensor's data to another device (``new_zeros(device="cpu")`` of a
#: device tensor makes a host tensor too, but reads nothing back).
_COPIES = frozenset({"cpu", "to", "numpy", "_to_copy", "copy_", "copy", "_copy_from"})


def _is_device_to_host(node: fx.Node, value: Any) -> bool:
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
        return False
    op = _aten_op(node)
    name = str(node.target) if node.op == "call_method" else getattr(op, "__name__", "")
    if name.split(".")[0] not in _COPIES:
        return False
    devices = {
        v.device.type
        for v in (example_value(arg) for arg in node.all_input_nodes)
        if isinstance(v, torch.Tensor)
    }
    return bool(devices - {"cpu", "meta"})


# --------------------------------------------------------------------------- how the user wrote it


def op_label(node: fx.Node) -> str:
    """The call as the user wrote it: ``Tensor.item``, ``torch.nonzero``, ``boolean mask
    indexing``, ``aten.nonzero``; an ``.item()`` Dynamo made from ``int(t)``, ``float(t)`` or an
    integer ``t.tolist()`` is named after what the user's line calls."""
    target = node.target
    if node.op == "call_method":
        if target == "item":
            return _item_spelling(node)
        return f"Tensor.{target}"
    if node.op == "call_module":
        return type(getattr(node.graph.owning_module, str(target), None)).__name__
    if target is operator.getitem:
        return "boolean mask indexing" if _has_bool_index(node) else "Tensor.__getitem__"
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        name = str(target._schema.name if isinstance(target, torch._ops.OpOverload) else target)
        name = name.replace("::", ".")
        return name if name.startswith("aten.") else f"torch.ops.{name}"
    return _torch_names().get(id(target)) or str(getattr(target, "__name__", target))


def _item_spelling(node: fx.Node) -> str:
    frames = _frames(node)
    source = linecache.getline(frames[-1][0], frames[-1][1]) if frames else ""
    if ".item(" in source:
        return "Tensor.item"
    for spelling, label in ((".tolist(", "Tensor.tolist"), ("int(", "int(tensor)")):
        if spelling in source:
            return label
    if "float(" in source:
        return "float(tensor)"
    return "Tensor.item"


def _has_bool_index(node: fx.Node) -> bool:
    index = node.args[1] if len(node.args) > 1 else None
    parts = index if isinstance(index, list | tuple) else [index]
    for part in parts:
        v = example_value(part)
        if isinstance(v, torch.Tensor) and v.dtype == torch.bool:
            return True
    return False


@functools.cache
def _torch_names() -> dict[int, str]:
    """``id(fn) -> "torch.nonzero"`` for the public functions of torch's main namespaces."""
    out: dict[int, str] = {}
    for prefix, namespace in (
        ("torch.nn.functional", torch.nn.functional),
        ("torch.functional", torch.functional),
        ("torch", torch),
    ):
        for name in dir(namespace):
            if name.startswith("_"):
                continue
            fn = getattr(namespace, name, None)
            if callable(fn) and not isinstance(fn, type):
                spelled = "torch" if prefix == "torch.functional" else prefix
                out[id(fn)] = f"{spelled}.{name}"
    return out


def _frames(node: fx.Node) -> tuple[tuple[str, int, str], ...]:
    trace = node.meta.get("stack_trace") or ""
    return tuple(
        (m["file"], int(m["line"]), m["func"].strip()) for m in _FRAME.finditer(str(trace))
    )
