"""The ``transformers`` architectures: tasks, sweeps, and building one shrunk, in eval mode."""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from pytest_nobreak.models.hf.shrinking import shrink
from pytest_nobreak.models.skips import MAX_PARAMS, BuildSkip, first_line, instantiate
from pytest_nobreak.models.spec import SpecError

__all__ = [
    "MAX_PARAMS",
    "SET_TASKS",
    "TASKS",
    "auto_modules",
    "build_hf",
    "check_hf",
    "hf_set",
]

#: Task names for ``hf:<model_type>:<task>``, and the auto-mapping that names their class.
TASKS = {
    "": "MODEL_MAPPING_NAMES",
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq2seq-lm": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "sequence-classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "token-classification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "question-answering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "speech-seq2seq": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "ctc": "MODEL_FOR_CTC_MAPPING_NAMES",
    "audio-classification": "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
}
#: The named sweeps: each is the model types of one task mapping, built with that task's head.
SET_TASKS = {
    "*": ("",),
    "llm": ("causal-lm",),
    "vision": ("image-classification",),
    "audio": ("ctc", "audio-classification", "speech-seq2seq"),
}


def auto_modules() -> Any:
    """``transformers``' auto modules (modeling, configuration): the names of every
    architecture and task mapping. A missing ``transformers`` is a usage error."""
    try:
        # Lazy: transformers is an optional extra: imported when an hf: model is built.
        from transformers.models.auto import configuration_auto, modeling_auto
    except ImportError as exc:
        raise SpecError(
            f"--nobreak-model hf:...: needs transformers, which cannot be imported ({exc}); "
            "pip install transformers"
        ) from None
    return modeling_auto, configuration_auto


def check_hf(model_type: str, task: str) -> str | None:
    """A one-line problem with ``hf:<model_type>[:<task>]`` (what to write), or ``None``."""
    modeling, configuration = auto_modules()
    if task not in TASKS:
        return f"unknown task {task!r}; tasks: {', '.join(t for t in TASKS if t)}"
    if model_type not in configuration.CONFIG_MAPPING_NAMES:
        close = difflib.get_close_matches(model_type, configuration.CONFIG_MAPPING_NAMES, n=3)
        hint = f" (did you mean {', '.join('hf:' + c for c in close)}?)" if close else ""
        return f"transformers {_version()} has no model type {model_type!r}{hint}"
    if model_type not in getattr(modeling, TASKS[task]):
        tasks = [
            t or "(base)" for t, names in TASKS.items() if model_type in getattr(modeling, names)
        ]
        return (
            f"{model_type} has no {task or 'base'} model; its tasks: "
            f"{', '.join(tasks) or 'none this plugin knows'}"
        )
    return None


def hf_set(name: str) -> list[str]:
    """The SPECs ``hf:<name>`` expands to, sorted (every xdist worker collects the same)."""
    modeling, _ = auto_modules()
    specs = set()
    for task in SET_TASKS[name]:
        for model_type in getattr(modeling, TASKS[task]):
            specs.add(f"hf:{model_type}" + (f":{task}" if task else ""))
    return sorted(specs)


def _version() -> str:
    # Lazy: transformers is an optional extra: imported when an hf: model is built.
    import transformers

    return str(transformers.__version__)


def _class(names: Mapping[str, Any], model_type: str) -> Any:
    # Lazy: transformers is an optional extra: imported when an hf: model is built.
    import transformers

    name = names[model_type]
    name = name[0] if isinstance(name, (list, tuple)) else name
    try:
        return getattr(transformers, name)
    except (ImportError, AttributeError) as exc:
        raise BuildSkip(f"transformers cannot import {name}: {first_line(exc)}") from None


