"""A model family as data: what its decoder block changes against Qwen2, and its tensor names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Family:
    """Every way a family differs from Qwen2, as data: config.py and config_fields.py read a
    config through this record and never test a `model_type` or which keys a table holds."""

    name: str  # for messages: "Qwen2 / Qwen2.5"
    qkv_bias: bool | None = None  # True: q/k/v always biased (Qwen2); None: `attention_bias`
    qk_norm: bool = False  # RMSNorm over each head of q and k before rope (Qwen3, Gemma 3)
    norm_offset: bool = False  # RMSNorm scales by (1 + w) (Gemma)
    sandwich: bool = False  # norms after attention and around the MLP too (Gemma 3)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size) (Gemma)
    fused: bool = False  # one qkv_proj and one gate_up_proj (Phi-3)
    activations: tuple[str, ...] = ("silu",)
    activation_key: str = "hidden_act"  # the config key of the MLP's gate (Gemma: its own)
    rope_types: tuple[str, ...] = ("default",)
    sliding: str = "never"  # "never" | "all" (`sliding_window` on every layer) | "pattern"
    # the config key of the sliding layers' own plain-rope base (Gemma 3); None: every layer
    # rotates alike. With it, rope_parameters may come per layer type.
    local_rope_key: str | None = None
    # the config key whose value**-0.5 scales attention (Gemma 3); None: head_dim**-0.5
    attention_scalar_key: str | None = None
    # the top-level key that overrides LongRoPE's own original context (Phi-3)
    original_context_key: str | None = None
    # the bias switches its transformers class reads; any other is ignored (no biases)
    bias_switches: tuple[str, ...] = ()
    # rotates the first `partial_rotary_factor` of each head (Phi-3); the others' transformers
    # classes rotate the whole head whatever the config says (Qwen2 with 0.5: max diff 7e-3)
    partial_rotary: bool = False
    # the `model_type` of the vision-language checkpoints whose language model this is
    vision_language_type: str | None = None
    gguf_arch: str | None = None  # llama.cpp's `general.architecture` for it; None: no GGUF
    gguf_permuted_qk: bool = False  # llama.cpp's converter reorders q/k rows for its rope
    # transformers' default of each config.json key mlxbatch reads, for a config that omits it
    # (None for num_key_value_heads / head_dim: derived)
    defaults: dict = field(default_factory=dict, compare=False, hash=False)
    # rope type aliases the configuration class renames (Phi-3: `su`, `yarn` -> `longrope`)
    rope_aliases: dict = field(default_factory=dict, compare=False, hash=False)


class Sizes(Protocol):
    """What `expected_shapes` reads of a config, named here so family.py need not import it."""

    hidden_size: int
    head_dim: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    vocab_size: int
    attention_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool


def expected_shapes(args: Sizes, family: Family) -> dict[str, tuple[int, ...]]:
    """Every parameter the checkpoint must hold, by Hugging Face name."""
    d, hd, i = args.hidden_size, args.head_dim, args.intermediate_size
    q, kv = args.num_attention_heads * hd, args.num_key_value_heads * hd
    qkv_bias = family.qkv_bias if family.qkv_bias is not None else args.attention_bias
    o_bias = family.qkv_bias is None and args.attention_bias
    shapes = {"model.embed_tokens.weight": (args.vocab_size, d), "model.norm.weight": (d,)}
    for n in range(args.num_hidden_layers):
        p, a, m = f"model.layers.{n}.", f"model.layers.{n}.self_attn.", f"model.layers.{n}.mlp."
        if family.fused:
            shapes[a + "qkv_proj.weight"] = (q + 2 * kv, d)
            shapes[m + "gate_up_proj.weight"] = (2 * i, d)
        else:
            shapes |= {
                a + "q_proj.weight": (q, d),
                a + "k_proj.weight": (kv, d),
                a + "v_proj.weight": (kv, d),
                m + "gate_proj.weight": (i, d),
                m + "up_proj.weight": (i, d),
            }
            if qkv_bias:
                shapes |= {
                    a + "q_proj.bias": (q,),
                    a + "k_proj.bias": (kv,),
                    a + "v_proj.bias": (kv,),
                }
            if args.mlp_bias:
                shapes |= {m + "gate_proj.bias": (i,), m + "up_proj.bias": (i,)}
        shapes[a + "o_proj.weight"] = (d, q)
        if o_bias:
            shapes[a + "o_proj.bias"] = (d,)
        shapes[m + "down_proj.weight"] = (d, i)
        if args.mlp_bias:
            shapes[m + "down_proj.bias"] = (d,)
        if family.qk_norm:
            shapes |= {a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)}
        norms = ["input_layernorm", "post_attention_layernorm"]
        if family.sandwich:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        shapes |= {p + f"{name}.weight": (d,) for name in norms}
    if not args.tie_word_embeddings:
        shapes["lm_head.weight"] = (args.vocab_size, d)
    return shapes
