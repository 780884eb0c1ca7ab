"""Float linears and matmuls → dynamic int8 on the DUT (``asic::dyn_linear`` / ``dyn_matmul``).

* ``linear``, and ``addmm``/``mm``/``matmul`` by a 2-D operand (e.g. GPT-2's ``Conv1D``), are
  linears: ``asic::dyn_linear``, weights quantized per channel (and cached). A transposed view
  of a weight (``W.t()``, ``W.T``, ``W.permute(1, 0)``…) is passed as the parameter itself,
  flagged, so the cache keys on the parameter.
* activation x activation ``matmul``/``bmm``/``baddbmm``: ``asic::dyn_matmul``; ``addbmm`` is one
  GEMM whose reduction runs over the batch too (``[M, B·K] x [B·K, N]``).
* ``alpha``/``beta`` of ``addmm``/``baddbmm``/``addbmm`` scale the DUT result and the added input
  on the host.
* a 1-D operand runs as the 2-D GEMM between an ``unsqueeze`` and a ``squeeze``; an outer
  product (K = 1, e.g. rotary angles) runs too, quantized exactly (see
  :func:`~asic_backend.ops.linear.quantize_sym_rows`).
* an unsupported dtype, or a policy of ``"none"``, leaves the op on the host, counted, with why.

>>> lower_float_linear(rw, linear_node, x, w, bias)    # a float nn.Linear
>>> lower_matmul(rw, matmul_node, "matmul")            # kind: matmul / mm / bmm / addmm / ...
"""

from __future__ import annotations

from numbers import Number
from typing import Any

import torch
from torch import fx

from asic_backend.lower.fx_nodes import dtype_of, get_arg, int_dims, is_graph_input, ndim_of
from asic_backend.lower.rewrite import Rewrite
from asic_backend.ops import linear as quant_ops

__all__ = ["MATMUL_KINDS", "dtype_unsupported", "lower_float_linear", "lower_matmul"]

_ops = torch.ops.asic
_aten = torch.ops.aten

#: The kinds :func:`lower_matmul` takes; ``add*`` ones add a (scaled) input to the product.
MATMUL_KINDS = ("matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm")

_LINEARS_STAY = "quantize='none': float linears stay on the host"
_MATMULS_STAY = "matmul='none': activation x activation matmuls stay on the host"


def lower_float_linear(rw: Rewrite, node: fx.Node, x: fx.Node, w: fx.Node, b: Any) -> None:
    """Replace a float ``linear(x, w, b)`` by ``asic::dyn_linear`` (or leave it, with why)."""
    if rw.options.quantize == "none":
        rw.host(node, _LINEARS_STAY)
        return
    reason = dtype_unsupported(x, w)
    if reason is None and ndim_of(w) != 2:
        reason = f"a {ndim_of(w)}-D weight: the DUT takes 2-D [out_features, in_features] weights"
    if reason is not None:
        rw.host(node, reason)
        return
    base, transposed = _strip_transpose(w)
    _emit_dyn_linear(rw, node, x, base, b, transposed, "linear")


