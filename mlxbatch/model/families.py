"""The supported families by `model_type` (see family.py; one module each)."""

from __future__ import annotations

from . import gemma3, llama, phi3, qwen2, qwen3
from .family import Family

FAMILIES: dict[str, Family] = {
    "qwen2": qwen2.FAMILY,
    "qwen3": qwen3.FAMILY,
    "llama": llama.FAMILY,
    "mistral": llama.MISTRAL,
    "gemma3_text": gemma3.FAMILY,
    "phi3": phi3.FAMILY,
}
