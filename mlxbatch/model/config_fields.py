"""How a config.json's keys become `ModelArgs`' fields (config.py): transformers' defaults for
what it omits, rope settings from either spelling, the layer types, and every value checked for
type and range before any size is used."""

from __future__ import annotations

import dataclasses

from ..errors import ModelError
from .family import Family
from .rope import ROPE_TYPES

SLIDING, FULL = "sliding_attention", "full_attention"
# Keys each rope scaling needs (beyond rope_type), as transformers reads them.
_ROPE_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}
_DERIVED = {
    "rope_scaling",
    "layer_types",
    "sliding_window",
    "query_pre_attn_scalar",
    "vision_language",
    "rope_local_base_freq",
    "partial_rotary_factor",
    "rope_theta",
}


def first(*values):
    return next((v for v in values if v is not None), None)


def _items(d: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))


def _by_layer_type(params, source: str) -> tuple[dict, dict]:
    """(the sliding layers', the others') rope parameters: transformers >= 5 gives them per
    layer type (Gemma 3), else one set for every layer. The sliding layers' rope is plain."""
    if not isinstance(params, dict):
        raise ModelError(f"{source}: rope_parameters must be an object, got {params!r}")
    if FULL not in params and SLIDING not in params:
        return {}, params
    local, params = params.get(SLIDING) or {}, params.get(FULL) or {}
    if not isinstance(local, dict):
        raise ModelError(f"{source}: rope_parameters.{SLIDING} must be an object, got {local!r}")
    if (local.get("rope_type") or local.get("type") or "default") != "default":
        raise ModelError(
            f"{source}: rope_parameters.{SLIDING}: rope scaling "
            f"{local.get('rope_type') or local.get('type')!r} is not supported "
            "(the sliding layers rotate with plain rope)"
        )
    return local, params


def _given_rope(cfg: dict, family: Family, source: str) -> tuple[dict, dict]:
    """(the sliding layers', the others') rope parameters as transformers reads config.json
    (`convert_rope_params_to_dict`): `rope_scaling`, where given, replaces `rope_parameters`
    whole; Gemma 3 merges it into the full-attention layers' entry instead."""
    scaling = cfg.get("rope_scaling")
    if not scaling:
        return _by_layer_type(cfg.get("rope_parameters") or {}, source)
    if not isinstance(scaling, dict):
        raise ModelError(f"{source}: rope_scaling must be an object, got {scaling!r}")
    if not cfg.get("rope_parameters") or family.local_rope_key is None:
        return {}, scaling
    local, params = _by_layer_type(cfg["rope_parameters"], source)
    if FULL not in cfg["rope_parameters"]:  # transformers fails on it (a KeyError)
        raise ModelError(
            f"{source}: rope_scaling is given beside a rope_parameters without a "
            f"{FULL!r} entry to apply it to; keep one of the two"
        )
    return local, params | scaling


def _local_rope_base(cfg: dict, family: Family, local: dict):
    """The sliding layers' own rope base, for a family whose sliding layers have one: their
    rope parameters' value first, then the family's key (Gemma 3's `rope_local_base_freq`)."""
    if family.local_rope_key is None:
        return None
    key = family.local_rope_key
    return first(local.get("rope_theta"), cfg.get(key), family.defaults.get(key))


