"""The change that removes each common graph break: one table, and the ``fix:`` line of a report.

Each :class:`Fix` answers one or more of Dynamo's graph-break ids (the root cause's, for a
chain). Where the pattern is simple it rewrites the user's own line with the user's own names
(``if t.mean() > 0.5: h = h * 0.5`` → ``h = torch.where(t.mean() > 0.5, h * 0.5, h)``);
otherwise it gives its template. Every id is tested: ``tests/plugin/test_fixes.py`` runs a
tiny example of each break under the marker (it fails with that id, this fix in its own
entry; without the plugin it passes) and the same example rewritten as the fix says (it
passes, with the outputs the broken one gives eagerly); every rewrite rule and template is
checked against its text. The one exception is GB0003 (a generator function compiled
itself): Dynamo refuses that frame before tracing it, and the marker does not see it. The ids
and examples were measured on torch 2.13 and Python 3.11; an id torch renumbers simply finds no
fix.

>>> fix_for("GB0170", "if t.mean() > 0.5: h = h * 0.5")
'h = torch.where(t.mean() > 0.5, h * 0.5, h)'
>>> fix_for("GB0036", "return x[x > 0.5].sum()")
'torch.where(x > 0.5, x, 0).sum() instead of x[x > 0.5].sum()'
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

__all__ = ["FIXES", "Fix", "Rules", "code_of", "fix_for"]

#: A rewrite of the user's line: (stripped source line, Dynamo's reason) -> the fix, or None.
Rewriter = Callable[[str, str], str | None]


@dataclasses.dataclass(frozen=True)
class Fix:
    """The fix of the breaks ``gb_ids`` (a ``name`` for the table): ``rewrite`` turns the
    user's line into the fixed code when the pattern is simple, else ``template`` stands."""

    name: str
    gb_ids: tuple[str, ...]
    template: str
    rewrite: Rewriter | None = None

    def text(self, source: str | None, reason: str = "") -> str:
        """The fix for a break at ``source`` (the user's line), with ``reason`` (Dynamo's)."""
        line = code_of(source)
        if self.rewrite is not None:
            rewritten = self.rewrite(line, reason)
            if rewritten:
                return rewritten
        return self.template


def code_of(source: str | None) -> str:
    """The user's line as the rewriters read it: stripped, without a trailing comment (one
    holding a quote may be inside a string: kept)."""
    return re.sub(r"\s+#[^'\"]*$", "", (source or "").strip())


#: A rule's template: a format string of the match's named groups, or a function of the match.
Template = str | Callable[[re.Match[str]], str]


class Rules:
    """A rewriter trying ``(regex, template)`` rules in order on the source line; the first
    that matches makes the fix (``rules`` is public so that a test can exercise each one)."""

    def __init__(self, *rules: tuple[str, Template]) -> None:
        self.rules: tuple[tuple[re.Pattern[str], Template], ...] = tuple(
            (re.compile(pattern), template) for pattern, template in rules
        )

    def __call__(self, line: str, reason: str) -> str | None:
        for pattern, template in self.rules:
            match = pattern.search(line)
            if match:
                if callable(template):
                    return template(match)
                return template.format(**match.groupdict())
        return None


#: A with-block Dynamo cannot enter (or whose manager it cannot build): run it around the call.
_WITH_BLOCK = (
    r"^with (?P<cm>.+):$",
    "move `with {cm}:` out of the compiled function: wrap the compiled call in it",
)


def _disabled_callee(line: str, reason: str) -> str | None:
    match = re.search(r"<function (?P<fn>[\w.<>]+) at 0x", reason)
    if match is None:
        return None
    fn = match["fn"].rsplit(".", 1)[-1]
    return (
        f"remove @torch.compiler.disable from {fn} (or call {fn} outside the compiled region); "
        "if it cannot be traced, fix what stops it instead"
    )