def build_hf(
    model_type: str,
    task: str,
    shrinker: Callable[[dict[str, Any]], dict[str, Any]] = shrink,
) -> nn.Module:
    """The shrunk model in eval mode, weights from seed 0. Raises :class:`BuildSkip`."""
    modeling, configuration = auto_modules()
    config_cls = _class(configuration.CONFIG_MAPPING_NAMES, model_type)
    model_cls = _class(getattr(modeling, TASKS[task]), model_type)
    try:
        values = config_cls().to_dict()
        _state_rope_sections(values, model_cls, modeling)
        _native_backbones(values, configuration)
        config = config_cls.from_dict(shrinker(values))
    except Exception as exc:
        raise BuildSkip(f"its config cannot be shrunk: {first_line(exc)}") from None
    model = instantiate(model_cls, config, model_cls.__name__)
    built: nn.Module = model.eval()
    return built


#: A modeling file's own multimodal rotary sections, used when the config has none.
_ROPE_SECTIONS = re.compile(r"""get\(["']mrope_section["'](?:, (\[[\d, ]+\]))?\)""")


def _state_rope_sections(values: dict[str, Any], model_cls: Any, modeling: Any) -> None:
    """Write into the config the rotary sections its model falls back to when the config has
    none (Qwen2-VL's ``[16, 24, 24]``): they split half a head, so the shrink must see them to
    shrink them with the head. A sub-config's sections are its own model's (GLM-4.6V's text
    model is GLM-4V's)."""
    own = _code_rope_sections(model_cls)
    configs: list[tuple[dict[str, Any], list[int] | None]] = [(values, own)]
    for key, sub in values.items():
        if not (isinstance(sub, dict) and "model_type" in sub):
            continue
        sections = None
        if sub["model_type"] in modeling.MODEL_MAPPING_NAMES:
            with contextlib.suppress(BuildSkip):
                cls = _class(modeling.MODEL_MAPPING_NAMES, sub["model_type"])
                sections = _code_rope_sections(cls)
        elif key == "text_config":
            sections = own  # a text model without a class of its own: the model's code
        configs.append((sub, sections))
    for config, sections in configs:
        rope = config.get("rope_parameters")
        if sections is None or not isinstance(rope, dict) or not rope:
            continue
        if rope.get("mrope_section") is None:
            sections = sections or _thirds(config)
            if sections:
                config["rope_parameters"] = {**rope, "mrope_section": sections}


def _thirds(config: dict[str, Any]) -> list[int] | None:
    """Sections for a model whose code reads them with no default (HunYuan-VL): half its head
    in three, as Qwen2-VL splits it."""
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    head = config.get("head_dim") or (hidden // heads if hidden and heads else None)
    if not isinstance(head, int) or head < 6:
        return None
    third = head // 2 // 3
    return [head // 2 - 2 * third, third, third]


def _code_rope_sections(model_cls: Any) -> list[int] | None:
    module = sys.modules.get(getattr(model_cls, "__module__", ""))
    try:
        found = _ROPE_SECTIONS.search(inspect.getsource(module)) if module else None
    except (OSError, TypeError):
        return None
    if found is None:
        return None
    # [] when the code reads sections without a default: the config must give some.
    return list(ast.literal_eval(found.group(1))) if found.group(1) else []


#: The ``transformers`` architecture of a timm backbone, by the start of its timm name.
_NATIVE = {"resnet": "resnet", "swin": "swin", "convnext": "convnext"}


def _native_backbones(values: dict[str, Any], configuration: Any) -> None:
    """A timm backbone (DETR's ResNet-50) becomes the same backbone from ``transformers``
    when timm cannot be imported (it needs torchvision, which does not import beside every
    torch): the model is the same up to its backbone's implementation."""
    if importlib.util.find_spec("timm") is not None:
        return
    for key, sub in list(values.items()):
        if not (isinstance(sub, dict) and sub.get("model_type") == "timm_backbone"):
            continue
        name = str(sub.get("backbone") or "")
        native = next((t for prefix, t in _NATIVE.items() if name.startswith(prefix)), None)
        if native is None:
            continue
        values[key] = configuration.CONFIG_MAPPING[native]().to_dict()
        if "use_timm_backbone" in values:
            values["use_timm_backbone"] = False
