"""Published shapes of every supported family (their `config.json`), for `init-random`
synthetic models, which always get the real Qwen tokenizer."""

from __future__ import annotations

_BASE = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "use_sliding_window": False,
    "vocab_size": 151936,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}


def _shape(hidden, inter, layers, heads, kv, **extra) -> dict:
    return _BASE | {"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
                    "num_attention_heads": heads, "num_key_value_heads": kv} | extra  # fmt: skip


_7B = {"tie_word_embeddings": False, "vocab_size": 152064}
PRESETS = {
    "qwen2.5-0.5b": _shape(896, 4864, 24, 14, 2, sliding_window=32768),
    "qwen2.5-1.5b": _shape(1536, 8960, 28, 12, 2, sliding_window=32768),
    "qwen2.5-3b": _shape(2048, 11008, 36, 16, 2, sliding_window=32768),
    "qwen2.5-7b": _shape(3584, 18944, 28, 28, 4, sliding_window=131072, **_7B),
    "qwen2-0.5b": _shape(896, 4864, 24, 14, 2, max_position_embeddings=131072),
    "qwen2-1.5b": _shape(1536, 8960, 28, 12, 2, max_position_embeddings=131072),
    "qwen2-7b": _shape(3584, 18944, 28, 28, 4, max_position_embeddings=131072, **_7B),
    "tiny": _shape(64, 160, 2, 4, 2),
}

# Qwen/Qwen3-0.6B
PRESETS["qwen3-0.6b"] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "head_dim": 128,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
# meta-llama/Llama-3.2-1B-Instruct
PRESETS["llama-3.2-1b"] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "head_dim": 64,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": True,
    "vocab_size": 128256,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}
# google/gemma-3-1b-it
PRESETS["gemma-3-1b"] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "attention_bias": False,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "max_position_embeddings": 32768,
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "tie_word_embeddings": True,
    "vocab_size": 262144,
    "bos_token_id": 2,
    "eos_token_id": [1, 106],
    "pad_token_id": 0,
}
# microsoft/Phi-4-mini-instruct
PRESETS["phi-4-mini"] = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "attention_bias": False,
    "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192,
    "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "partial_rotary_factor": 0.75, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [
        1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817,
        2.187582649, 2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687,
        4.279200023, 4.785517845, 5.351743533, 5.984965424, 6.693110555, 7.485043894,
        8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
        16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03,
        32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28,
        33.49, 33.5, 44.16, 47.77]},
    "sliding_window": 262144, "tie_word_embeddings": True, "vocab_size": 200064,
    "bos_token_id": 199999, "eos_token_id": 199999, "pad_token_id": 199999,
}  # fmt: skip
