"""Which torch releases the plugin can watch: the oldest, and a check of the internals it taps."""

from __future__ import annotations

import functools
import inspect
import re

import torch
import torch._dynamo
import torch._dynamo.convert_frame as _convert_frame
import torch._dynamo.eval_frame as _eval_frame
import torch._dynamo.output_graph as _output_graph
import torch._dynamo.utils as _dynamo_utils

MIN_TORCH = (2, 12)


class TorchCompatError(RuntimeError):
    """This torch lacks an API pytest-nobreak needs to see graph breaks."""


def torch_version() -> str:
    """The running torch version without the local build tag (``2.13.0``, not ``2.13.0+cpu``)."""
    return str(torch.__version__).split("+", 1)[0]


def release() -> tuple[int, ...]:
    """The running torch's (major, minor): ``(2, 13)``."""
    return tuple(int(p) for p in re.findall(r"\d+", torch_version())[:2])


#: The torch releases the plugin is tested on (CI runs the oldest and the newest).
SUPPORTED = f">={'.'.join(map(str, MIN_TORCH))} (tested on 2.12 and 2.13)"


#: The parameters each tapped function must take, as the taps call it (``self`` and ``cls``
#: left out). A torch that renames or reorders them would break the user's compile through
#: the tap (torch 2.10's ``log_graph_break(code_options, reason="", user_stack=None)`` made
#: every graph break an ``InternalTorchDynamoError``), so it is refused instead.
_SIGNATURES: dict[str, tuple[str, ...]] = {
    "InstructionTranslatorBase.log_graph_break": ("code_options", "reason", "exc"),
    "torch._dynamo.eval_frame._callback_from_stance": ("callback",),
    "torch._dynamo.convert_frame.CatchErrorsWrapper.__call__": (
        "frame",
        "cache_entry",
        "frame_state",
    ),
    "torch._dynamo.utils.CompilationMetrics.create": ("metrics",),
    "torch._dynamo.output_graph.OutputGraph.call_user_compiler": ("gm", "example_inputs"),
}


@functools.cache
def check_torch() -> None:
    """Fail with one line if this torch cannot be watched, naming what is missing or what
    takes other arguments than the taps pass."""
    if release() < MIN_TORCH:
        raise TorchCompatError(
            f"pytest-nobreak needs torch{SUPPORTED}; this is torch {torch.__version__}. "
            "Upgrade torch or run with -p no:nobreak."
        )
    # Lazy: after the version check: an older torch may not have it.
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    required: dict[str, object] = {
        "torch._dynamo.error_on_graph_break": getattr(torch._dynamo, "error_on_graph_break", None),
        "torch._dynamo.utils.counters": getattr(_dynamo_utils, "counters", None),
        "torch._dynamo.utils.get_compilation_metrics": getattr(
            _dynamo_utils, "get_compilation_metrics", None
        ),
        "InstructionTranslatorBase.log_graph_break": getattr(
            InstructionTranslatorBase, "log_graph_break", None
        ),
        "torch._dynamo.eval_frame._callback_from_stance": getattr(
            _eval_frame, "_callback_from_stance", None
        ),
        "torch._dynamo.eval_frame._stance": getattr(_eval_frame, "_stance", None),
        # vars(), not getattr(): every class has a __call__ (type's).
        "torch._dynamo.convert_frame.CatchErrorsWrapper.__call__": vars(
            getattr(_convert_frame, "CatchErrorsWrapper", object)
        ).get("__call__"),
        "torch._dynamo.utils.CompilationMetrics.create": getattr(
            getattr(_dynamo_utils, "CompilationMetrics", None), "create", None
        ),
        "torch._dynamo.output_graph.OutputGraph.call_user_compiler": getattr(
            _output_graph.OutputGraph, "call_user_compiler", None
        ),
    }
    missing = [name for name, value in required.items() if value is None]
    if missing:
        raise TorchCompatError(
            f"pytest-nobreak cannot watch torch.compile on torch {torch.__version__}: "
            f"missing {', '.join(missing)}. Supported: torch{SUPPORTED}."
        )
    changed = [
        f"{name}({', '.join(found)}), not ({', '.join(expected)})"
        for name, expected in _SIGNATURES.items()
        if (found := _parameters(required[name])) is not None and found != expected
    ]
    if changed:
        raise TorchCompatError(
            f"pytest-nobreak cannot watch torch.compile on torch {torch.__version__}: "
            f"{'; '.join(changed)}. Supported: torch{SUPPORTED}."
        )


def _parameters(fn: object) -> tuple[str, ...] | None:
    """The parameter names of ``fn`` past ``self``/``cls`` (``None`` if unreadable: a C
    function, which the taps only wrap with ``*args``)."""
    try:
        # The original's, not the tap's (a bound classmethod's wrapper would lose a parameter).
        params = list(inspect.signature(inspect.unwrap(fn)).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return tuple(p for p in params if p not in ("self", "cls"))
