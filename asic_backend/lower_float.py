"""Float linears and matmuls → dynamic int8 on the DUT (``asic::dyn_linear`` / ``dyn_matmul``).

* ``linear``, and ``addmm``/``mm``/``matmul`` by a 2-D operand (e.g. GPT-2's ``Conv1D``), are
  linears: ``asic::dyn_linear``, weights quantized per channel (and cached), unless
  ``quantize="none"``. A transposed view of a weight (``W.t()``, ``W.T``, ``W.permute(1, 0)``…)
  is passed as the parameter itself, flagged, so the cache keys on the parameter.
* activation x activation ``matmul``/``bmm``: ``asic::dyn_matmul``, unless ``matmul="none"``.
* a 1-D operand runs as the 2-D GEMM between an ``unsqueeze`` and a ``squeeze``.
* K == 1 (an outer product) is not a GEMM and stays on the host, uncounted; an unsupported
  dtype, or an ``addmm`` with ``alpha``/``beta``, stays on the host, counted.

>>> lower_float_linear(rw, linear_node, x, w, bias)    # a float nn.Linear
>>> lower_matmul(rw, matmul_node, "matmul")            # kind: matmul / mm / bmm / addmm
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from asic_backend import quant_ops
from asic_backend.fx_nodes import (
    dtype_of,
    get_arg,
    int_dims,
    is_graph_input,
    is_outer_product,
    is_scaled,
    ndim_of,
)
from asic_backend.rewrite import Rewrite

__all__ = ["lower_float_linear", "lower_matmul"]

_ops = torch.ops.asic
_aten = torch.ops.aten


def lower_float_linear(rw: Rewrite, node: fx.Node, x: fx.Node, w: fx.Node, b: Any) -> None:
    """Replace a float ``linear(x, w, b)`` by ``asic::dyn_linear`` (or count it on the host)."""
    if rw.options.quantize == "none":
        return
    reason = _dtype_unsupported(x, w)
    if reason is None and ndim_of(w) != 2:
        reason = f"a {ndim_of(w)}-D weight: the DUT takes 2-D [out_features, in_features] weights"
    if reason is not None:
        rw.host(node, x, reason)
        return
    base, transposed = _strip_transpose(w)
    _emit_dyn_linear(rw, node, x, base, b, transposed, "linear")


def lower_matmul(rw: Rewrite, node: fx.Node, kind: str) -> None:
    """Replace a ``matmul``/``mm``/``bmm``/``addmm`` (``kind``) by the DUT op that fits it."""
    if node.kwargs.get("out") is not None:
        return
    if kind == "addmm":
        bias, a, b = get_arg(node, 0, "input"), get_arg(node, 1, "mat1"), get_arg(node, 2, "mat2")
        if is_scaled(node, 3):
            if rw.options.quantize == "dynamic":
                rw.host(node, a, "addmm with alpha/beta != 1 is not lowered to the DUT")
            return
    else:
        bias, a, b = (
            None,
            get_arg(node, 0, "input"),
            get_arg(node, 1, "other" if kind == "matmul" else "mat2"),
        )
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return
    a_nd, b_nd = ndim_of(a), ndim_of(b)
    if a_nd is None or b_nd is None:
        return
    linear_like = b_nd == 2 and a_nd >= 1
    policy = rw.options.quantize if linear_like else rw.options.matmul
    if policy == "none" or is_outer_product(b):
        return
    reason = _dtype_unsupported(a, b)
    if reason is not None:
        rw.host(node, a, reason)
        return
    if linear_like:
        if a_nd == 1:
            return _lower_vector_matmul(rw, node, a, b)
        base, transposed = _strip_transpose(b)
        # ``a @ B`` with B [K, N] is linear(a, Bᵀ): pass B as is, flagged as transposed.
        _emit_dyn_linear(rw, node, a, base, bias, not transposed, kind)
        return
    if a_nd == 1 or b_nd == 1:
        return _lower_vector_matmul(rw, node, a, b)
    new = rw.call_before(node, _ops.dyn_matmul.default, (a, b, rw.options.device))
    rw.replace(node, new, f"{kind} -> asic::dyn_matmul")


def _dtype_unsupported(a: fx.Node, b: fx.Node) -> str | None:
    """Why ``a`` x ``b`` cannot be quantized dynamically for the DUT (None: it can)."""
    ad, bd = dtype_of(a), dtype_of(b)
    if ad in quant_ops.FLOAT_DTYPES and bd == ad:
        return None
    got = f"{ad}" if ad == bd else f"{ad} x {bd}"
    return (
        f"{got} operands: the DUT path quantizes float32/bfloat16/float16 only "
        "(cast to float32 to run it on the DUT)"
    )


def _emit_dyn_linear(
    rw: Rewrite,
    node: fx.Node,
    x: fx.Node,
    w: fx.Node,
    b: Any,
    w_transposed: bool,
    what: str,
) -> None:
    # Only a graph input is the same tensor on every call, so only its quantization is cached.
    args = (x, w, b, w_transposed, is_graph_input(w), rw.options.device)
    new = rw.call_before(node, _ops.dyn_linear.default, args)
    rw.replace(node, new, f"{what} -> asic::dyn_linear")


def _lower_vector_matmul(rw: Rewrite, node: fx.Node, a: fx.Node, b: fx.Node) -> None:
    """A matmul with a 1-D operand, as the DUT's 2-D one between an unsqueeze and a squeeze."""
    g = rw.graph
    a_vec, b_vec = ndim_of(a) == 1, ndim_of(b) == 1
    with g.inserting_before(node):
        a2 = g.call_function(torch.unsqueeze, (a, 0)) if a_vec else a
        b2 = g.call_function(torch.unsqueeze, (b, -1)) if b_vec else b
        if ndim_of(b) == 2 or b_vec:
            out = g.call_function(
                _ops.dyn_linear.default,
                (a2, b2, None, True, is_graph_input(b) and not b_vec, rw.options.device),
            )
        else:
            out = g.call_function(_ops.dyn_matmul.default, (a2, b2, rw.options.device))
        if b_vec:
            out = g.call_function(torch.squeeze, (out, -1))
        if a_vec:
            out = g.call_function(torch.squeeze, (out, -2 if not b_vec else -1))
    rw.replace(node, out, "matrix-vector matmul -> asic::dyn_linear")


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


def _strip_transpose(w: fx.Node) -> tuple[fx.Node, bool]:
    """``(base, swapped)`` when ``w`` is a 2-D transpose or permutation of ``base`` (``W.t()``,
    ``W.T``, ``W.permute(1, 0)``, …), so a weight parameter is quantized (and cached) as itself
    rather than as a fresh view; ``(w, False)`` otherwise."""
    src = w.args[0] if w.args else None
    if ndim_of(w) != 2 or not isinstance(src, fx.Node) or ndim_of(src) != 2:
        return w, False
    if w.op == "call_function" and w.target is getattr:
        return (src, True) if w.args[1] in ("T", "mT") else (w, False)
    name = str(w.target) if w.op == "call_method" else getattr(w.target, "__name__", "")
    if not (
        (w.op == "call_function" and w.target in _TRANSPOSE_FUNCTIONS)
        or (w.op == "call_method" and name in ("t", "transpose", "permute"))
    ):
        return w, False
    dims = int_dims(w.args[1:])
    if dims == []:  # t()
        return src, True
    if dims is None or len(dims) != 2:
        return w, False
    first, second = (d % 2 for d in dims)
    # transpose(d0, d1) swaps when the dims differ; permute(dims) when they are (1, 0).
    return src, (first != second) if "transpose" in name else (first, second) == (1, 0)
