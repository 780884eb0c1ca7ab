"""Build the model a ``--nobreak-model`` SPEC names, with inputs for any batch and sequence size.

:func:`resolve` checks a SPEC before any test runs (the module imports, the factory exists, the
``transformers`` model type and task exist); :func:`build` makes the model and its inputs in a
test. Imports torch: loaded only when a ``--nobreak-model`` is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import hashlib
import importlib
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import torch
from torch import nn

from pytest_nobreak.models import diffusers as diffusers_models
from pytest_nobreak.models import hf as hf_models
from pytest_nobreak.models.diffusers import (
    Layout,
    build_diffusers,
    check_diffusers,
    diffusers_inputs,
    diffusers_layouts,
)
from pytest_nobreak.models.hf import (
    build_hf,
    check_hf,
    hf_inputs,
    hf_layouts,
)
from pytest_nobreak.models.skips import BuildSkip, first_line
from pytest_nobreak.models.spec import InputSpec, ModelSpec, SpecError, parse_spec

__all__ = [
    "TIME_LIMIT_HINT",
    "BuildSkip",
    "BuiltModel",
    "TimeLimitExceeded",
    "build",
    "check_inputs",
    "expand",
    "first_tensor",
    "resolve",
    "time_limit",
]

#: The batch and sequence sizes of the first call; ``no_recompile`` then tries the others.
SIZES = ((2, 16), (3, 24), (5, 12))


@dataclasses.dataclass
class BuiltModel:
    """A model ready to check: ``make_inputs(batch, seq)`` gives ``(args, kwargs)`` of a call,
    ``reference`` is the fp32 eager output of the first sizes."""

    module: nn.Module
    make_inputs: Callable[[int, int], tuple[tuple[Any, ...], dict[str, Any]]]
    reference: torch.Tensor

    def inputs(self, index: int = 0) -> tuple[tuple[Any, ...], dict[str, Any]]:
        torch.manual_seed(index)  # the same inputs in every process and every check
        return self.make_inputs(*SIZES[index])


def expand(specs: list[ModelSpec]) -> list[ModelSpec]:
    """The SPECs with every sweep (``hf:*``, ``hf:llm``, ``diffusers:*``, ...) replaced by
    its members, each once, in the order given."""

    out: dict[str, ModelSpec] = {}
    for spec in specs:
        if spec.kind == "hf-set":
            # Looked up on the module, so a test can replace the set with a small one.
            for text in hf_models.hf_set(spec.target):
                out.setdefault(text, parse_spec(text))
        elif spec.kind == "diffusers-set":  # likewise
            for text in diffusers_models.diffusers_set(spec.target):
                out.setdefault(text, parse_spec(text))
        else:
            out.setdefault(spec.text, spec)
    return list(out.values())


def resolve(spec: ModelSpec) -> Callable[[], Any] | None:
    """Check ``spec`` without building its model; return the factory (``None`` for ``hf:``
    and ``diffusers:``). Raises :class:`SpecError` naming what to write."""
    if spec.kind in ("hf", "diffusers"):
        problem = (
            check_hf(spec.target, spec.attr) if spec.kind == "hf" else check_diffusers(spec.target)
        )
        if problem:
            raise SpecError(f"--nobreak-model {spec.text}: {problem}")
        return None
    module = _import(spec)
    factory = getattr(module, spec.attr, None)
    if factory is None:
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]

        close = difflib.get_close_matches(spec.attr, names, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise SpecError(f"--nobreak-model {spec.text}: {spec.target} has no {spec.attr!r}{hint}")
    if not callable(factory):
        raise SpecError(
            f"--nobreak-model {spec.text}: {spec.attr} is a {type(factory).__name__}, not a "
            "callable returning an nn.Module or a (module, example_inputs) pair"
        )
    result: Callable[[], Any] = factory
    return result


def _import(spec: ModelSpec) -> ModuleType:
    name = _module_name(Path(spec.target)) if spec.is_file else spec.target
    try:
        module = importlib.import_module(name)
        if spec.is_file and not _is_file(module, spec.target):
            # Another module of that name came first (a second models.py, or the standard
            # library's json): load this file under a name of its own.
            module = _load_file(Path(spec.target))
        return module
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise SpecError(
            f"--nobreak-model {spec.text}: cannot import {spec.target}: {problem}"
        ) from None


def _is_file(module: ModuleType, path: str) -> bool:
    file = getattr(module, "__file__", None)
    return file is not None and os.path.realpath(file) == os.path.realpath(path)


def _load_file(path: Path) -> ModuleType:
    """The module of ``path`` under a unique name (its directory's hash), kept in
    ``sys.modules`` so its classes pickle and its dataclasses resolve."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    name = f"nobreak_model_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _module_name(path: Path) -> str:
    """The dotted name of a file, and its package root put on ``sys.path``, as pytest's
    default ("prepend") import mode does for a test file: ``examples/factories.py`` in a
    package ``examples`` is ``examples.factories``, so its own ``from examples.models import``
    works."""
    base, parts = path.parent, [path.stem]
    while (base / "__init__.py").is_file():
        parts.insert(0, base.name)
        base = base.parent
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    return ".".join(parts)


def build(
    spec: ModelSpec, factory: Callable[[], Any] | None, given: tuple[InputSpec, ...]
) -> BuiltModel:
    """Build the model and run it once eagerly (the fp32 reference). Raises
    :class:`BuildSkip` when it cannot be built or run; a factory's own error propagates."""
    if spec.kind == "hf" and not given:
        return _build_hf(spec)
    if spec.kind == "diffusers" and not given:
        return _build_diffusers(spec)
    if spec.kind == "hf":
        module = build_hf(spec.target, spec.attr)
        make = _given_maker(given, module, hf=True)
        inferred = False
    elif spec.kind == "diffusers":
        module = build_diffusers(spec.target)
        make = _given_maker(given, module, hf=False)  # keyword inputs by name, as given
        inferred = False
    else:
        assert factory is not None
        result = _call_seeded(factory)
        inferred = not given and not _is_pair(result)
        module, make = _from_factory(spec, result, given)
    built = BuiltModel(module, make, torch.empty(0))
    try:
        args, kwargs = built.inputs()
        with torch.no_grad():
            out = first_tensor(module(*args, **kwargs))
    except BuildSkip:
        raise
    except Exception as exc:
        if spec.kind in ("hf", "diffusers"):
            raise BuildSkip(f"eager forward failed: {first_line(exc)}") from None
        if not inferred:
            raise  # the user's own model on the user's inputs: their error, with its traceback
        shown = ", ".join(_shape_text(i) for i in _infer_from_first_layer(spec, module))
        raise InferredInputsError(
            f"{spec.text}: the inputs inferred from its first layer ({shown}) do not fit it: "
            f"{first_line(exc)}; pass --nobreak-model-inputs, or return (module, "
            "example_inputs) from the factory"
        ) from None
    built.reference = out
    return built


def _build_hf(spec: ModelSpec) -> BuiltModel:
    """The ``hf:`` model of the first shrink (:data:`~.hf.SHRINKS`) that builds and runs
    eagerly; when none does, the first one's reason (the others are fallbacks)."""
    first: BuildSkip | None = None
    for shrinker in hf_models.SHRINKS:
        try:
            return _first_layout(build_hf(spec.target, spec.attr, shrinker))
        except BuildSkip as exc:
            first = first or exc
    assert first is not None
    raise first


def _first_layout(module: nn.Module) -> BuiltModel:
    """The ``hf:`` model with the first of its input layouts its eager forward accepts; when
    none does, the first layout's error is the reason (the others are fallbacks)."""
    first: Exception | None = None
    for layout in range(hf_layouts(module)):
        built = BuiltModel(module, functools.partial(_hf_call, module, layout), torch.empty(0))
        try:
            args, kwargs = built.inputs()
            with torch.no_grad():
                built.reference = first_tensor(module(*args, **kwargs))
        except BuildSkip:
            raise
        except Exception as exc:
            first = first or exc
            continue
        return built
    assert first is not None
    raise BuildSkip(f"eager forward failed: {first_line(first)}") from None


def _build_diffusers(spec: ModelSpec) -> BuiltModel:
    """The ``diffusers:`` model of the first shrink (:data:`~.diffusers.SHRINKS`) that builds
    and runs eagerly; when none does, the first one's reason (the others are fallbacks)."""
    first: BuildSkip | None = None
    for shrinker in diffusers_models.SHRINKS:
        try:
            return _first_diffusers_layout(build_diffusers(spec.target, shrinker))
        except BuildSkip as exc:
            first = first or exc
    assert first is not None
    raise first


def _first_diffusers_layout(module: nn.Module) -> BuiltModel:
    """The ``diffusers:`` model with the first layout of its latent
    (:func:`~.diffusers.diffusers_layouts`) its eager forward accepts at every size of the
    checks, so that no check fails on a size the model cannot take; when none does, the
    first layout's error is the reason (the others are fallbacks)."""
    first: Exception | None = None
    for layout in diffusers_layouts(module):
        built = BuiltModel(
            module, functools.partial(_diffusers_call, module, layout), torch.empty(0)
        )
        try:
            outputs = []
            for index in range(len(SIZES)):
                args, kwargs = built.inputs(index)
                with torch.no_grad():
                    outputs.append(first_tensor(module(*args, **kwargs)))
        except BuildSkip:
            raise
        except Exception as exc:
            first = first or exc
            continue
        built.reference = outputs[0]
        return built
    assert first is not None
    raise BuildSkip(f"eager forward failed: {first_line(first)}") from None


def _diffusers_call(
    module: nn.Module, layout: Layout, batch: int, seq: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (), diffusers_inputs(module, batch, seq, layout)


def _hf_call(
    module: nn.Module, layout: int, batch: int, seq: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (), hf_inputs(module, batch, seq, layout)


def _call_seeded(factory: Callable[[], Any]) -> Any:
    """The factory's result, its random weights from seed 0 (the same model in every process,
    serial or under xdist)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return factory()


def _shape_text(item: InputSpec) -> str:
    dims = "x".join(map(str, item.shape))
    return dims if item.kind == "float" else f"{item.kind}:{dims}"


def _is_pair(result: Any) -> bool:
    return isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)


class InferredInputsError(Exception):
    """The inputs inferred for a factory's module do not fit it (one line, no traceback)."""


def _from_factory(
    spec: ModelSpec, result: Any, given: tuple[InputSpec, ...]
) -> tuple[nn.Module, Callable[[int, int], tuple[tuple[Any, ...], dict[str, Any]]]]:
    if _is_pair(result):
        module, example = result
        if not given:
            return module.eval(), _resizer(example)
    elif isinstance(result, nn.Module):
        module = result
    else:
        raise SpecError(
            f"--nobreak-model {spec.text}: the factory returned {type(result).__name__}; return "
            "an nn.Module or a (module, example_inputs) pair"
        )
    if not given:
        given = _infer_from_first_layer(spec, module)
    return module.eval(), _given_maker(given, module, hf=False)


def _infer_from_first_layer(spec: ModelSpec, module: nn.Module) -> tuple[InputSpec, ...]:
    """Inputs a plain module takes, from its first layer: token ids for an embedding, an image
    batch for a convolution, a batch of rows for a linear layer."""
    for layer in module.modules():
        if isinstance(layer, nn.Embedding):
            return (InputSpec(None, "ids", (2, 16)),)
        if isinstance(layer, nn.Conv2d):
            return (InputSpec(None, "float", (2, layer.in_channels, 32, 32)),)
        if isinstance(layer, nn.Conv1d):
            return (InputSpec(None, "float", (2, layer.in_channels, 64)),)
        if isinstance(layer, nn.Linear):
            return (InputSpec(None, "float", (2, layer.in_features)),)
    raise SpecError(
        f"--nobreak-model {spec.text}: cannot infer the inputs of {type(module).__name__} (its "
        "first layer is no Linear, Conv or Embedding); pass --nobreak-model-inputs, e.g. "
        "4x3x32x32, or return (module, example_inputs) from the factory"
    )


def _vocab(module: nn.Module) -> int:
    config = getattr(module, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int):
        return vocab
    for layer in module.modules():
        if isinstance(layer, nn.Embedding):
            return layer.num_embeddings
    return 100


def _given_maker(
    given: tuple[InputSpec, ...], module: nn.Module, *, hf: bool
) -> Callable[[int, int], tuple[tuple[Any, ...], dict[str, Any]]]:
    """Tensors of the given shapes; a call with other sizes replaces the batch (first) size,
    and the sequence (second) size of token ids."""
    vocab = _vocab(module)
    first = given[0].shape

    def make(batch: int, seq: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        scale = (batch, seq) != SIZES[0]
        for item in given:
            shape = list(item.shape)
            if scale:
                # The batch is the first input's first size: an input of that size follows
                # it, one of another (a broadcast 1, a table) keeps its own.
                if shape[0] == first[0]:
                    shape[0] = batch
                if item.kind == "ids":
                    shape[1] = seq
            if item.kind == "ids":
                tensor = torch.randint(0, max(vocab // 2, 1), tuple(shape))
            else:
                tensor = torch.randn(*shape)
            key = item.keyword if hf else item.name
            if key is None:
                args.append(tensor)
            else:
                kwargs[key] = tensor
            if hf and item.kind == "ids" and item.name is None:
                kwargs["attention_mask"] = torch.ones(tuple(shape), dtype=torch.long)
        return tuple(args), kwargs

    return make


def _resizer(example: Any) -> Callable[[int, int], tuple[tuple[Any, ...], dict[str, Any]]]:
    """The factory's example inputs, with the batch (first) size replaced for other sizes."""
    args, kwargs = _split(example)

    def resize(value: Any, batch: int) -> Any:
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return value
        shape = (batch, *value.shape[1:])
        if value.is_floating_point():
            return torch.randn(shape, dtype=value.dtype)
        high = int(value.max()) + 1 if value.numel() else 1
        return torch.randint(0, max(high, 1), shape, dtype=value.dtype)

    def make(batch: int, seq: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if (batch, seq) == SIZES[0]:
            return args, kwargs
        # Another batch size than the example's: the first one's ratio is kept.
        return (
            tuple(resize(a, batch) for a in args),
            {k: resize(v, batch) for k, v in kwargs.items()},
        )

    return make


def _split(example: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example, Mapping):
        return (), dict(example)
    if isinstance(example, (tuple, list)):
        return tuple(example), {}
    return (example,), {}


def first_tensor(out: Any) -> torch.Tensor:
    """The output compared with the reference: a tensor, or the first floating tensor of a
    ``ModelOutput``/dict (``logits``, ``last_hidden_state``) or tuple; of an output with none
    (an audio tokenizer's codes), its first tensor, as floats."""
    if isinstance(out, torch.Tensor):
        return out
    tensors = list(_tensors(out))
    for tensor in tensors:
        if tensor.is_floating_point():
            return tensor
    if tensors:
        return tensors[0].float()
    raise TypeError(f"no tensor in the model's output ({type(out).__name__})")


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    """The tensors of a nested output, depth first."""
    if isinstance(out, torch.Tensor):
        yield out
        return
    values = list(out.values()) if isinstance(out, Mapping) else out
    if isinstance(values, (tuple, list)):
        for value in values:
            yield from _tensors(value)


#: What every message of the time limit ends with.
TIME_LIMIT_HINT = "(--nobreak-model-timeout; 0 lifts the limit)"


class TimeLimitExceeded(BaseException):
    """A check (or the factory's first call) ran past ``--nobreak-model-timeout``.

    A ``BaseException``, as ``KeyboardInterrupt``: Dynamo turns an ``Exception`` raised while it
    traces into a compile error of its own, which would hide what happened.
    """


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`TimeLimitExceeded` in the block after ``seconds`` (wall clock).

    A ``SIGALRM`` timer: it interrupts the Python code of the check (build, trace, lowering,
    simulation) where it runs, which works in xdist workers, whose tests run in the main
    thread. Off the main thread (or without ``SIGALRM``), there is no limit.
    """
    if (
        not seconds
        or threading.current_thread() is not threading.main_thread()
        or not hasattr(signal, "setitimer")
    ):
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeLimitExceeded(f"took more than {seconds:g}s")

    outer, interval = signal.getitimer(signal.ITIMER_REAL)
    if outer and outer <= seconds:
        yield  # an outer timer (pytest-timeout's, say) fires first: it stands, with its handler
        return
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expire)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # the outer timer gets back what is left of its time (at least a tick)
            left = max(outer - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, interval)


def check_inputs(
    spec: ModelSpec,
    factory: Callable[[], Any] | None,
    given: tuple[InputSpec, ...],
    timeout: float | None,
) -> None:
    """Raise :class:`SpecError` when the inputs of ``spec``'s model cannot be made: a factory
    is called (its result must be a module or a pair, and a bare module's inputs inferable),
    within the checks' time limit, ``timeout`` seconds: a factory that hangs stops the run
    before any test, saying so, rather than holding it. An ``hf:`` or ``diffusers:`` model's
    inputs are inferred from its ``forward`` when it is built; a named one whose inputs cannot
    be made fails its checks there, with the reason."""
    if spec.kind in ("hf", "diffusers"):
        return
    assert factory is not None
    expired = None
    try:
        with time_limit(timeout):
            result = _call_seeded(factory)
    except TimeLimitExceeded as exc:
        expired = str(exc)
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise SpecError(f"--nobreak-model {spec.text}: the factory raised {problem}") from None
    if expired is not None:  # raised outside the handler: one line, no chained traceback
        raise SpecError(f"--nobreak-model {spec.text}: the factory {expired} {TIME_LIMIT_HINT}")
    _from_factory(spec, result, given)