def _backend_exception(line: str, reason: str) -> str | None:
    if "_local_scalar_dense" not in reason:
        return None
    return (
        "the backend cannot take aten._local_scalar_dense (a tensor's value read on the host, "
        "as .item() does): compute with the tensor instead (no .item()), or put the host call "
        "behind a torch.library.custom_op with a register_fake, which the backend sees as one "
        "opaque op"
    )


#: The elementwise form of a tensor comparison that returns a Python bool.
_ELEMENTWISE = {"equal": "eq", "allclose": "isclose"}

#: numpy functions torch._numpy cannot trace, and their torch equivalents.
NUMPY_TO_TORCH = {
    "nanmean": "torch.nanmean",
    "nansum": "torch.nansum",
    "digitize": "torch.bucketize(..., right=True)",
    "isin": "torch.isin",
    "interp": "torch.searchsorted and a linear blend",
    "setdiff1d": "a torch.isin mask",
}


def _numpy(match: re.Match[str]) -> str:
    fn = match["fn"]
    torch_fn = NUMPY_TO_TORCH.get(fn)
    if torch_fn is None:
        return f"np.{fn} cannot be traced: replace it with torch ops on the tensor itself"
    return f"replace np.{fn} with {torch_fn} on the tensor itself (no .numpy() round trip)"


