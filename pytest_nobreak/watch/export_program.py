"""Reading an exported program and its inputs: the dimensions the user declared dynamic and
what became of them, draft_export's findings as text, where an op came from, op counts, and
whether two programs' outputs differ."""

from __future__ import annotations

import collections
import contextlib
import inspect
import io
import logging
import re
from collections.abc import Iterator, Mapping
from typing import Any

from pytest_nobreak.watch.sites import Frame

#: Outputs of two programs (or of a program and eager) that differ by less are the same.
_RTOL, _ATOL = 1e-4, 1e-5
#: Ops that compute nothing (see :func:`_op_counts`).
_NOT_COMPUTE = (
    "aten._assert",
    "aten.sym_",
    "aten.contiguous",
    "aten.clone",
    "aten.alias",
    "aten.lift_fresh",
    "aten._to_copy",
    "aten.to.",
    "aten.reshape",
    "aten.flatten",
    "aten.unflatten",
    "aten.view_as",
)
FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def _bad_spec(torch: Any, exc: BaseException) -> bool:
    """A ``dynamic_shapes`` that does not fit the inputs: the user's call is wrong, not the
    model, so it is raised, not reported."""
    user_error = getattr(torch._dynamo.exc, "UserError", None)
    kind = getattr(getattr(exc, "error_type", None), "name", "")
    return user_error is not None and isinstance(exc, user_error) and kind == "INVALID_INPUT"


def _intern_table(torch: Any) -> dict[str, int]:
    # draft_export's stacks name files by their index in the structured log's intern table.
    structured = getattr(torch._logging, "structured", None)
    return dict(getattr(structured, "INTERN_TABLE", {}))


def combine_args(model: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    """The inputs of ``model(*args, **kwargs)`` by the names of its ``forward``'s parameters."""
    signature = inspect.signature(model.forward)
    return dict(signature.bind(*args, **kwargs).arguments)


def _input_path(name: str, model: Any, args: tuple[Any, ...]) -> str:
    """``args[0]`` for the first positional input, ``kwargs['mask']`` for a keyword one."""
    params = list(inspect.signature(model.forward).parameters)
    index = params.index(name) if name in params else None
    if index is not None and index < len(args):
        return f"args[{index}]"
    return f"kwargs[{name!r}]"


#: A dimension declared dynamic: (input name, dim, how it was declared, min, max or None).
_Declared = tuple[str, int, str, int, "int | None"]


def _declared_dims(
    torch: Any, model: Any, args: Any, kwargs: Any, dynamic_shapes: Any
) -> list[_Declared]:
    """Every dimension of a top-level input tensor that ``dynamic_shapes`` declares dynamic."""
    if dynamic_shapes is None:
        return []
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from torch.export.dynamic_shapes import _DimHint, _DimHintType, _tree_map_with_path

    combined = combine_args(model, args, kwargs)
    out: list[Any] = []

    def visit(path: Any, tensor: Any, spec: Any) -> None:
        name = str(getattr(path[0], "key", path[0])) if path else "?"
        if not isinstance(tensor, torch.Tensor) or spec is None:
            return
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec)
        for dim, hint in items:
            if isinstance(hint, _DimHint):
                if hint.type == _DimHintType.STATIC:
                    continue
                label = f"Dim.{hint.type.name}"
                low, high = hint.min, hint.max
            elif isinstance(hint, torch.export.Dim) or type(hint).__name__ in ("_Dim",):
                label = getattr(hint, "__name__", str(hint))
                low, high = getattr(hint, "min", 0), getattr(hint, "max", None)
            else:
                continue
            out.append((name, int(dim), label, int(low or 0), _bound(high)))

    _tree_map_with_path(visit, combined, _by_name(combined, dynamic_shapes))
    return out


def _by_name(combined: dict[str, Any], dynamic_shapes: Any) -> Any:
    if isinstance(dynamic_shapes, (tuple, list)):
        return dict(zip(combined, dynamic_shapes, strict=False))
    return dynamic_shapes


