"""Vision-language checkpoints whose language model is a supported family (Gemma 3 4B+): the
language model alone is run, as mlx-lm does, from `text_config` and its tensors."""

from __future__ import annotations

from ..errors import ModelError
from .families import FAMILIES

# the language model's tensors as transformers 5 and the published checkpoints name them, as
# transformers 4.52-4.57 saved them, and the head's (mlx-lm's and mlx-vlm's converts keep the first)
RENAMES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
OTHER_TOWERS = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)


def text_types() -> dict[str, str]:
    """A vision-language model_type -> its language model's (`Family.vision_language_type`)."""
    return {f.vision_language_type: t for t, f in FAMILIES.items() if f.vision_language_type}


def is_vision_language(cfg: dict) -> bool:
    model_type = cfg.get("model_type")
    return isinstance(model_type, str) and model_type in text_types()  # (a list: unhashable)


def text_config(cfg: dict, source: str) -> dict:
    """The language model's config of a vision-language `cfg` (outer keys filled in); else `cfg`."""
    if not is_vision_language(cfg):
        return cfg
    inner = cfg.get("text_config") or {}  # absent or null: every default, as transformers
    if not isinstance(inner, dict):
        raise ModelError(f"{source}: text_config must be an object, got {type(inner).__name__}")
    outer = {k: cfg[k] for k in ("tie_word_embeddings", "vocab_size") if k in cfg}
    return outer | inner | {"model_type": text_types()[cfg["model_type"]]}


def text_tensor(name: str) -> str | None:
    """A vision-language checkpoint's tensor by the language model's name; None for the others."""
    if name.startswith(OTHER_TOWERS):
        return None
    for old, new in RENAMES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name
