"""A GGUF's metadata as a Hugging Face `config.json`, and its tensor names as Hugging Face's.

llama.cpp's converter writes `{arch}.embedding_length`, `{arch}.block_count`, ... and renames
`model.layers.N.self_attn.q_proj.weight` to `blk.N.attn_q.weight`; this undoes both for the
architectures mlxbatch runs. What its converter changed in the values is undone in
gguf_convert.py (Llama's rotary row order, Gemma's norms stored as 1 + w).
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..errors import ModelError
from .families import FAMILIES
from .family import Family

# GGUF architecture -> config.json model_type (`Family.gguf_arch`)
MODEL_TYPES = {f.gguf_arch: t for t, f in FAMILIES.items() if f.gguf_arch}

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# the names a block feature changes: Gemma 3's four norms a block (`Family.sandwich`), and
# Phi-3's `ffn_up`, the fused gate_up_proj (`Family.fused`)
SANDWICH_NAMES = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
FUSED_NAMES = {"ffn_up": "mlp.gate_up_proj"}
# tensors the converter derives from the config: read into it, not loaded as weights
CONFIG_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
BLOCK = re.compile(r"^blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias)$")


def hf_name(arch: str, name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None for one mlxbatch does not know."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    m = BLOCK.match(name)
    if not m:
        return None
    layer, part, kind = m.groups()
    part = block_names(family(arch)).get(part)
    return f"model.layers.{layer}.{part}.{kind}" if part else None


def family(arch: str) -> Family:
    """The record of the family a GGUF architecture holds."""
    return FAMILIES[MODEL_TYPES[arch]]


def block_names(family: Family) -> dict[str, str]:
    """llama.cpp's block tensor names -> Hugging Face's, for the family's block features."""
    names = dict(BLOCK_NAMES)
    if family.sandwich:
        names |= SANDWICH_NAMES
    if family.fused:
        names |= FUSED_NAMES
    return names


def architecture(meta: dict, source: str) -> str:
    arch = meta.get("general.architecture")
    if arch not in MODEL_TYPES:
        raise ModelError(
            f"{source}: GGUF architecture {arch!r} is not supported (mlxbatch runs "
            f"{', '.join(MODEL_TYPES)})"
        )
    return arch


def _key(meta: dict, arch: str, name: str, source: str, default=None):
    """The architecture's metadata value `name`; refused, naming it, where absent."""
    v = meta.get(f"{arch}.{name}", default)
    if v is None:
        raise ModelError(f"{source}: the GGUF metadata has no {arch}.{name}")
    return v


def config(meta: dict, tensors: dict, factors: dict[str, np.ndarray], source: str) -> dict:
    """config.json for the file: `tensors` maps GGUF names to numpy shapes; `factors` holds
    the rope tensors (CONFIG_TENSORS) the file has."""
    arch = architecture(meta, source)
    cfg = _common_config(meta, tensors, arch, source)
    if arch in ARCH_CONFIG:
        cfg |= ARCH_CONFIG[arch](meta, tensors, factors, cfg, source)
    return {k: v for k, v in cfg.items() if v is not None}


def _common_config(meta: dict, tensors: dict, arch: str, source: str) -> dict:
    """The keys every architecture's metadata spells alike."""
    heads = int(_key(meta, arch, "attention.head_count", source))
    hidden = int(_key(meta, arch, "embedding_length", source))
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
    cfg = {
        "model_type": MODEL_TYPES[arch],
        "hidden_size": hidden,
        "num_hidden_layers": int(_key(meta, arch, "block_count", source)),
        "intermediate_size": int(_key(meta, arch, "feed_forward_length", source)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_key(meta, arch, "attention.head_count_kv", source, heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(_key(meta, arch, "attention.layer_norm_rms_epsilon", source)),
        "max_position_embeddings": int(_key(meta, arch, "context_length", source)),
        "vocab_size": tensors["token_embd.weight"][0] if "token_embd.weight" in tensors else 0,
        # llama.cpp writes the output projection only when it is not the embedding matrix
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    if f"{arch}.rope.freq_base" in meta:
        cfg["rope_theta"] = float(meta[f"{arch}.rope.freq_base"])
    return cfg


def _llama_config(meta: dict, tensors: dict, factors: dict, cfg: dict, source: str) -> dict:
    """Biases as the tensors show them; Llama 3's rope scaling from its per-pair factors."""
    out = {
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
    }
    if "rope_freqs.weight" in factors:
        out["rope_scaling"] = llama3_scaling(factors["rope_freqs.weight"], cfg, source)
    return out


def _gemma3_config(meta: dict, tensors: dict, factors: dict, cfg: dict, source: str) -> dict:
    """What llama.cpp's Gemma 3 metadata leaves out, as its own runtime assumes it."""
    out = {
        "query_pre_attn_scalar": cfg["head_dim"],
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": int(_key(meta, "gemma3", "attention.sliding_window", source, 4096)),
        "sliding_window_pattern": 6,
        "rope_local_base_freq": 10000.0,
    }
    if meta.get("gemma3.rope.scaling.type") == "linear":
        out["rope_scaling"] = {
            "rope_type": "linear",
            "factor": float(meta["gemma3.rope.scaling.factor"]),
        }
    return out


def _phi3_config(meta: dict, tensors: dict, factors: dict, cfg: dict, source: str) -> dict:
    """The rotated share of each head, the window, and LongRoPE's factors where stored."""
    head_dim = cfg["head_dim"]
    dims = int(meta.get("phi3.rope.dimension_count") or head_dim)
    out = {
        "partial_rotary_factor": dims / head_dim,
        "sliding_window": meta.get("phi3.attention.sliding_window") or None,
    }
    if "rope_factors_short.weight" in factors:
        original = int(_key(meta, "phi3", "rope.scaling.original_context_length", source))
        out["original_max_position_embeddings"] = original
        out["rope_scaling"] = {
            "type": "longrope",
            "short_factor": factors["rope_factors_short.weight"].tolist(),
            "long_factor": factors["rope_factors_long.weight"].tolist(),
            "original_max_position_embeddings": original,
        }
    return out


# what an architecture's metadata or tensors say in its own way (none: only the common keys)
ARCH_CONFIG = {"llama": _llama_config, "gemma3": _gemma3_config, "phi3": _phi3_config}


def llama3_scaling(freqs: np.ndarray, cfg: dict, source: str) -> dict:
    """Llama 3.1 / 3.2's rope scaling, which llama.cpp stores only as its per-pair factors
    (`rope_freqs`): recovered as `factor` = the largest with the published ramp (low 1, high
    4, original context 8,192), and checked to give those factors."""
    scaling = {
        "rope_type": "llama3",
        "factor": float(np.max(freqs)),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    dims = cfg["head_dim"]
    inv = 1.0 / cfg.get("rope_theta", 10000.0) ** (np.arange(0, dims, 2) / dims)
    wavelen = 2 * math.pi / inv
    f, old = scaling["factor"], 8192
    smooth = (old / wavelen - 1.0) / (4.0 - 1.0)
    expected = np.where(
        wavelen < old / 4.0, 1.0, np.where(wavelen > old / 1.0, f, 1 / ((1 - smooth) / f + smooth))
    )
    if freqs.shape != expected.shape or not np.allclose(freqs, expected, rtol=1e-3):
        raise ModelError(
            f"{source}: its rope frequency factors (rope_freqs) are not Llama "
            "3's scaling, the only one mlxbatch recovers from a GGUF"
        )
    return scaling
