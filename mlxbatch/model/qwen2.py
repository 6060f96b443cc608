"""Qwen2 / Qwen2.5 (`model_type: qwen2`): the family every other one is described against.

Pre-norm decoder blocks: RMSNorm (`rms_norm_eps`) -> grouped-query attention (q/k/v
projections with biases, `o_proj` without; default rope, `rope_theta`) -> residual ->
RMSNorm -> SiLU-gated MLP (`gate_proj`, `up_proj`, `down_proj`, no biases) -> residual; a final
RMSNorm and the head (tied to the embedding when `tie_word_embeddings`). No rope scaling, and
no sliding window (`use_sliding_window: true` is refused).
"""

from __future__ import annotations

from .family import Family

# transformers' Qwen2Config defaults (see family.Family.defaults)
DEFAULTS = {
    "num_key_value_heads": 32,
    "head_dim": None,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
    "hidden_act": "silu",
}
FAMILY = Family("Qwen2 / Qwen2.5", qkv_bias=True, gguf_arch="qwen2", defaults=DEFAULTS)
