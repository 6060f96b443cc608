"""Llama 2 / 3.x, SmolLM2 and Mistral-style checkpoints (`model_type: llama` or `mistral`).

Against Qwen2: no biases by default; in a Llama, `attention_bias: true` biases q, k, v *and*
o, `mlp_bias: true` the MLP (Mistral reads neither). `head_dim` may be explicit. Rope:
`rope_theta` (500,000 for Llama 3) with `rope_scaling.rope_type: llama3` (`factor`,
`low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`; Llama 3.1 / 3.2),
or `linear`. Llama 3.2 1B/3B tie the head (`tie_word_embeddings`), 3.1 8B does not.
Mistral's `sliding_window` restricts every layer to its last keys; null is plain causal
attention, and an absent one transformers' default, 4,096.
"""

from __future__ import annotations

from .family import Family

# transformers' LlamaConfig and MistralConfig defaults (see family.Family.defaults); Mistral's
# layers slide over 4,096 keys unless told
DEFAULTS = {
    "num_key_value_heads": None,
    "head_dim": None,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
    "hidden_act": "silu",
}
MISTRAL_DEFAULTS = {
    "num_key_value_heads": 8,
    "head_dim": None,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "hidden_act": "silu",
    "sliding_window": 4096,
}
FAMILY = Family(
    "Llama / Mistral",
    rope_types=("default", "linear", "llama3"),
    bias_switches=("attention_bias", "mlp_bias"),
    gguf_arch="llama",
    gguf_permuted_qk=True,
    defaults=DEFAULTS,
)
# Mistral's transformers class reads no bias switch: its layers have none
MISTRAL = Family("Mistral", rope_types=("default",), sliding="all", defaults=MISTRAL_DEFAULTS)
