"""The sizes a ``transformers`` config is shrunk to, and the config keys that hold them.

2 layers, hidden size 64, 4 heads (2 key/value heads), FFN 128, vocabulary 128, 128 positions,
4 experts (2 per token), 32x32 images in 8x8 patches, 4 video frames, 32 audio positions.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AUDIO_POSITIONS",
    "CODEC_CHANNELS",
    "DEPTH_KEYS",
    "FRAMES",
    "HEAD_KEYS",
    "HIDDEN",
    "HIDDEN_KEYS",
    "IMAGE",
    "LAYER_KEYS",
    "SHRUNK",
    "SLIDING_WINDOW",
    "TOKEN_IDS",
    "VOCAB",
    "power_of_two",
    "remap_token_ids",
    "sizeish",
]

#: The shrunk sizes (one source: the docs quote this module's docstring).
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, POSITIONS = 2, 64, 4, 2, 128, 128, 128
EXPERTS, EXPERTS_PER_TOKEN, IMAGE, PATCH, AUDIO_POSITIONS, FRAMES = 4, 2, 32, 8, 32, 4
#: A sliding window narrower than the checks' sequences, so the sliding layers slide.
SLIDING_WINDOW = 8
#: The first channels of an audio codec's convolution stack.
CODEC_CHANNELS = 16
#: Depths: of a stack of layers, of an encoder or a decoder, of a vision tower's blocks.
DEPTH_KEYS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "depth",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
    "num_self_attends_per_block",  # Perceiver's latent transformer
)
SHRUNK = {
    **dict.fromkeys(DEPTH_KEYS, LAYERS),
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
    # Object queries of a DETR: a two-stage one picks its queries from the encoder's
    # positions, of which a 32x32 image has few.
    "num_queries": 16,
    "max_img_size": IMAGE,  # TVP's frames
    "d_latents": HIDDEN,  # Perceiver: its latents' width and count
    "num_latents": 32,
    # EfficientNet's compound scaling: the B0 network, which the per-stage lists describe.
    **dict.fromkeys(("depth_coefficient", "width_coefficient"), 1.0),
    # Audio codecs (SEANet, DAC, HiFi-GAN): the first stage's channels, which double per stage.
    "num_filters": CODEC_CHANNELS,
    **dict.fromkeys(("decoder_hidden_size", "upsample_initial_channel"), 64),
    # A vision tower's output, the width of the text model it feeds.
    "out_hidden_size": HIDDEN,
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), EXPERTS),
    **dict.fromkeys(
        ("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "moe_topk"),
        EXPERTS_PER_TOKEN,
    ),
    # Grouped routing picks groups of experts first: one group holds the 4 left.
    **dict.fromkeys(("n_group", "num_expert_group", "topk_group"), 1),
    # Dense layers before the first MoE one: with 2 layers, the second is MoE.
    "first_k_dense_replace": 1,
    "image_size": IMAGE,
    "num_frames": FRAMES,
    "patch_size": PATCH,
}
LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "depth")
TOKEN_IDS = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "sep_token_id",
)

HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd")
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")


def sizeish(key: str) -> bool:
    return any(part in key for part in ("dim", "size", "hidden", "width", "channels", "groups"))


def power_of_two(ratio: float) -> int:
    """The largest power of two not above ``ratio`` (1 for a ratio below 2)."""
    factor = 1
    while factor * 2 <= ratio:
        factor *= 2
    return factor


def remap_token_ids(out: dict[str, Any], vocab: Any) -> None:
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
        if (key in TOKEN_IDS or key.endswith(("_token_id", "_token_index")))
        and isinstance(value, int)
        and not isinstance(value, bool)
        and value >= vocab
    ]
    placeholders = sorted((k for k in keys if k not in TOKEN_IDS), key=lambda k: (out[k], k))
    for key in keys:
        if key in TOKEN_IDS:
            out[key] = vocab - 1  # pad/bos/eos may share an id: the last one is theirs
    for rank, key in enumerate(placeholders):
        out[key] = vocab - 1 - len(placeholders) + rank
    for value in out.values():
        if isinstance(value, dict) and "model_type" in value and "vocab_size" not in value:
            remap_token_ids(value, vocab)
