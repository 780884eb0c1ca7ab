"""``--nobreak-model SPEC`` and ``--nobreak-model-inputs``: the grammar, parsed without torch.

A SPEC names a model to check with no test code:

- ``package.module:factory`` or ``path/to/file.py:factory``: a callable returning an
  ``nn.Module``, or a ``(module, example_inputs)`` pair;
- ``hf:<model_type>[:<task>]``: a ``transformers`` architecture built from its config class,
  shrunk, with random weights (see :mod:`pytest_nobreak.models.hf`);
- ``hf:*``, ``hf:llm``, ``hf:vision``, ``hf:audio``: a sweep over many of them;
- ``diffusers:<ModelClass>``: a ``diffusers`` model class (``diffusers:UNet2DConditionModel``)
  built from its config, shrunk, with random weights (see
  :mod:`pytest_nobreak.models.diffusers`), and ``diffusers:*``, every one.

Inputs (``--nobreak-model-inputs``) are a comma-separated list of tensors, each
``[name=][kind:]DIMS``: ``4x3x32x32`` is a float tensor, ``ids:2x16`` token ids,
``pixels:2x3x32x32``, ``features:2x80x3000``, ``values:2x16000`` the named inputs of a
``transformers`` model; ``mask=ids:2x16`` passes a keyword. Everything here is pure parsing:
every mistake is a :class:`SpecError` whose message says what to write instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path

__all__ = [
    "DIFFUSERS_SETS",
    "HF_SETS",
    "INPUT_KINDS",
    "InputSpec",
    "ModelSpec",
    "SpecError",
    "parse_inputs",
    "parse_spec",
]

#: The sweeps ``hf:<set>`` expands to (``hf:*`` is every architecture).
HF_SETS = ("*", "llm", "vision", "audio")
#: The sweeps ``diffusers:<set>`` expands to (every model class).
DIFFUSERS_SETS = ("*",)
#: Input kinds: what tensor to make, and the ``transformers`` keyword it is passed as.
INPUT_KINDS = {
    "float": None,
    "ids": "input_ids",
    "pixels": "pixel_values",
    "features": "input_features",
    "values": "input_values",
}
SPEC_FORMS = (
    "package.module:factory, path/to/file.py:factory, hf:<model_type>[:<task>] "
    f"(e.g. hf:llama, hf:bert:masked-lm), diffusers:<ModelClass> (e.g. "
    "diffusers:UNet2DConditionModel) or a sweep "
    f"({', '.join(['hf:' + s for s in HF_SETS] + ['diffusers:' + s for s in DIFFUSERS_SETS])})"
)
INPUT_FORMS = (
    "a comma-separated list of [name=][kind:]DIMS, e.g. 4x3x32x32, ids:2x16, "
    f"pixels:2x3x32x32 (kinds: {', '.join(INPUT_KINDS)})"
)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class SpecError(ValueError):
    """A SPEC or an inputs string cannot be used. ``str()`` is one line saying what to write."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One parsed SPEC. ``text`` is what the user wrote (the item name shows it)."""

    text: str
    kind: str  # "factory" | "hf" | "hf-set" | "diffusers" | "diffusers-set"
    #: factory: the module (dotted name) or file path; hf: the model type; diffusers: the
    #: model class; hf-set, diffusers-set: the set.
    target: str
    #: factory: the callable's name; hf: the task head ("" for the base model).
    attr: str = ""

    @property
    def is_file(self) -> bool:
        return self.kind == "factory" and self.target.endswith(".py")


def parse_spec(text: str, *, rootpath: Path | None = None) -> ModelSpec:
    """Parse one SPEC (see the module docstring). A file path must exist (relative paths are
    tried from the current directory, then from ``rootpath``)."""
    spec = text.strip()
    if not spec:
        raise SpecError(f"--nobreak-model: empty SPEC; write {SPEC_FORMS}")
    if spec.startswith("hf:"):
        return _parse_hf(spec)
    if spec.startswith("diffusers:"):
        return _parse_diffusers(spec)
    target, sep, attr = spec.rpartition(":")
    if not sep or not target:
        raise SpecError(
            f"--nobreak-model {spec}: no factory named; write module:factory or "
            f"file.py:factory (e.g. {spec}:make_model), or {SPEC_FORMS}"
        )
    if not _IDENT.fullmatch(attr):
        raise SpecError(
            f"--nobreak-model {spec}: {attr!r} is not a Python name; the part after the last "
            "':' is the factory function, e.g. models.py:make_model"
        )
    if target.endswith(".py"):
        path = _find_file(target, rootpath)
        if path is None:
            raise SpecError(
                f"--nobreak-model {spec}: file {target} does not exist; give a path relative to "
                "the current directory or the rootdir"
            )
        return ModelSpec(text=spec, kind="factory", target=str(path), attr=attr)
    if not _MODULE.fullmatch(target):
        raise SpecError(
            f"--nobreak-model {spec}: {target!r} is neither a dotted module name nor a .py "
            f"file; write {SPEC_FORMS}"
        )
    return ModelSpec(text=spec, kind="factory", target=target, attr=attr)


