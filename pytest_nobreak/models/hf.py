"""``hf:<model_type>[:<task>]``: a ``transformers`` architecture, shrunk, with random weights.

No download: the model is built from its config class's defaults, shrunk by :func:`shrink`
(2 layers, hidden size 64, 4 heads (2 key/value heads), FFN 128, vocabulary 128, 128 positions,
4 experts (2 per token), 32x32 images in 8x8 patches, 4 video frames, 32 audio positions, at
most 2 stages of 1 block for staged vision models), in eval mode. Imported only when a
``--nobreak-model`` is given: it imports ``transformers`` and torch.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from pytest_nobreak.models.spec import SpecError

__all__ = [
    "HF_MAIN_INPUTS",
    "SHRINKS",
    "TASKS",
    "BuildSkip",
    "build_hf",
    "check_hf",
    "first_line",
    "hf_inputs",
    "hf_layouts",
    "hf_main_input",
    "hf_set",
    "shallow",
    "shrink",
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
#: The shrunk sizes (one source: the docs quote this module's docstring).
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, POSITIONS = 2, 64, 4, 2, 128, 128, 128
EXPERTS, EXPERTS_PER_TOKEN, IMAGE, PATCH, AUDIO_POSITIONS, FRAMES = 4, 2, 32, 8, 32, 4
_SET = {
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "num_layers",
            "n_layer",
            "n_layers",
            "encoder_layers",
            "decoder_layers",
            "num_encoder_layers",
            "num_decoder_layers",
        ),
        LAYERS,
    ),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim"), HIDDEN),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "n_heads",
            "num_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
        ),
        HEADS,
    ),
    "num_key_value_heads": KV_HEADS,
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "n_inner",
            "d_ff",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
        ),
        FFN,
    ),
    "vocab_size": VOCAB,
    **dict.fromkeys(("max_position_embeddings", "max_target_positions"), POSITIONS),
    # Whisper-like encoders take exactly 2x this many audio frames.
    "max_source_positions": AUDIO_POSITIONS,
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), EXPERTS),
    "num_experts_per_tok": EXPERTS_PER_TOKEN,
    # Grouped routing picks groups of experts first: one group holds the 4 left.
    **dict.fromkeys(("n_group", "num_expert_group", "topk_group"), 1),
    # Dense layers before the first MoE one: with 2 layers, the second is MoE.
    "first_k_dense_replace": 1,
    "image_size": IMAGE,
    "num_frames": FRAMES,
    "patch_size": PATCH,
}
_LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
_TOKEN_IDS = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "sep_token_id",
)
#: A model still bigger than this after shrinking is skipped (its config defies the rules):
#: building and compiling it would take most of the per-model time limit.
MAX_PARAMS = 20_000_000


class BuildSkip(Exception):
    """This architecture cannot be built offline, or its inputs inferred: the check is skipped
    with this reason."""


def _auto() -> Any:
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
    modeling, configuration = _auto()
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
    modeling, _ = _auto()
    specs = set()
    for task in SET_TASKS[name]:
        for model_type in getattr(modeling, TASKS[task]):
            specs.add(f"hf:{model_type}" + (f":{task}" if task else ""))
    return sorted(specs)


def _version() -> str:
    # Lazy: transformers is an optional extra: imported when an hf: model is built.
    import transformers

    return str(transformers.__version__)


def shrink(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict (``to_dict()``) shrunk by the rules in the module docstring, recursively
    into sub-configs (``text_config``, ``vision_config``, ``encoder``, ...).

    Sizes tied to a shrunk one follow it: an int equal to the old hidden size (``codebook_dim``,
    ``embedding_size``) becomes the new one, a list with one entry per layer (``layer_types``)
    or per stage keeps its first entries, a dict keyed by layer index its first layers.
    """
    out = dict(values)
    staged = isinstance(values.get("depths"), list) and len(values["depths"]) > 2
    for key, value in values.items():
        if staged and key in ("embed_dim", "hidden_size"):
            continue  # per-stage head counts must keep dividing the stage widths
        if isinstance(value, dict) and "model_type" in value:
            out[key] = shrink(value)
        elif key in _SET and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, _SET[key]) if key != "num_key_value_heads" else KV_HEADS
    if values.get("num_key_value_heads") == values.get("num_attention_heads") is not None:
        out["num_key_value_heads"] = out["num_attention_heads"]  # no grouped queries: none made
    head_dim = values.get("head_dim")
    if isinstance(head_dim, int):
        hidden, heads = out.get("hidden_size", HIDDEN), out.get("num_attention_heads", HEADS)
        out["head_dim"] = max(hidden // max(heads, 1), 1)
    _follow(values, out)
    _scale_head_dims(values, out)
    if isinstance(head_dim, int) and head_dim == values.get("qk_rope_head_dim"):
        out["head_dim"] = out["qk_rope_head_dim"]  # latent attention's head_dim is its rope part
    if isinstance(values.get("image_size"), int) and isinstance(values.get("window_size"), int):
        # A window wider than the shrunk patch grid pads every stage to it; 2 divides them all.
        out["window_size"] = min(values["window_size"], 2)
    depths = values.get("depths") or []
    if staged:
        # Staged models (Swin, ConvNeXt, ResNet): keep 2 stages of 1 block; every per-stage
        # list of the same length keeps its first two entries so the stages stay consistent.
        for key, value in values.items():
            if isinstance(value, list) and len(value) == len(depths):
                out[key] = value[:2]
        out["depths"] = [1, 1]
        if "num_stages" in out:
            out["num_stages"] = 2
    for key in ("out_features", "out_indices", "stage_names"):
        out.pop(key, None)  # a backbone's outputs, derived from its stages: recomputed
    embed = values.get("embed_dim")
    # A staged model's width doubles per stage: its final width follows the kept stages.
    if (
        staged
        and isinstance(embed, int)
        and values.get("hidden_size") == embed * 2 ** (len(depths) - 1)
    ):
        out["hidden_size"] = values["embed_dim"] * 2 ** (len(out["depths"]) - 1)
    _remap_token_ids(out, out.get("vocab_size"))
    return out


def _remap_token_ids(out: dict[str, Any], vocab: Any) -> None:
    """Token ids beyond the shrunk vocabulary (special, image and audio placeholder tokens)
    move to its top, each to an id of its own and in their old order, so a model that splices
    features in at its placeholders still finds each one."""
    text = out.get("text_config")
    if not isinstance(vocab, int) and isinstance(text, dict):
        vocab = text.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 8:
        return
    keys = [
        key
        for key, value in out.items()
        if (key in _TOKEN_IDS or key.endswith(("_token_id", "_token_index")))
        and isinstance(value, int)
        and not isinstance(value, bool)
        and value >= vocab
    ]
    placeholders = sorted((k for k in keys if k not in _TOKEN_IDS), key=lambda k: (out[k], k))
    for key in keys:
        if key in _TOKEN_IDS:
            out[key] = vocab - 1  # pad/bos/eos may share an id: the last one is theirs
    for rank, key in enumerate(placeholders):
        out[key] = vocab - 1 - len(placeholders) + rank
    for value in out.values():
        if isinstance(value, dict) and "model_type" in value and "vocab_size" not in value:
            _remap_token_ids(value, vocab)


#: Per-head sizes of attention variants (latent attention's rope/nope/value parts, a
#: partial rotary embedding's width).
_HEAD_DIM_SUFFIXES = ("head_dim", "rotary_dim")
_HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
#: Low-rank projections, sized against the hidden size.
_RANK_SUFFIX = "_rank"


def _scale_head_dims(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Per-head sizes (``qk_rope_head_dim``, ``v_head_dim``, ...) shrink by the factor the head
    dimension did, and low-rank sizes (``kv_lora_rank``) by the hidden size's, each a power of
    two so their sums and splits stay whole."""
    hidden_key = next((k for k in _HIDDEN_KEYS if isinstance(values.get(k), int)), "")
    heads_key = next((k for k in _HEAD_KEYS if isinstance(values.get(k), int)), "")
    got = (values.get(hidden_key), out.get(hidden_key), values.get(heads_key), out.get(heads_key))
    sizes = [v for v in got if isinstance(v, int) and v > 0]
    if len(sizes) < len(got):
        return
    old_hidden, new_hidden, old_heads, new_heads = sizes
    old_head = values.get("head_dim") or old_hidden // old_heads
    new_head = out.get("head_dim") or new_hidden // new_heads
    head_factor = _power_of_two(old_head / max(new_head, 1))
    hidden_factor = _power_of_two(old_hidden / new_hidden)
    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or key == "head_dim":
            continue
        if key.endswith(_HEAD_DIM_SUFFIXES) and head_factor > 1:
            out[key] = max(value // head_factor, 2)
        elif key.endswith(_RANK_SUFFIX) and value >= 16 and hidden_factor > 1:
            out[key] = max(value // hidden_factor, 16)


def _power_of_two(ratio: float) -> int:
    """The largest power of two not above ``ratio`` (1 for a ratio below 2)."""
    factor = 1
    while factor * 2 <= ratio:
        factor *= 2
    return factor


def _follow(values: dict[str, Any], out: dict[str, Any]) -> None:
    """Make the sizes tied to a shrunk one follow it (see :func:`shrink`)."""
    for hidden_key in _HIDDEN_KEYS:
        old, new = values.get(hidden_key), out.get(hidden_key)
        if isinstance(old, int) and isinstance(new, int) and new != old:
            break
    else:
        old = new = None
    layers_key = next((k for k in _LAYER_KEYS if isinstance(values.get(k), int)), None)
    old_layers = values.get(layers_key) if layers_key else None
    new_layers = out.get(layers_key) if layers_key else None
    for key, value in values.items():
        if key in _SET or isinstance(value, bool):
            continue
        if old is not None and isinstance(value, int) and value == old and _sizeish(key):
            out[key] = new
        elif old_layers and isinstance(value, list) and len(value) == old_layers > 2:
            out[key] = value[:new_layers]
        elif (
            old_layers
            and isinstance(value, dict)
            and value
            and all(isinstance(k, (int, str)) and str(k).isdigit() for k in value)
        ):
            out[key] = {k: v for k, v in value.items() if int(k) < int(new_layers or LAYERS)}


def _sizeish(key: str) -> bool:
    return any(part in key for part in ("dim", "size", "hidden", "width", "channels", "groups"))


def _class(names: Mapping[str, Any], model_type: str) -> Any:
    # Lazy: transformers is an optional extra: imported when an hf: model is built.
    import transformers

    name = names[model_type]
    name = name[0] if isinstance(name, (list, tuple)) else name
    try:
        return getattr(transformers, name)
    except (ImportError, AttributeError) as exc:
        raise BuildSkip(f"transformers cannot import {name}: {first_line(exc)}") from None


def shallow(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict with only its depth, vocabulary and expert counts shrunk (widths kept):
    the fallback for a config whose widths :func:`shrink` cannot narrow consistently. Lists and
    dicts with one entry per layer keep their first layers; staged models keep every stage, of
    one block each."""
    out = dict(values)
    for key, value in values.items():
        if isinstance(value, dict) and "model_type" in value:
            out[key] = shallow(value)
        elif key in _SHALLOW and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, _SET[key])
    layers_key = next((k for k in _LAYER_KEYS if isinstance(values.get(k), int)), None)
    if layers_key:
        old, new = values[layers_key], out[layers_key]
        for key, value in values.items():
            if key in _SHALLOW or isinstance(value, bool):
                continue
            if isinstance(value, list) and len(value) == old > 2:
                out[key] = value[:new]
            elif isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
                out[key] = {k: v for k, v in value.items() if int(k) < new}
    if isinstance(values.get("depths"), list):
        out["depths"] = [1] * len(values["depths"])
    _remap_token_ids(out, out.get("vocab_size"))
    return out


#: How :func:`build_hf` shrinks a config, in the order tried: narrow, then shallow.
SHRINKS: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = (shrink, shallow)
_SHALLOW = {
    key
    for key, value in _SET.items()
    if value == LAYERS or key in ("vocab_size", "num_experts_per_tok") or "expert" in key
}


def build_hf(
    model_type: str,
    task: str,
    shrinker: Callable[[dict[str, Any]], dict[str, Any]] = shrink,
) -> nn.Module:
    """The shrunk model in eval mode, weights from seed 0. Raises :class:`BuildSkip`."""
    modeling, configuration = _auto()
    config_cls = _class(configuration.CONFIG_MAPPING_NAMES, model_type)
    model_cls = _class(getattr(modeling, TASKS[task]), model_type)
    try:
        config = config_cls.from_dict(shrinker(config_cls().to_dict()))
    except Exception as exc:
        raise BuildSkip(f"its config cannot be shrunk: {first_line(exc)}") from None
    try:
        with torch.device("meta"):  # count the parameters before allocating them
            params = sum(p.numel() for p in model_cls(config).parameters())
        if params > MAX_PARAMS:
            raise BuildSkip(
                f"still {params / 1e6:.0f}M parameters after shrinking (limit "
                f"{MAX_PARAMS / 1e6:.0f}M)"
            )
        torch.manual_seed(0)
        model = model_cls(config)
    except BuildSkip:
        raise
    except Exception as exc:
        raise BuildSkip(f"{model_cls.__name__} cannot be built: {first_line(exc)}") from None
    built: nn.Module = model.eval()
    return built


def first_line(exc: BaseException) -> str:
    """``Type: message``, on one line (a header line ending in ``:`` keeps the next one)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:  # a header ("Class validation error ...:")
        text = f"{text} {lines[1]}"
    return f"{type(exc).__name__}: {text[:240]}"


def _sub(config: Any, attr: str, default: Any) -> Any:
    """``config.attr``, else that of its text/vision/audio/encoder sub-config."""
    value = getattr(config, attr, None)
    if value is not None:
        return value
    for sub in ("text_config", "vision_config", "audio_config", "encoder_config", "encoder"):
        value = getattr(getattr(config, sub, None), attr, None)
        if value is not None:
            return value
    return default


def hf_inputs(model: nn.Module, batch: int, seq: int, layout: int = 0) -> dict[str, Any]:
    """Inputs for ``model(**inputs)`` inferred from its main input and config: token ids (and
    an attention mask), pixel values (images or video frames), audio features or waveforms,
    time series, and decoder token ids for an encoder-decoder. ``layout`` picks one of the
    :func:`hf_layouts` ways to shape the main input. Raises :class:`BuildSkip` for a main
    input it cannot make."""
    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    params = inspect.signature(model.forward).parameters
    make = _MAKERS.get(main) if isinstance(main, str) else None  # some name a list
    if make is None:
        first = main if isinstance(main, str) else main[0]
        raise BuildSkip(
            f"cannot infer its main input {main!r}; give --nobreak-model-inputs (e.g. {first}=2x16)"
        )
    inputs: dict[str, Any] = {main: make(config, batch, seq)[layout]}
    if main == "input_ids" and "attention_mask" in params:
        inputs["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
    if main == "input_ids" and "pixel_values" in params and not _has_image_tokens(config):
        # A dual encoder (CLIP-like) takes an image beside the text; a model that splices
        # image features into the text at placeholder tokens is checked on text alone.
        inputs["pixel_values"] = _pixels(config, batch, seq)[0]
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        inputs["decoder_input_ids"] = _ids(config, batch, seq)[0]
    if "use_cache" in params:
        inputs["use_cache"] = False  # one forward pass, not a KV cache being filled
    return inputs


def hf_layouts(model: nn.Module) -> int:
    """How many ways :func:`hf_inputs` has to shape the model's main input (a waveform with or
    without its channel axis, features as mel bins by frames or frames by mel bins, ...): the
    build takes the first one its eager forward accepts."""
    main = getattr(model, "main_input_name", "input_ids")
    make = _MAKERS.get(main) if isinstance(main, str) else None
    return len(make(model.config, 1, 1)) if make else 1


def hf_main_input(model_type: str, task: str) -> str:
    """The name of the main input of the model class (``input_ids``, ``pixel_values``, ...),
    without building it. Raises :class:`BuildSkip` when the class cannot be imported."""
    modeling, _ = _auto()
    return str(getattr(_class(getattr(modeling, TASKS[task]), model_type), "main_input_name", ""))


def _has_image_tokens(config: Any) -> bool:
    return any(
        getattr(config, key, None) is not None for key in ("image_token_id", "image_token_index")
    )


def _ids(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    vocab = int(_sub(config, "vocab_size", VOCAB))
    # Low ids only: special tokens (image, audio placeholders) sit at the top of a vocabulary.
    return [torch.randint(1, max(vocab // 2, 2), (batch, seq))]


def _pixels(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    size = _sub(config, "image_size", IMAGE)
    h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]
    channels = int(_sub(config, "num_channels", 3))
    image = torch.randn(batch, channels, int(h), int(w))
    frames = _sub(config, "num_frames", None)
    if not isinstance(frames, int):
        return [image]
    # A video model: frames (shrunk to FRAMES) of that image, frame axis second.
    video = torch.randn(batch, frames, channels, int(h), int(w))
    return [image, video, video.transpose(1, 2)]


def _videos(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    return _pixels(config, batch, seq)[1:] or [
        torch.randn(batch, FRAMES, int(_sub(config, "num_channels", 3)), IMAGE, IMAGE)
    ]


def _features(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    mels = _sub(config, "num_mel_bins", None)
    if mels is not None:
        # Whisper-like: the encoder checks frames == 2 * max_source_positions; conformers
        # (Parakeet, Canary) take frames by mel bins.
        frames = 2 * int(_sub(config, "max_source_positions", seq))
        return [torch.randn(batch, int(mels), frames), torch.randn(batch, 4 * seq, int(mels))]
    per_channel = int(_sub(config, "input_feat_per_channel", _sub(config, "feature_size", 80)))
    channels = int(_sub(config, "input_channels", 1))
    return [torch.randn(batch, 4 * seq, per_channel * channels)]


def _values(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    # A waveform: wav2vec2-style feature encoders downsample by 320; codecs (EnCodec, Mimi)
    # take a channel axis.
    wave = torch.randn(batch, 320 * seq)
    channels = int(_sub(config, "audio_channels", 1))
    return [wave, torch.randn(batch, channels, 320 * seq)]


def _series(config: Any, batch: int, seq: int) -> list[torch.Tensor]:
    # A time series' past: its context length of steps, one value per input channel.
    length = int(_sub(config, "context_length", 4 * seq))
    channels = int(_sub(config, "num_input_channels", 1))
    return [torch.randn(batch, length, channels), torch.randn(batch, length)]


#: The main inputs :func:`hf_inputs` can make.
_MAKERS: dict[str, Callable[[Any, int, int], list[torch.Tensor]]] = {
    "input_ids": _ids,
    "pixel_values": _pixels,
    "pixel_values_videos": _videos,
    "input_features": _features,
    "input_values": _values,
    "past_values": _series,
}
HF_MAIN_INPUTS = tuple(_MAKERS)
