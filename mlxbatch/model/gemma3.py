"""Gemma 3 text decoders (`model_type: gemma3_text`: gemma-3-1b, and the 4B+ language models,
which vision_language.py takes out of their `gemma3` checkpoints).

Against Qwen2:
- the embedding output is multiplied by sqrt(`hidden_size`), that factor first rounded to the
  weights' dtype (as transformers' `Gemma3TextScaledWordEmbedding` does);
- every RMSNorm scales by (1 + w) (weights stored around 0), in float32;
- four norms a block: `input_layernorm` -> attention -> `post_attention_layernorm` ->
  residual, then `pre_feedforward_layernorm` -> MLP -> `post_feedforward_layernorm` -> residual;
- q/k RMSNorms per head before rope (`q_norm`, `k_norm`), no biases (`attention_bias`);
- attention scores scaled by `query_pre_attn_scalar`**-0.5, not head_dim**-0.5;
- the MLP's gate is GELU with the tanh approximation (`hidden_activation: gelu_pytorch_tanh`);
- interleaved layers: `layer_types` ("sliding_attention" / "full_attention"), or without it
  `sliding_window_pattern` (every pattern-th layer global); a sliding layer sees only the
  last `sliding_window` keys (512 in 1B) and rotates with `rope_local_base_freq` (10,000),
  a global layer with `rope_theta` (1,000,000) and `rope_scaling` (linear, factor 8, in 4B+);
- the head is tied; `attn_logit_softcapping` / `final_logit_softcapping` must be null.
The sliding mask is derived from the row layout's (decoder.sliding_mask): nothing else changes.
"""

from __future__ import annotations

from .family import Family

# transformers' Gemma3TextConfig defaults; the 4B+ configs' text_config omits the heads and
# the vocabulary (vision_language.py)
DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10000.0,
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
    "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
}
FAMILY = Family(
    "Gemma 3",
    qk_norm=True,
    norm_offset=True,
    sandwich=True,
    embed_scale=True,
    activations=("gelu_pytorch_tanh",),
    activation_key="hidden_activation",
    rope_types=("default", "linear"),
    sliding="pattern",
    local_rope_key="rope_local_base_freq",
    attention_scalar_key="query_pre_attn_scalar",
    bias_switches=("attention_bias",),
    vision_language_type="gemma3",
    gguf_arch="gemma3",
    defaults=DEFAULTS,
)