def _parse_hf(spec: str) -> ModelSpec:
    parts = spec.split(":")
    if len(parts) > 3 or not parts[1]:
        raise SpecError(
            f"--nobreak-model {spec}: write hf:<model_type> or hf:<model_type>:<task> "
            "(e.g. hf:llama, hf:llama:causal-lm) or a sweep: "
            + ", ".join("hf:" + s for s in HF_SETS)
        )
    if parts[1] in HF_SETS:
        if len(parts) == 3:
            raise SpecError(f"--nobreak-model {spec}: a sweep takes no task; write hf:{parts[1]}")
        return ModelSpec(text=spec, kind="hf-set", target=parts[1])
    return ModelSpec(
        text=spec, kind="hf", target=parts[1], attr=parts[2] if len(parts) == 3 else ""
    )


def _parse_diffusers(spec: str) -> ModelSpec:
    name = spec.removeprefix("diffusers:")
    if name in DIFFUSERS_SETS:
        return ModelSpec(text=spec, kind="diffusers-set", target=name)
    if not _IDENT.fullmatch(name):
        raise SpecError(
            f"--nobreak-model {spec}: write diffusers:<ModelClass> (a class diffusers exports, "
            "e.g. diffusers:UNet2DConditionModel, diffusers:AutoencoderKL) or the sweep "
            + ", ".join("diffusers:" + s for s in DIFFUSERS_SETS)
        )
    return ModelSpec(text=spec, kind="diffusers", target=name)


def _find_file(target: str, rootpath: Path | None) -> Path | None:
    for base in (Path.cwd(), rootpath):
        if base is None:
            continue
        path = base / target
        if path.is_file():
            return path.resolve()
    return None


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One tensor of ``--nobreak-model-inputs``: its keyword (``None``: positional, or the
    kind's ``transformers`` keyword), kind and shape."""

    name: str | None
    kind: str
    shape: tuple[int, ...]

    @property
    def keyword(self) -> str | None:
        """The keyword a ``transformers`` model takes it as (a plain float: positional)."""
        return self.name or INPUT_KINDS[self.kind]


def parse_inputs(text: str) -> tuple[InputSpec, ...]:
    """Parse ``--nobreak-model-inputs`` (see the module docstring)."""
    items = [part.strip() for part in text.split(",")]
    if not text.strip() or not all(items):
        raise SpecError(f"--nobreak-model-inputs {text!r}: empty; write {INPUT_FORMS}")
    out = []
    for item in items:
        name, eq, rest = item.partition("=")
        if not eq:
            name, rest = "", item
        elif not _IDENT.fullmatch(name):
            raise SpecError(
                f"--nobreak-model-inputs {item}: {name!r} is not a keyword name; "
                f"write {INPUT_FORMS}"
            )
        kind, colon, dims = rest.rpartition(":")
        kind = kind if colon else "float"
        if kind not in INPUT_KINDS:
            close = difflib.get_close_matches(kind, INPUT_KINDS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise SpecError(
                f"--nobreak-model-inputs {item}: unknown kind {kind!r}{hint}; "
                f"kinds: {', '.join(INPUT_KINDS)}"
            )
        shape = _shape(dims)
        if shape is None:
            raise SpecError(
                f"--nobreak-model-inputs {item}: {dims!r} is not a shape; write the sizes "
                "joined by x, e.g. 4x3x32x32"
            )
        if kind == "ids" and len(shape) != 2:
            raise SpecError(
                f"--nobreak-model-inputs {item}: token ids are batch x sequence, e.g. ids:2x16"
            )
        out.append(InputSpec(name=name or None, kind=kind, shape=shape))
    return tuple(out)


def _shape(dims: str) -> tuple[int, ...] | None:
    parts = dims.split("x")
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        return None
    return tuple(int(p) for p in parts)