def _user_input_values(torch: Any, program: Any) -> dict[str, Any]:
    """The program's example values of the user's top-level tensor inputs, by name."""
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    out = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT" and getattr(spec.arg, "name", None) in nodes:
            value = nodes[spec.arg.name].meta.get("val")
            if isinstance(value, torch.Tensor):
                out[spec.arg.name] = value
    return out


def _bound(value: Any) -> Any:
    """An int bound, ``None`` for infinity (sympy's ``int_oo``, or a huge int)."""
    if value is None:
        return None
    try:
        number = int(value)
    except Exception:  # sympy's infinities raise all sorts
        return None
    return None if number >= 2**62 else number


def _named_autos(
    torch: Any, model: Any, args: Any, kwargs: Any, dynamic_shapes: Any
) -> tuple[Any, set[tuple[str, int]]]:
    """``dynamic_shapes`` with each ``Dim.AUTO`` of a top-level input made a named ``Dim`` of
    the same range, and the (input, dim) pairs that were."""
    if dynamic_shapes is None:
        return None, set()
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from torch.export.dynamic_shapes import _DimHint, _DimHintType

    relaxed: set[tuple[str, int]] = set()
    by_name = _by_name(combine_args(model, args, kwargs), dynamic_shapes)
    if not isinstance(by_name, Mapping):
        return dynamic_shapes, relaxed

    def named(name: str, dim: Any, spec: Any) -> Any:
        if isinstance(spec, _DimHint) and spec.type == _DimHintType.AUTO:
            relaxed.add((name, int(dim)))
            bounds = {"min": spec.min, "max": spec.max}
            return torch.export.Dim(
                f"{name}_dim{dim}", **{k: v for k, v in bounds.items() if v is not None}
            )
        return spec

    out: dict[str, Any] = {}
    for name, spec in by_name.items():
        if isinstance(spec, Mapping):
            out[name] = {dim: named(name, dim, hint) for dim, hint in spec.items()}
        elif isinstance(spec, (list, tuple)) and all(
            not isinstance(h, (list, tuple, Mapping)) for h in spec
        ):
            out[name] = type(spec)(named(name, dim, hint) for dim, hint in enumerate(spec))
        else:
            out[name] = spec
    if isinstance(dynamic_shapes, (tuple, list)):
        return type(dynamic_shapes)(out.values()), relaxed
    return out, relaxed


def _named_expr(
    expr: str, symbols: Mapping[str, str], sources: Mapping[str, tuple[str, int]]
) -> str:
    """A guard as the user reads it: ``Eq(tokens.shape[1], 4)``, not ``Eq(s77, 4)``."""
    for symbol, source in symbols.items():
        if source in sources:
            name, dim = sources[source]
            expr = re.sub(rf"\b{re.escape(symbol)}\b", f"{name}.shape[{dim}]", expr)
    return expr


def _finding_reason(kind: str, data: Mapping[str, Any]) -> str:
    if kind == "DATA_DEPENDENT_ERROR":
        times = data.get("occurrences", 1)
        return (
            f"the value of {data.get('expr')} depends on the data; export assumed "
            f"{data.get('result')} (the example's), so the program is only right for inputs "
            f"that agree{f' ({times} times)' if times and times > 1 else ''}"
        )
    if kind == "MISSING_FAKE_KERNEL":
        return f"torch.ops.{data.get('op')} has no fake kernel: export ran the real one"
    if kind == "MISMATCHED_FAKE_KERNEL":
        return f"torch.ops.{data.get('op')}'s fake kernel disagrees: {data.get('reason')}".strip()
    if kind == "GUARD_ADDED":
        return f"tracing added the guard {data.get('expr')}, which the declared range violates"
    return str(data)[:200]


