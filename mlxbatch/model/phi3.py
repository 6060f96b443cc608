"""Phi-3 and Phi-4-mini (`model_type: phi3`).

Against Qwen2: one fused `qkv_proj` (q, k, v rows stacked: num_attention_heads * head_dim,
then num_key_value_heads * head_dim twice) and one fused `gate_up_proj` (gate rows first,
then up), no biases anywhere; `rms_norm_eps` 1e-5. Rope: `rope_scaling.type: longrope`
(`short_factor`, `long_factor`, one per rotated pair, and `original_max_position_embeddings`)
in the 128k models, plain in the 4k ones; `partial_rotary_factor` (0.75 in Phi-4-mini) rotates
only that share of each head. Phi-3-mini-4k's `sliding_window` (2,047) applies to every layer.
With LongRoPE prompts run up to `original_max_position_embeddings` only: past it transformers
switches every position to the long factors, which no shared prefix cache could follow.
"""

from __future__ import annotations

from .family import Family

# transformers' Phi3Config defaults
DEFAULTS = {
    "num_key_value_heads": None,
    "head_dim": None,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096,
    "hidden_act": "silu",
    "sliding_window": None,
}
FAMILY = Family(
    "Phi-3 / Phi-4-mini",
    fused=True,
    rope_types=("default", "longrope"),
    sliding="all",
    partial_rotary=True,
    # the top-level key (4,096 when absent) overrides the rope parameters' own
    original_context_key="original_max_position_embeddings",
    gguf_arch="phi3",
    defaults=DEFAULTS,
    rope_aliases={"su": "longrope", "yarn": "longrope"},
)