#: The table: the fix of each common break, by Dynamo's graph-break id.
FIXES: tuple[Fix, ...] = (
    Fix(
        "data-dependent branch",
        ("GB0170",),
        "compute both branches and select with torch.where(cond, a, b), or use "
        "torch.cond(cond, true_fn, false_fn, operands); never branch in Python on a tensor",
        Rules(
            (
                # One plain assignment after the colon (no `;`, `==`, annotation or comment).
                r"^if (?P<cond>[^;#]+?):\s*(?P<var>[A-Za-z_][\w.]*)\s*=(?!=)\s*(?P<expr>[^;#]+)$",
                "{var} = torch.where({cond}, {expr}, {var})",
            ),
            (
                r"^if (?P<cond>.+?):\s*return (?P<expr>.+)$",
                "select with torch.where({cond}, {expr}, <the other result>) and return it, "
                "or torch.cond({cond}, true_fn, false_fn, operands)",
            ),
            (
                r"^(?:el)?if (?P<cond>.+):$",
                "compute both branches and select: <var> = torch.where({cond}, <value if "
                "true>, <value if false>), or torch.cond({cond}, true_fn, false_fn, operands)",
            ),
        ),
    ),
    Fix(
        "a tensor's value read into Python (.item(), .tolist(), float(t))",
        ("GB0124", "GB0109", "GB0033"),
        "keep the value a tensor (t.sum(), not t.sum().item()) and let broadcasting use it; "
        "or set torch._dynamo.config.capture_scalar_outputs = True",
        Rules(
            (
                r"^(?P<var>[\w.]+)\s*=\s*(?P<expr>.+)\.item\(\)$",
                "{var} = {expr}  (a 0-d tensor: use it in tensor math, not as a Python number)",
            ),
            (r"sum\((?P<t>[\w.]+)\.tolist\(\)\)", "{t}.sum() instead of sum({t}.tolist())"),
            (
                # A Python bool of two tensors (GB0033): its tensor form broadcasts in the graph.
                r"torch\.(?P<fn>equal|allclose)\((?P<args>[^()]*)\)",
                lambda m: (
                    f"torch.{_ELEMENTWISE[m['fn']]}({m['args']}).all() instead of "
                    f"torch.{m['fn']}({m['args']}) (a 0-d bool tensor, not a Python bool; "
                    "the shapes must match)"
                ),
            ),
            (
                # The tensor expression: a name, attributes and balanced calls (never starting
                # inside the call that wraps it, as in int(t.item())).
                r"(?<![\w.])(?P<expr>[A-Za-z_][\w.]*(?:\([^()]*\)[\w.]*)*)\.item\(\)",
                "use {expr} itself (a tensor) where {expr}.item() is used",
            ),
        ),
    ),
    Fix(
        "print, logging or a builtin on a tensor",
        ("GB0059", "GB0291", "GB0569"),
        "call print/logging/str/repr outside the compiled region, on the tensors it returns",
        Rules(
            (
                r"^(?P<call>print\(.*\))$",
                "move {call} to the caller, after the compiled call returns (or add print to "
                "torch._dynamo.config.reorderable_logging_functions)",
            ),
            (
                r"^(?P<call>(?:\w+\.)*(?:log|logger|logging|_log)\.\w+\(.*\))$",
                "move {call} out of the compiled region (log from the caller)",
            ),
            (
                r"\b(?P<fn>str|repr|format)\((?P<t>[^()]*(?:\([^()]*\))?[^()]*)\)",
                "return {t} from the compiled function and call {fn}() on it in the caller",
            ),
        ),
    ),
    Fix(
        "a torch.compiler.disable()d callee",
        ("GB0098",),
        "remove @torch.compiler.disable from the callee (or call it outside the compiled "
        "region); if it cannot be traced, fix what stops it instead",
        _disabled_callee,
    ),
    Fix(
        # GB0007: a C function (os.getpid, time.time, warnings.warn); GB0008: a Python function
        # of a module Dynamo skips (torch.autograd.set_detect_anomaly, detect_anomaly(),
        # saved_tensors_hooks); GB4841: a value it has no type for (a logger's attribute, as
        # len(log.name)) handed to a builtin.
        "an untraceable function or value (a C function, a skipped library's, a logger's "
        "attribute)",
        ("GB0007", "GB0008", "GB4841"),
        "call it outside the compiled function and pass its result in as an argument (time "
        "around the compiled call, not inside it)",
        Rules(
            (
                # Only a line that is just the call: anything around it stays compiled.
                r"^(?P<var>\w+)\s*=\s*(?P<call>[\w.]+\([^()]*\))$",
                "compute {var} = {call} before the compiled call and pass {var} in as an argument",
            ),
            (
                r"^(?P<call>[\w.]+\([^()]*\))$",
                "call {call} outside the compiled function, before the compiled call",
            ),
            _WITH_BLOCK,
        ),
    ),
    Fix(
        "an unsupported context manager",
        ("GB0142", "GB0262"),
        "move the with-block out of the compiled function: wrap the compiled call in it",
        Rules(_WITH_BLOCK),
    ),
    Fix(
        # GB0811 ("missing tp_iter"): tuple(), list(), zip() or a loop over a generator or a
        # map object passed in.
        "a generator or iterator passed in",
        ("GB0811",),
        "materialize generators and iterators before the compiled call: pass tuple(gen) "
        "instead of gen",
    ),
    Fix(
        # GB4347 ("Missing tp_iternext"), measured on torch 2.13 and Python 3.11: next() on an
        # iterator Dynamo did not make. In real models (which pass only tensors) it is a
        # comprehension in a function Dynamo gave up on: Python 3.11 runs a comprehension as a
        # function of its own, handed iter(...) of what it loops over, and Dynamo compiles that
        # frame alone (next() on a dict_keyiterator, list_iterator, zip). Otherwise it is
        # next(it) on an iterator passed in, a global or a module attribute (iter(list),
        # reversed(), itertools.cycle, csv.reader, a generator).
        "an iterator made outside the traced code, stepped with next()",
        ("GB4347",),
        "Dynamo cannot call next() on an iterator made outside the code it traces: for a "
        "comprehension (Python 3.11 runs it as a function of its own), fix what made Dynamo "
        "give up on the function around it (its other entry here); for next(it) on an "
        "argument, a global or a module attribute, call next() in the caller and pass the value "
        "in, or keep a list or tuple and index it",
        Rules(
            (
                r"[\[{(][^#]*\sfor\s[^#]+\sin\s",
                "this comprehension ran as a function of its own (as Python 3.11 runs one) "
                "because Dynamo gave up on the function around it: fix that function's break "
                "(its other entry here) and the comprehension compiles with it",
            ),
            (
                r"(?<![\w.])next\((?P<it>[\w.]+)\)",
                "call next({it}) in the caller and pass the value in as an argument (Dynamo "
                "cannot step an iterator made outside the compiled function), or keep a list or "
                "tuple and index it",
            ),
        ),
    ),
    Fix(
        "a generator function compiled itself",
        ("GB0003",),
        "compile a plain function that consumes the generator (def f(xs): return "
        "tuple(gen(xs))), not the generator function itself",
    ),
    Fix(
        "a data-dependent output shape (nonzero, x[mask], unique)",
        ("GB0036",),
        "keep shapes static: torch.where(mask, x, 0) instead of x[mask], mask.sum() to count; "
        "or set torch._dynamo.config.capture_dynamic_output_shape_ops = True",
        Rules(
            (
                r"(?P<x>[\w.]+)\[(?P<mask>[^\[\]]+)\]\.sum\(\)",
                "torch.where({mask}, {x}, 0).sum() instead of {x}[{mask}].sum()",
            ),
            (
                r"(?P<x>[\w.]+)\[(?P<mask>[^\[\]]+)\]\.mean\(\)",
                "torch.where({mask}, {x}, 0).sum() / ({mask}).sum() instead of {x}[{mask}].mean()",
            ),
        ),
    ),
    Fix(
        "a backend compiler exception",
        ("GB0219",),
        "the backend failed on this graph (see raised:): fix the backend, or hide the op it "
        "cannot take behind a torch.library.custom_op with a register_fake",
        _backend_exception,
    ),
    Fix(
        "the recompile limit (changing shapes or Python values)",
        ("GB0039",),
        "mark the dims that vary dynamic: torch._dynamo.mark_dynamic(x, dim) before the call "
        "(or torch.compile(..., dynamic=True)); pass values that change every call as tensors, "
        "not Python ints driving loops or branches",
        Rules(
            (
                r"for \w+ in range\((?P<n>[\w.]+)\)",
                "pass {n} as a tensor and write the loop over range({n}) as tensor math (each "
                "new value of a Python int in range() compiles a new graph)",
            ),
        ),
    ),
    Fix(
        "an unsupported Tensor method",
        ("GB0123", "GB9186", "GB0126"),
        "call it outside the compiled region: compile the forward and the loss, and call "
        "backward(), autograd.grad() or resize_() on what it returns",
        Rules(
            (
                r"^(?P<loss>[\w.]+)\.backward\(\)$",
                "call .backward() outside the compiled region: return the loss from the compiled "
                "function and call {loss}.backward() on the result",
            ),
        ),
    ),
    Fix(
        "a numpy function torch cannot trace",
        ("GB0294",),
        "replace the numpy function with its torch equivalent on the tensor itself",
        Rules((r"\bnp\.(?P<fn>\w+)\(", _numpy)),
    ),
    Fix(
        "a module attribute set in forward",
        ("GB0264", "GB0206"),
        "create parameters and submodules in __init__; keep state in a buffer registered in "
        "__init__ and update it in place with .copy_(); set requires_grad outside the "
        "compiled call",
        Rules(
            (
                r"^self\.(?P<name>\w+)\s*=\s*(?:nn|torch\.nn)\.Parameter\((?P<expr>.+?)"
                r"(?:,\s*requires_grad\s*=\s*\w+)?\)$",
                'self.{name}.copy_({expr}), with self.register_buffer("{name}", ...) in '
                "__init__ instead of a Parameter",
            ),
            (
                r"^(?P<t>[\w.]+)\.requires_grad\s*=\s*(?P<v>\w+)$",
                "set {t}.requires_grad = {v} once, outside the compiled call (or when you create "
                "it)",
            ),
        ),
    ),
)

_BY_ID: dict[str, Fix] = {gb_id: fix for fix in FIXES for gb_id in fix.gb_ids}


def fix_for(gb_id: str | None, source: str | None, reason: str = "") -> str | None:
    """The fix of the break ``gb_id`` at the user's line ``source``: a rewrite of the line where
    the pattern is simple, else the table's template; None when the table has no fix for it."""
    fix = _BY_ID.get(gb_id or "")
    return None if fix is None else fix.text(source, reason)