def _op_stack(program: Any, op: str) -> list[Frame]:
    """The traced stack of the first call of ``op`` (``mylib.f.default``) in ``program``."""
    for node in program.graph.nodes:
        if node.op == "call_function" and str(node.target) == op:
            trace = node.meta.get("stack_trace") or ""
            return [Frame(m.group(1), int(m.group(2))) for m in FILE_LINE.finditer(trace)]
    return []


def _resized(torch: Any, tensor: Any, dim: int, size: int) -> Any:
    """``tensor`` with ``size`` along ``dim``: cut, or grown by repeating its own values (token
    ids and masks stay valid)."""
    now = tensor.shape[dim]
    if size <= now:
        return tensor.narrow(dim, 0, size).contiguous()
    reps = -(-size // now)
    return torch.cat([tensor] * reps, dim=dim).narrow(dim, 0, size).contiguous()


def _tensor_pairs(torch: Any, out: Any, ref: Any) -> list[tuple[Any, Any]]:
    """The floating-point output tensors of the DUT run and eager, in order."""
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    import torch.utils._pytree as pytree

    left, right = pytree.tree_leaves(out), pytree.tree_leaves(ref)
    return [
        (a, b)
        for a, b in zip(left, right, strict=False)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and b.is_floating_point()
    ]


def _op_counts(program: Any) -> collections.Counter[str]:
    """The program's compute ops, counted. Views, copies, asserts and size reads are left
    out: strict and non-strict tracing place them differently (a transformer's programs
    differ by a few ``unsqueeze``) without computing anything else."""
    counts: collections.Counter[str] = collections.Counter()
    for node in program.graph.nodes:
        if node.op != "call_function" or not hasattr(node.target, "_schema"):
            continue  # operator.getitem, Python's arithmetic on sizes
        name = str(node.target)
        if getattr(node.target, "is_view", False) or name.startswith(_NOT_COMPUTE):
            continue
        counts[name] += 1
    return counts


def _differ(torch: Any, expected: Any, actual: Any) -> str | None:
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    import torch.utils._pytree as pytree

    left, _ = pytree.tree_flatten(expected)
    right, _ = pytree.tree_flatten(actual)
    if len(left) != len(right):
        return f"{len(right)} outputs, eager has {len(left)}"
    for index, (a, b) in enumerate(zip(left, right, strict=True)):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape:
                return f"output {index} has shape {tuple(b.shape)}, eager {tuple(a.shape)}"
            if not torch.allclose(a.float(), b.float(), rtol=_RTOL, atol=_ATOL, equal_nan=True):
                diff = (a.float() - b.float()).abs().max().item()
                return f"output {index} differs by up to {diff:.3g}"
    return None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Export's failures print the partial graph to stderr and log each violated guard at ERROR: the
    report says the same in a few lines."""
    loggers = [logging.getLogger(name) for name in ("torch._guards", "torch.export")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@contextlib.contextmanager
def _without_expression_stacks() -> Iterator[None]:
    """draft_export traces every symbolic expression it creates (torch's ``expression_created``
    entries), each with two symbolized stacks, for tlparse to explain a finding; the findings
    carry stacks of their own, which are all the check reads. A small Llama creates some
    16,000 expressions: without those entries its draft_export takes 1.8 s, not 12 (AVX-512
    VNNI host). It swaps a module global of torch for the block, as draft_export itself
    switches tracing on: one check at a time per process (pytest's, and xdist's workers, run
    one test at a time)."""
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from torch.fx.experimental import sym_node

    traced = getattr(sym_node, "dtrace_structured", None)
    if traced is None:  # a torch that traces expressions elsewhere: left as it is
        yield
        return

    def without_expressions(name: str, *args: Any, **kwargs: Any) -> None:
        if name != "expression_created":
            traced(name, *args, **kwargs)

    sym_node.dtrace_structured = without_expressions  # type: ignore[attr-defined]
    try:
        yield
    finally:
        sym_node.dtrace_structured = traced  # type: ignore[attr-defined]


def _head(exc: BaseException) -> str:
    """An exception's first line (its type when it has no message)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
