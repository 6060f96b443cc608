"""The published shapes of the Qwen2 / Qwen2.5 family, for `init-random` synthetic models.

Each preset is the model's `config.json` as published on the Hugging Face hub (the keys the
forward reads, plus the ids). The small sizes tie the output head to the embeddings; 7B has
its own head and a larger vocabulary, as its config says. `tiny` is for tests.
"""

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