def rope_fields(cfg: dict, family: Family, source: str) -> dict:
    """rope_theta, rope_scaling, rope_local_base_freq and partial_rotary_factor, from either
    spelling (see the module docstring)."""
    local, params = _given_rope(cfg, family, source)
    scaling = params
    scaling = {k: v for k, v in scaling.items() if k not in ("rope_theta", "type")} | {
        "rope_type": scaling.get("rope_type") or scaling.get("type") or "default"
    }
    kind = scaling["rope_type"]
    if isinstance(kind, str):  # (a list or an object: unhashable, refused below)
        kind = scaling["rope_type"] = family.rope_aliases.get(kind, kind)  # Phi-3's `su`, `yarn`
    if not isinstance(kind, str) or kind not in ROPE_TYPES or kind not in family.rope_types:
        raise ModelError(
            f"{source}: rope scaling {kind!r} is not supported for {family.name} "
            f"({', '.join(family.rope_types)})"
        )
    d = family.defaults
    # the rope parameters' own value first: transformers fills it from the top-level key only
    # where it is absent (`standardize_rope_params`: setdefault)
    out = {"rope_theta": first(params.get("rope_theta"), cfg.get("rope_theta"), d["rope_theta"])}
    local_theta = _local_rope_base(cfg, family, local)
    if local_theta is not None:
        out["rope_local_base_freq"] = local_theta
    prf = first(params.get("partial_rotary_factor"), cfg.get("partial_rotary_factor"), 1.0)
    if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 < prf <= 1:
        raise ModelError(f"{source}: partial_rotary_factor must be in (0, 1], got {prf!r}")
    out["partial_rotary_factor"] = float(prf) if family.partial_rotary else 1.0  # (Family's)
    if kind != "default":
        out["rope_scaling"] = _scaling(cfg, family, scaling, source)
    return out


def _scaling(cfg: dict, family: Family, scaling: dict, source: str) -> tuple:
    """A rope scaling's parameters, completed as transformers completes them and checked."""
    kind, d = scaling["rope_type"], family.defaults
    if kind == "longrope":
        if key := family.original_context_key:  # Phi-3: the top-level key wins
            scaling["original_max_position_embeddings"] = first(cfg.get(key), d.get(key))
        else:
            top = cfg.get("original_max_position_embeddings")
            scaling.setdefault("original_max_position_embeddings", top)
    absent = [k for k in _ROPE_KEYS[kind] if scaling.get(k) is None]
    if absent:
        raise ModelError(f"{source}: rope scaling {kind!r} needs {', '.join(absent)}")
    _check_scaling(scaling, source)  # before the factor below divides by the original context
    if kind == "longrope" and scaling.get("factor") is None:
        orig = scaling["original_max_position_embeddings"]
        context = first(cfg.get("max_position_embeddings"), d.get("max_position_embeddings"), orig)
        if isinstance(context, bool) or not isinstance(context, int) or context < 1:
            raise ModelError(
                f"{source}: max_position_embeddings must be a positive integer, got {context!r}"
            )
        scaling["factor"] = context / orig
    scaling.pop("partial_rotary_factor", None)
    return _items(scaling)


def _positive(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and 0 < x < float("inf")


def _check_scaling(scaling: dict, source: str) -> None:
    """The rope-scaling values rope.py divides by or takes logarithms of, checked where they
    are read: a factor of "8" or 0 was a TypeError or a ZeroDivisionError deep in rope.py, a
    negative or NaN short factor a model that ran."""
    where = f"{source}: rope scaling {scaling['rope_type']!r}"
    for key in ("factor", "low_freq_factor", "high_freq_factor", "attention_factor"):
        if scaling.get(key) is not None and not _positive(scaling[key]):
            raise ModelError(f"{where} {key} must be a positive number, got {scaling[key]!r}")
    orig = scaling.get("original_max_position_embeddings")
    least = 2 if scaling["rope_type"] == "longrope" else 1  # longrope divides by its log
    if orig is not None and (isinstance(orig, bool) or not isinstance(orig, int) or orig < least):
        raise ModelError(
            f"{where} original_max_position_embeddings must be an integer of at "
            f"least {least}, got {orig!r}"
        )
    lo, hi = scaling.get("low_freq_factor"), scaling.get("high_freq_factor")
    if lo is not None and hi is not None and not lo < hi:  # the ramp divides by hi - lo
        raise ModelError(
            f"{where} low_freq_factor ({lo!r}) must be below high_freq_factor ({hi!r})"
        )
    for key in ("short_factor", "long_factor"):
        factors = scaling.get(key)
        if factors is not None and (
            not isinstance(factors, list) or not all(_positive(f) for f in factors)
        ):
            raise ModelError(f"{where} {key} must list positive numbers, got {factors!r}"[:300])


def with_defaults(cls, cfg: dict, family: Family, source: str) -> dict:
    """The fields config.json gives, and transformers' default for this family of each it
    omits (`Family.defaults`); refused when a key with no default is missing."""
    d = family.defaults
    fields = {f.name for f in dataclasses.fields(cls)} - _DERIVED
    known = {k: v for k, v in cfg.items() if k in fields}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.name not in known and f.name not in d
    ]
    if missing:
        raise ModelError(f"{source}: missing required keys {missing}")
    for key in ("attention_bias", "mlp_bias"):
        if key not in family.bias_switches:  # one its transformers class never reads
            known.pop(key, None)
    known = {k: v for k, v in d.items() if k in fields} | known
    if known["num_key_value_heads"] is None:  # null, or absent where transformers says so
        known["num_key_value_heads"] = known["num_attention_heads"]
    head_dim = cfg["head_dim"] if "head_dim" in cfg else d.get("head_dim")
    if head_dim is not None:
        known["head_dim_override"] = head_dim
    return known


