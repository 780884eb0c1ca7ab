"""The family of a ``--nobreak-model`` model (LLM, encoder, vision, audio, multimodal,
diffusion), for the zoo's counts per family.

An ``hf:`` architecture's family is read from the task mappings of ``transformers`` that name
it (no model class is imported), then from its sub-configs and its name; a ``diffusers:`` one
is a diffusion model; a factory has none. The JSON report records the family of each model of
a run (``families``), so the zoo page written from it does not depend on the ``transformers``
installed where the page is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_nobreak.models.items import PLUGIN_NAME, ModelPlugin
from pytest_nobreak.models.spec import ModelSpec

if TYPE_CHECKING:
    import pytest

__all__ = ["FAMILIES", "family_of", "model_families"]

#: The families, in the order the zoo lists them.
FAMILIES = ("LLM", "encoder", "vision", "audio", "multimodal", "diffusion", "other")

#: Task mappings (``MODEL_FOR_<TASK>_MAPPING_NAMES``) by family, tried in this order: a model
#: with an image-and-text task is multimodal even if it also generates text.
_TASKS = {
    "multimodal": (
        "MULTIMODAL_LM",
        "IMAGE_TEXT_TO_TEXT",
        "VISION_2_SEQ",
        "VISUAL_QUESTION_ANSWERING",
        "DOCUMENT_QUESTION_ANSWERING",
        "ZERO_SHOT_IMAGE_CLASSIFICATION",
        "ZERO_SHOT_OBJECT_DETECTION",
        "RETRIEVAL",
    ),
    "audio": (
        "AUDIO_CLASSIFICATION",
        "AUDIO_FRAME_CLASSIFICATION",
        "AUDIO_XVECTOR",
        "CTC",
        "SPEECH_SEQ_2_SEQ",
        "TEXT_TO_WAVEFORM",
        "TEXT_TO_SPECTROGRAM",
        "RNNT",
        "TDT",
    ),
    "vision": (
        "IMAGE_CLASSIFICATION",
        "OBJECT_DETECTION",
        "SEMANTIC_SEGMENTATION",
        "INSTANCE_SEGMENTATION",
        "UNIVERSAL_SEGMENTATION",
        "IMAGE_SEGMENTATION",
        "DEPTH_ESTIMATION",
        "BACKBONE",
        "VIDEO_CLASSIFICATION",
        "MASK_GENERATION",
        "KEYPOINT_DETECTION",
        "KEYPOINT_MATCHING",
        "MASKED_IMAGE_MODELING",
        "POSE_ESTIMATION",
        "NORMAL_ESTIMATION",
        "POINTMAP_ESTIMATION",
        "IMAGE_MATTING",
        "IMAGE_TO_IMAGE",
        "TEXT_RECOGNITION",
        "TABLE_RECOGNITION",
    ),
    # BERT also has a causal-LM head, and Llama a sequence-classification one: a masked-LM,
    # encoder-decoder or text-encoding model is an encoder first; a causal LM is an LLM before
    # the heads any text model may have.
    "encoder": ("MASKED_LM", "SEQ_TO_SEQ_CAUSAL_LM", "TEXT_ENCODING", "NEXT_SENTENCE_PREDICTION"),
    "LLM": ("CAUSAL_LM",),
}
#: Heads of a text model that neither generates nor fills in text: an encoder's.
_ENCODER_HEADS = (
    "SEQUENCE_CLASSIFICATION",
    "TOKEN_CLASSIFICATION",
    "QUESTION_ANSWERING",
    "MULTIPLE_CHOICE",
)
#: Fields of a default config that say what its model takes: audio (a sampling rate, mel
#: bins), images, a time series.
_FIELDS = (
    (("sampling_rate", "num_mel_bins", "audio_channels", "upsampling_ratios"), "audio"),
    (("image_size", "patch_size", "num_channels"), "vision"),
    (("prediction_length", "context_length"), "other"),
)
#: The family of a sub-model by the end of its model type (``qwen2_vl_vision``,
#: ``gemma3n_audio``, ``glm4v_text``), then by the sub-configs a model holds.
_SUFFIXES = (
    (("_vision", "_vision_model", "_vision_encoder", "_image"), "vision"),
    (("_audio", "_audio_encoder", "_speech", "asr_encoder", "speech5_encoder"), "audio"),
    (("_text", "_text_model", "_lm"), "LLM"),
)


def model_families(config: pytest.Config) -> dict[str, str]:
    """The family of each model this run checks, by SPEC (empty without models), for the JSON
    report's ``families`` section, which the zoo page counts by."""
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if not isinstance(plugin, ModelPlugin):
        return {}
    families = {spec.text: family_of(spec) for spec in plugin.specs}
    return {spec: family for spec, family in families.items() if family is not None}


def family_of(spec: ModelSpec) -> str | None:
    """The family of the model ``spec`` names; None for a factory (its code is the user's)."""
    if spec.kind == "diffusers":
        return "diffusion"
    if spec.kind == "hf":
        return _hf_family(spec.target)
    return None


def _hf_family(model_type: str) -> str:
    # Lazy: transformers is an optional extra; this reads its auto mappings (names only).
    from pytest_nobreak.models.hf.architectures import auto_modules

    modeling, configuration = auto_modules()
    for family, tasks in (*_TASKS.items(), ("encoder", _ENCODER_HEADS)):
        for task in tasks:
            if model_type in getattr(modeling, f"MODEL_FOR_{task}_MAPPING_NAMES", {}):
                return family
    for suffixes, family in _SUFFIXES:
        if model_type.endswith(suffixes):
            return family
    subs = _sub_configs(configuration, model_type)
    if "vision_config" in subs and ("text_config" in subs or "audio_config" in subs):
        return "multimodal"
    if "audio_config" in subs:
        return "audio"
    if "vision_config" in subs or "backbone_config" in subs:
        return "vision"
    if "text_config" in subs:
        return "LLM"
    fields = _default_fields(configuration, model_type)
    for names, family in _FIELDS:
        if fields.intersection(names):
            return family
    return "other"


def _config_class(configuration: Any, model_type: str) -> Any:
    try:
        return configuration.CONFIG_MAPPING[model_type]
    except (KeyError, ImportError, AttributeError):
        return None


def _sub_configs(configuration: Any, model_type: str) -> set[str]:
    """The sub-configs the config class declares (``sub_configs``), without building it."""
    cls = _config_class(configuration, model_type)
    return set(getattr(cls, "sub_configs", None) or ())


def _default_fields(configuration: Any, model_type: str) -> set[str]:
    """The fields of the default config (a config is light: no weights)."""
    cls = _config_class(configuration, model_type)
    try:
        return set(cls().to_dict()) if cls is not None else set()
    except Exception:  # a config whose defaults do not validate says nothing
        return set()
