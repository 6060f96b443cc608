"""Qwen3 dense (`model_type: qwen3`).

Against Qwen2: no q/k/v biases (`attention_bias` biases q, k, v and o when true); an RMSNorm
over each head of q and of k (`q_norm`, `k_norm`) before rope; `head_dim` is explicit (128,
so q_proj is not hidden x hidden). `use_sliding_window: true` is refused as for Qwen2.
"""

from __future__ import annotations

from .family import Family

# transformers' Qwen3Config defaults (see family.Family.defaults)
DEFAULTS = {
    "num_key_value_heads": 32,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
    "hidden_act": "silu",
}
FAMILY = Family(
    "Qwen3", qk_norm=True, bias_switches=("attention_bias",), gguf_arch="qwen3", defaults=DEFAULTS
)