def layer_fields(cfg: dict, family: Family, n_layers, source: str) -> dict:
    """layer_types and sliding_window, only where a layer slides (see family.sliding)."""
    d = family.defaults
    window = cfg["sliding_window"] if "sliding_window" in cfg else d.get("sliding_window")
    if family.sliding == "never" or window is None:
        return {}
    context = first(cfg.get("max_position_embeddings"), d.get("max_position_embeddings"))
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
    pattern = (
        cfg.get("sliding_window_pattern")
        or cfg.get("_sliding_window_pattern")
        or d.get("sliding_window_pattern")
    )
    if types is None and isinstance(pattern, int) and pattern > 0 and isinstance(n_layers, int):
        types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or not set(types) <= {SLIDING, FULL}:
        raise ModelError(
            f"{source}: layer_types (or sliding_window_pattern) must give one of "
            f"{SLIDING!r} / {FULL!r} per layer, got {types!r}"
        )
    return {"sliding_window": window, "layer_types": tuple(types)}


_POSITIVE_INTS = (
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "head_dim_override",
    "sliding_window",
)
_POSITIVE_FLOATS = ("rms_norm_eps", "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar")


# Bounds far above any supported model (Qwen2 72B: 80 layers, hidden 8,192; Gemma 3: vocab
# 262,208), checked before any size is used: `num_hidden_layers: 1e9` listed a billion layers' shapes and ran out of memory.
_LIMITS = {
    "hidden_size": 1 << 16,
    "num_hidden_layers": 1 << 10,
    "intermediate_size": 1 << 18,
    "num_attention_heads": 1 << 10,
    "num_key_value_heads": 1 << 10,
    "vocab_size": 1 << 22,
    "max_position_embeddings": 1 << 24,
    "head_dim_override": 1 << 12,
    "sliding_window": 1 << 24,
}


def check_types(known: dict, source: str) -> None:
    """Every value of the right type and range, named by its key when it is not."""
    for key in _POSITIVE_INTS:
        if key in known:
            v, name = known[key], key.removesuffix("_override")  # config.json's own name
            if isinstance(v, float) and v.is_integer() and 1 <= v <= _LIMITS[key]:
                v = known[key] = int(v)  # 1e3 in JSON is a float
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ModelError(f"{source}: {name} must be a positive integer, got {v!r}")
            if v > _LIMITS[key]:
                raise ModelError(
                    f"{source}: {name} {v:,} is beyond any supported model (at most "
                    f"{_LIMITS[key]:,} here); is config.json damaged?"
                )
    for key in _POSITIVE_FLOATS:
        if key in known:
            v = known[key]
            if not _positive(v):
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
