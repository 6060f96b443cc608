"""ModelArgs: the subset of a supported `config.json` the forward pass needs, normalised.

Published configs spell rope settings two ways: `rope_theta` + `rope_scaling` (with `type` or
`rope_type`; Gemma 3 adds `rope_local_base_freq`), and transformers >= 5's `rope_parameters`
(flat, or one entry per layer type for Gemma 3). Both become `rope_theta`, `rope_scaling`
(sorted items, empty for plain rope) and `rope_local_base_freq`. Layer types come from
`layer_types`, `sliding_window_pattern`, or the family (see family.py).

A key config.json omits takes transformers' default for the model_type (`Family.defaults`, one
table in each family module), so a config runs as transformers runs it. The keys become fields,
checked, in config_fields.py. Every rule that differs by family (which key holds the activation,
the sliding layers' rope base or the attention scalar, which bias switches are read, ...) is a
field of the family's record: this module asks the record, never the `model_type`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError
from .config_fields import (
    FULL,
    SLIDING,
    check_types,
    first,
    layer_fields,
    rope_fields,
    with_defaults,
)
from .families import FAMILIES
from .family import Family, expected_shapes
from .rope import Rope
from .vision_language import is_vision_language, text_config, text_types


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
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    rope_scaling: tuple = ()  # sorted (key, value) items, lists as tuples; () for plain rope
    rope_local_base_freq: float = 10000.0  # sliding layers' rope base (Gemma 3)
    partial_rotary_factor: float = 1.0
    sliding_window: int | None = None  # keys a sliding layer sees (only when one exists)
    layer_types: tuple[str, ...] = ()  # per layer: "full_attention" or "sliding_attention"
    query_pre_attn_scalar: float | None = None  # attention scale**-2 (Gemma 3); else head_dim
    vision_language: bool = False  # the language model of one (vision_language.py: its tensors)

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    def layer_type(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else FULL

    def rope(self, layer_type: str = FULL) -> Rope:
        dims = int(self.head_dim * self.partial_rotary_factor)
        if layer_type == SLIDING and self.family.local_rope_key:
            return Rope(dims, self.rope_local_base_freq)
        return Rope(dims, self.rope_theta, self.rope_scaling)

    @property
    def context_key(self) -> str:
        """The config.json key `max_position_embeddings` is read from: LongRoPE's context is
        capped at `original_max_position_embeddings` (see from_dict)."""
        longrope = dict(self.rope_scaling).get("rope_type") == "longrope"
        return "original_max_position_embeddings" if longrope else "max_position_embeddings"

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

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
        vision_language = is_vision_language(cfg)
        cfg = text_config(cfg, source)
        family = _family(cfg, source)
        _refuse_unsupported(cfg, source)
        known = _fields(cls, cfg, family, source)
        args = cls(**known | {"vision_language": vision_language})
        _check_shapes(args, cfg, family, source)
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
        return expected_shapes(self, self.family)


def _family(cfg: dict, source: str) -> Family:
    """The record of the config's `model_type`; refused, naming what runs, if none is."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        names = ", ".join(
            [f"{t} ({f.name})" for t, f in FAMILIES.items()]
            + [f"{t} (its language model)" for t in text_types()]
        )
        raise ModelError(
            f"{source}: model_type {model_type!r} is not supported (mlxbatch runs {names})"
        )
    return FAMILIES[model_type]


def _refuse_unsupported(cfg: dict, source: str) -> None:
    """Switches no family here runs, whichever family's config sets them."""
    if cfg.get("use_sliding_window"):  # Qwen2/Qwen3's switch (with max_window_layers)
        raise ModelError(f"{source}: sliding-window attention is not supported")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key) is not None:
            raise ModelError(f"{source}: {key} {cfg[key]!r} is not supported")
    if cfg.get("use_bidirectional_attention"):  # EmbeddingGemma's: not a causal model
        raise ModelError(
            f"{source}: use_bidirectional_attention is not supported (mlxbatch "
            "runs causal language models)"
        )


def _activation(cfg: dict, family: Family, source: str) -> str:
    """The MLP gate's activation, read from the family's own key (Gemma 3's is not hidden_act)."""
    key = family.activation_key
    act = cfg.get(key) or family.defaults[key]
    if act not in family.activations:
        raise ModelError(
            f"{source}: hidden_act {act!r} is not supported for "
            f"{family.name} ({', '.join(family.activations)})"
        )
    return act


def _fields(cls: type, cfg: dict, family: Family, source: str) -> dict:
    """ModelArgs' fields from `cfg` as `family` reads it, checked for type and range."""
    act = _activation(cfg, family, source)
    known = with_defaults(cls, cfg, family, source) | {"hidden_act": act}
    known |= rope_fields(cfg, family, source)
    known |= layer_fields(cfg, family, known["num_hidden_layers"], source)
    if key := family.attention_scalar_key:
        known["query_pre_attn_scalar"] = first(cfg.get(key), family.defaults.get(key))
    scaling = dict(known.get("rope_scaling", ()))
    if scaling.get("rope_type") == "longrope":  # see phi3.py: the short factors' context
        known["max_position_embeddings"] = scaling["original_max_position_embeddings"]
    for key in ("attention_bias", "mlp_bias"):
        if not isinstance(known.get(key, False), bool):
            raise ModelError(f"{source}: {key} must be true or false, got {known[key]!r}")
    check_types(known, source)
    return known


def _check_shapes(args: ModelArgs, cfg: dict, family: Family, source: str) -> None:
    """What only the built sizes tell: one rope factor per rotated pair, whole kv groups."""
    for key in ("short_factor", "long_factor"):
        f = dict(args.rope_scaling).get(key)
        if f is not None and (not isinstance(f, tuple) or len(f) != args.rope().dims // 2):
            raise ModelError(
                f"{source}: rope scaling {key} must list one factor per "
                f"rotated pair ({args.rope().dims // 2}), got {f!r}"
            )
    if args.num_attention_heads % args.num_key_value_heads:
        given = cfg.get("num_key_value_heads") is not None
        raise ModelError(
            f"{source}: num_attention_heads={args.num_attention_heads} is not a multiple "
            f"of num_key_value_heads={args.num_key_value_heads}"
            + ("" if given else f" (not in config.json: {family.name}'s default)")
        )
