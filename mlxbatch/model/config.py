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

    @property
    def flops_per_token(self) -> int:
        """Matmul FLOPs of one token through the decoder layers (projections and MLP)."""
        d, hd, H, KV = (
            self.hidden_size,
            self.head_dim,
            self.num_attention_heads,
            self.num_key_value_heads,
        )
        per_layer = d * (H + 2 * KV) * hd + H * hd * d + 3 * d * self.intermediate_size
        return 2 * self.num_hidden_layers * per_layer

    @property
    def flops_per_token_key(self) -> int:
        """Attention FLOPs of one (query token, attended key) pair: QK^T and PV, every layer."""
        return 4 * self.num_hidden_layers * self.num_attention_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> ModelArgs:
        if not isinstance(cfg, dict):
            raise ModelError(f"{source}: a JSON {type(cfg).__name__}, not an object")
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelError(
                f"{source}: model_type {model_type!r} is not supported "
                f"(mlxbatch runs {', '.join(SUPPORTED_MODEL_TYPES)}: Qwen2 / Qwen2.5)"
            )
        if cfg.get("use_sliding_window"):
            raise ModelError(f"{source}: sliding-window attention is not supported")
        rope = cfg.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise ModelError(f"{source}: rope_parameters must be an object, got {rope!r}")
        scaling = cfg.get("rope_scaling") or (
            rope if rope.get("rope_type", "default") != "default" else None
        )
        if scaling:
            raise ModelError(f"{source}: rope scaling {scaling!r} is not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ModelError(f"{source}: hidden_act {cfg['hidden_act']!r} is not supported")
        fields = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in cfg.items() if k in fields}
        if cfg.get("head_dim") is not None:
            known["head_dim_override"] = cfg["head_dim"]
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.name not in known
        ]
        if missing:
            raise ModelError(f"{source}: missing required keys {missing}")
        if "rope_theta" not in known and isinstance(rope, dict) and "rope_theta" in rope:
            known["rope_theta"] = rope["rope_theta"]  # transformers >= 5 nests it here
        _check_types(known, source)
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
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise ModelError(f"{path}: cannot be read ({e.strerror})") from None
        except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError too
            raise ModelError(f"{path}: not valid JSON ({str(e)[:120]})") from None
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


_POSITIVE_INTS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "max_position_embeddings",
                  "head_dim_override")  # fmt: skip
_POSITIVE_FLOATS = ("rms_norm_eps", "rope_theta")


# Bounds far above any Qwen2 (72B: 80 layers, hidden 8,192, vocab 152,064), checked before any
# size is used: `num_hidden_layers: 1e9` listed a billion layers' shapes and ran out of memory.
_LIMITS = {"hidden_size": 1 << 16, "num_hidden_layers": 1 << 10, "intermediate_size": 1 << 18,
           "num_attention_heads": 1 << 10, "num_key_value_heads": 1 << 10, "vocab_size": 1 << 22,
           "max_position_embeddings": 1 << 24, "head_dim_override": 1 << 12}  # fmt: skip


def _check_types(known: dict, source: str) -> None:
    """Every value of the right type and range, named by its key when it is not."""
    for key in _POSITIVE_INTS:
        if key in known:
            v = known[key]
            if isinstance(v, float) and v.is_integer() and 1 <= v <= _LIMITS[key]:
                v = known[key] = int(v)  # 1e3 in JSON is a float
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ModelError(f"{source}: {key} must be a positive integer, got {v!r}")
            if v > _LIMITS[key]:
                raise ModelError(f"{source}: {key} {v:,} is beyond any Qwen2 model (at most "
                                 f"{_LIMITS[key]:,} here); is config.json damaged?")  # fmt: skip
    for key in _POSITIVE_FLOATS:
        if key in known:
            v = known[key]
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not v > 0
                or v == float("inf")
            ):
                raise ModelError(f"{source}: {key} must be a positive number, got {v!r}")
    tie = known.get("tie_word_embeddings", True)
    if not isinstance(tie, bool):
        raise ModelError(f"{source}: tie_word_embeddings must be true or false, got {tie!r}")
    if known.get("hidden_size", 0) % known.get("num_attention_heads", 1) and not known.get(
        "head_dim_override"
    ):
        raise ModelError(
            f"{source}: hidden_size={known['hidden_size']} is not a multiple of "
            f"num_attention_heads={known['num_attention_heads']}"
        )
