"""ModelArgs: the subset of a Qwen2/Qwen2.5 `config.json` the forward pass needs."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError

SUPPORTED_MODEL_TYPES = ("qwen2",)


@dataclass(frozen=True)
class ModelArgs:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True
    model_type: str = "qwen2"
    head_dim_override: int | None = None

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_attention_heads

    @property
    def n_rep(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> ModelArgs:
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelError(
                f"{source}: model_type {model_type!r} is not supported "
                f"(mlxbatch runs {', '.join(SUPPORTED_MODEL_TYPES)}: Qwen2 / Qwen2.5)"
            )
        if cfg.get("use_sliding_window"):
            raise ModelError(f"{source}: sliding-window attention is not supported")
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or (
            rope if rope.get("rope_type", "default") != "default" else None
        )
        if scaling:
            raise ModelError(f"{source}: rope scaling {scaling!r} is not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ModelError(f"{source}: hidden_act {cfg['hidden_act']!r} is not supported")
        fields = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in cfg.items() if k in fields}
        if cfg.get("head_dim"):
            known["head_dim_override"] = int(cfg["head_dim"])
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.name not in known
        ]
        if missing:
            raise ModelError(f"{source}: missing required keys {missing}")
        if "rope_theta" not in known and "rope_theta" in rope:
            known["rope_theta"] = rope["rope_theta"]  # transformers >= 5 nests it here
        args = cls(**known)
        if args.num_attention_heads % args.num_key_value_heads:
            raise ModelError(
                f"{source}: num_attention_heads={args.num_attention_heads} is not a multiple "
                f"of num_key_value_heads={args.num_key_value_heads}"
            )
        return args

    @classmethod
    def load(cls, model_dir: str | Path) -> ModelArgs:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelError(f"{path}: not found (is {model_dir} a model directory?)")
        try:
            cfg = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(cfg, str(path))

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter the checkpoint must hold, by Hugging Face name."""
        d, hd, i = self.hidden_size, self.head_dim, self.intermediate_size
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        shapes = {"model.embed_tokens.weight": (self.vocab_size, d), "model.norm.weight": (d,)}
        for n in range(self.num_hidden_layers):
            p = f"model.layers.{n}."
            shapes |= {
                p + "self_attn.q_proj.weight": (q, d),
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.weight": (kv, d),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.weight": (kv, d),
                p + "self_attn.v_proj.bias": (kv,),
                p + "self_attn.o_proj.weight": (d, q),
                p + "mlp.gate_proj.weight": (i, d),
                p + "mlp.up_proj.weight": (i, d),
                p + "mlp.down_proj.weight": (d, i),
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
            }
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, d)
        return shapes
