"""ModelArgs: the subset of a supported `config.json` the forward pass needs, normalised.

Published configs spell rope settings two ways: `rope_theta` + `rope_scaling` (with `type` or
`rope_type`; Gemma 3 adds `rope_local_base_freq`), and transformers >= 5's `rope_parameters`
(flat, or one entry per layer type for Gemma 3). Both become `rope_theta`, `rope_scaling`
(sorted items, empty for plain rope) and `rope_local_base_freq`. Layer types come from
`layer_types`, `sliding_window_pattern`, or the family (see family.py).

A key config.json omits takes transformers' default for the model_type (`Family.defaults`, one
table in each family module), so a config runs as transformers runs it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError
from .families import FAMILIES
from .family import Family, expected_shapes
from .rope import ROPE_TYPES, Rope

SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
SLIDING, FULL = "sliding_attention", "full_attention"
# Keys each rope scaling needs (beyond rope_type), as transformers reads them.
_ROPE_KEYS = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
              "original_max_position_embeddings"),
              "longrope": ("short_factor", "long_factor", "original_max_position_embeddings")}  # fmt: skip


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

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    def layer_type(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else FULL

    def rope(self, layer_type: str = FULL) -> Rope:
        dims = int(self.head_dim * self.partial_rotary_factor)
        if layer_type == SLIDING and self.model_type == "gemma3_text":
            return Rope(dims, self.rope_local_base_freq)
        return Rope(dims, self.rope_theta, self.rope_scaling)

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
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            names = ", ".join(f"{t} ({f.name})" for t, f in FAMILIES.items())
            raise ModelError(f"{source}: model_type {model_type!r} is not supported "
                             f"(mlxbatch runs {names})")  # fmt: skip
        family = FAMILIES[model_type]
        if cfg.get("use_sliding_window"):  # Qwen2/Qwen3's switch (with max_window_layers)
            raise ModelError(f"{source}: sliding-window attention is not supported")
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if cfg.get(key) is not None:
                raise ModelError(f"{source}: {key} {cfg[key]!r} is not supported")
        d = family.defaults
        act_key = "hidden_activation" if "hidden_activation" in d else "hidden_act"
        act = cfg.get(act_key) or d[act_key]
        if act not in family.activations:
            raise ModelError(f"{source}: hidden_act {act!r} is not supported for "
                             f"{family.name} ({', '.join(family.activations)})")  # fmt: skip
        known = _with_defaults(cls, cfg, family, source) | {"hidden_act": act}
        known |= _rope_fields(cfg, family, source)
        known |= _layer_fields(cfg, family, known["num_hidden_layers"], source)
        if "query_pre_attn_scalar" in d:  # Gemma 3
            known["query_pre_attn_scalar"] = _first(cfg.get("query_pre_attn_scalar"),
                                                    d["query_pre_attn_scalar"])  # fmt: skip
        scaling = dict(known.get("rope_scaling", ()))
        if scaling.get("rope_type") == "longrope":  # see phi3.py: the short factors' context
            known["max_position_embeddings"] = scaling["original_max_position_embeddings"]
        for key in ("attention_bias", "mlp_bias"):
            if not isinstance(known.get(key, False), bool):
                raise ModelError(f"{source}: {key} must be true or false, got {known[key]!r}")
        _check_types(known, source)
        args = cls(**known)
        for key in ("short_factor", "long_factor"):
            f = dict(args.rope_scaling).get(key)
            if f is not None and (not isinstance(f, tuple) or len(f) != args.rope().dims // 2):
                raise ModelError(f"{source}: rope scaling {key} must list one factor per "
                                 f"rotated pair ({args.rope().dims // 2}), got {f!r}")  # fmt: skip
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
        return expected_shapes(self, self.family)


_DERIVED = {"rope_scaling", "layer_types", "sliding_window", "query_pre_attn_scalar",
            "rope_local_base_freq", "partial_rotary_factor", "rope_theta"}  # fmt: skip


def _first(*values):
    return next((v for v in values if v is not None), None)


def _items(d: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))


def _rope_fields(cfg: dict, family: Family, source: str) -> dict:
    """rope_theta, rope_scaling, rope_local_base_freq and partial_rotary_factor, from either
    spelling (see the module docstring)."""
    params = cfg.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ModelError(f"{source}: rope_parameters must be an object, got {params!r}")
    local = {}
    if FULL in params or SLIDING in params:  # transformers >= 5, per layer type (Gemma 3)
        local, params = params.get(SLIDING) or {}, params.get(FULL) or {}
    scaling = cfg.get("rope_scaling") or params
    if not isinstance(scaling, dict):
        raise ModelError(f"{source}: rope_scaling must be an object, got {scaling!r}")
    scaling = {k: v for k, v in scaling.items() if k not in ("rope_theta", "type")} | {
        "rope_type": scaling.get("rope_type") or scaling.get("type") or "default"
    }
    kind = scaling["rope_type"] = family.rope_aliases.get(
        scaling["rope_type"], scaling["rope_type"]
    )  # Phi-3's `su`, `yarn`
    if kind not in ROPE_TYPES or kind not in family.rope_types:
        raise ModelError(f"{source}: rope scaling {kind!r} is not supported for {family.name} "
                         f"({', '.join(family.rope_types)})")  # fmt: skip
    d = family.defaults
    # rope_parameters' own value first: transformers fills it from the top-level key only where
    # it is absent (`standardize_rope_params`: setdefault)
    out = {"rope_theta": _first(params.get("rope_theta"), cfg.get("rope_theta"), d["rope_theta"])}
    local_theta = _first(local.get("rope_theta"), cfg.get("rope_local_base_freq"),
                         d.get("rope_local_base_freq"))  # fmt: skip
    if local_theta is not None:
        out["rope_local_base_freq"] = local_theta
    prf = _first(params.get("partial_rotary_factor"), cfg.get("partial_rotary_factor"), 1.0)
    if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 < prf <= 1:
        raise ModelError(f"{source}: partial_rotary_factor must be in (0, 1], got {prf!r}")
    out["partial_rotary_factor"] = float(prf)
    if kind == "default":
        return out
    if kind == "longrope":
        top = cfg.get("original_max_position_embeddings")
        if "original_max_position_embeddings" in d:  # Phi-3: the top-level key wins
            top = _first(top, d["original_max_position_embeddings"])
            scaling["original_max_position_embeddings"] = top
        else:
            scaling.setdefault("original_max_position_embeddings", top)
        orig = scaling["original_max_position_embeddings"]
        if isinstance(orig, int) and scaling.get("factor") is None:
            context = _first(cfg.get("max_position_embeddings"), d.get("max_position_embeddings"))
            scaling["factor"] = _first(context, orig) / orig
    absent = [k for k in _ROPE_KEYS[kind] if scaling.get(k) is None]
    if absent:
        raise ModelError(f"{source}: rope scaling {kind!r} needs {', '.join(absent)}")
    scaling.pop("partial_rotary_factor", None)
    out["rope_scaling"] = _items(scaling)
    return out


def _with_defaults(cls, cfg: dict, family: Family, source: str) -> dict:
    """The fields config.json gives, and transformers' default for this family of each it
    omits (`Family.defaults`); refused when a key with no default is missing."""
    d = family.defaults
    fields = {f.name for f in dataclasses.fields(cls)} - _DERIVED
    known = {k: v for k, v in cfg.items() if k in fields}
    missing = [f.name for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.name not in known and f.name not in d]  # fmt: skip
    if missing:
        raise ModelError(f"{source}: missing required keys {missing}")
    for key in ("attention_bias", "mlp_bias"):
        if key not in d:  # a switch this family's transformers class never reads
            known.pop(key, None)
    known = {k: v for k, v in d.items() if k in fields} | known
    if known["num_key_value_heads"] is None:  # null, or absent where transformers says so
        known["num_key_value_heads"] = known["num_attention_heads"]
    head_dim = cfg["head_dim"] if "head_dim" in cfg else d.get("head_dim")
    if head_dim is not None:
        known["head_dim_override"] = head_dim
    return known


def _layer_fields(cfg: dict, family: Family, n_layers, source: str) -> dict:
    """layer_types and sliding_window, only where a layer slides (see family.sliding)."""
    d = family.defaults
    window = cfg["sliding_window"] if "sliding_window" in cfg else d.get("sliding_window")
    if family.sliding == "never" or window is None:
        return {}
    context = _first(cfg.get("max_position_embeddings"), d.get("max_position_embeddings"))
    if (
        family.sliding == "all"
        and isinstance(window, int)
        and isinstance(context, int)
        and (window >= context)
    ):
        return {}  # a window as long as the context (Phi-4-mini's 262,144): plain causal
    if family.sliding == "all":
        return {"sliding_window": window, "layer_types": (SLIDING,) * n_layers}
    types = cfg.get("layer_types")
    pattern = (cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern")
               or d.get("sliding_window_pattern"))  # fmt: skip
    if types is None and isinstance(pattern, int) and pattern > 0 and isinstance(n_layers, int):
        types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or not set(types) <= {SLIDING, FULL}:
        raise ModelError(f"{source}: layer_types (or sliding_window_pattern) must give one of "
                         f"{SLIDING!r} / {FULL!r} per layer, got {types!r}")  # fmt: skip
    return {"sliding_window": window, "layer_types": tuple(types)}


_POSITIVE_INTS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "max_position_embeddings",
                  "head_dim_override", "sliding_window")  # fmt: skip
_POSITIVE_FLOATS = ("rms_norm_eps", "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar")


# Bounds far above any supported model (Qwen2 72B: 80 layers, hidden 8,192; Gemma 3: vocab
# 262,208), checked before any size is used: `num_hidden_layers: 1e9` listed a billion layers' shapes and ran out of memory.
_LIMITS = {"hidden_size": 1 << 16, "num_hidden_layers": 1 << 10, "intermediate_size": 1 << 18,
           "num_attention_heads": 1 << 10, "num_key_value_heads": 1 << 10, "vocab_size": 1 << 22,
           "max_position_embeddings": 1 << 24, "head_dim_override": 1 << 12,
           "sliding_window": 1 << 24}  # fmt: skip


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
                raise ModelError(f"{source}: {key} {v:,} is beyond any supported model (at most "
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