def lower_matmul(rw: Rewrite, node: fx.Node, kind: str) -> None:
    """Replace a matmul-class call (``kind``, one of :data:`MATMUL_KINDS`) by its DUT op."""
    if node.kwargs.get("out") is not None:
        rw.host(node, f"{kind}(..., out=...): write the result out of place to run it on the DUT")
        return
    added = kind.startswith("add") or kind == "baddbmm"
    if added:
        bias, a, b = get_arg(node, 0, "input"), get_arg(node, 1, "mat1"), get_arg(node, 2, "mat2")
        if kind != "addmm":
            a, b = get_arg(node, 1, "batch1"), get_arg(node, 2, "batch2")
        beta, alpha = get_arg(node, 3, "beta", 1), get_arg(node, 4, "alpha", 1)
        if not (isinstance(beta, Number) and isinstance(alpha, Number)):
            rw.host(node, f"{kind} with alpha/beta computed at run time: pass Python numbers")
            return
    else:
        bias, beta, alpha = None, 1, 1
        a, b = get_arg(node, 0, "input"), get_arg(node, 1, "other" if kind == "matmul" else "mat2")
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return
    a_nd, b_nd = ndim_of(a), ndim_of(b)
    if a_nd is None or b_nd is None:
        return
    linear_like = b_nd == 2 and a_nd >= 1 and kind != "addbmm"
    if (rw.options.quantize if linear_like else rw.options.matmul) == "none":
        rw.host(node, _LINEARS_STAY if linear_like else _MATMULS_STAY)
        return
    reason = dtype_unsupported(a, b)
    if reason is not None:
        rw.host(node, reason)
        return
    scaled = (beta, alpha) != (1, 1)
    if kind == "addbmm":
        out = _emit_addbmm(rw, node, a, b)
    elif linear_like and a_nd == 1:
        out = _emit_vector(rw, node, a, b)
    elif linear_like:
        base, transposed = _strip_transpose(b)
        # ``a @ B`` with B [K, N] is linear(a, Bᵀ): pass B as is, flagged as transposed.
        fused_bias = None if scaled else bias
        out = _dyn_linear(rw, node, a, base, fused_bias, not transposed)
        if not scaled:
            bias = None
    elif a_nd == 1 or b_nd == 1:
        out = _emit_vector(rw, node, a, b)
    else:
        out = rw.call_before(node, _ops.dyn_matmul.default, (a, b, rw.options.device))
    if bias is not None:
        out = _add_scaled(rw, node, bias, out, beta, alpha)
    op = "asic::dyn_linear" if linear_like or kind == "addbmm" else "asic::dyn_matmul"
    rw.replace(node, out, f"{kind} -> {op}")


def dtype_unsupported(a: fx.Node, b: fx.Node) -> str | None:
    """Why ``a`` x ``b`` cannot be quantized dynamically for the DUT (None: it can)."""
    ad, bd = dtype_of(a), dtype_of(b)
    if ad in quant_ops.FLOAT_DTYPES and bd == ad:
        return None
    got = f"{ad}" if ad == bd else f"{ad} x {bd}"
    return (
        f"{got} operands: the DUT path quantizes float32/bfloat16/float16 only "
        "(cast to float32 to run it on the DUT)"
    )


def _dyn_linear(
    rw: Rewrite, node: fx.Node, x: fx.Node, w: fx.Node, b: Any, w_transposed: bool
) -> fx.Node:
    # Only a graph input is the same tensor on every call, so only its quantization is cached.
    args = (x, w, b, w_transposed, is_graph_input(w), rw.options.device)
    return rw.call_before(node, _ops.dyn_linear.default, args)


def _emit_dyn_linear(
    rw: Rewrite, node: fx.Node, x: fx.Node, w: fx.Node, b: Any, w_transposed: bool, what: str
) -> None:
    rw.replace(node, _dyn_linear(rw, node, x, w, b, w_transposed), f"{what} -> asic::dyn_linear")


def _add_scaled(
    rw: Rewrite, node: fx.Node, bias: Any, product: fx.Node, beta: Any, alpha: Any
) -> fx.Node:
    """``beta·bias + alpha·product`` (``beta = 0`` ignores ``bias``, as PyTorch does)."""
    g = rw.graph
    with g.inserting_before(node):
        if alpha != 1:
            product = g.call_function(torch.mul, (product, alpha))
        if beta == 0:
            return product
        if beta != 1:
            bias = g.call_function(torch.mul, (bias, beta))
        return g.call_function(torch.add, (bias, product))


def _emit_addbmm(rw: Rewrite, node: fx.Node, b1: fx.Node, b2: fx.Node) -> fx.Node:
    """``Σ_i b1[i] @ b2[i]`` as one GEMM reducing over the batch: ``[M, B·K] @ [B·K, N]``."""
    g = rw.graph
    with g.inserting_before(node):
        a = g.call_function(torch.flatten, (g.call_function(torch.transpose, (b1, 0, 1)), 1))
        b = g.call_function(torch.flatten, (b2, 0, 1))
        return g.call_function(_ops.dyn_matmul.default, (a, b, rw.options.device))


def _emit_vector(rw: Rewrite, node: fx.Node, a: fx.Node, b: fx.Node) -> fx.Node:
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
    return out


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
