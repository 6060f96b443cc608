"""Rotary position embeddings of every supported family, as one value: `Rope`.

A rope type only changes the rotation frequencies (and, for LongRoPE, a factor on the rotated
features); the rotation itself is `mx.fast.rope` (non-traditional: halves rotated, as
Hugging Face's `rotate_half`), whose `offset` may be a per-row array. The frequencies are
computed as `transformers.modeling_rope_utils` computes its inverse frequencies:

    default   base ** (2i / dims)                          (Qwen2, Qwen3, Llama 2, Gemma local)
    linear    the same, positions divided by `factor`        (Gemma 3 4B+ global layers)
    llama3    low frequencies divided by `factor`, a smooth ramp between `low_freq_factor` and
              `high_freq_factor` wavelengths                (Llama 3.1 / 3.2)
    longrope  `short_factor[i] * base ** (2i / dims)`, the rotated features multiplied by
              sqrt(1 + ln(factor) / ln(original_max_position_embeddings))   (Phi-3, Phi-4-mini)

`dims` below `head_dim` (partial rotary): only the first `dims` features turn. LongRoPE's
`long_factor` is never used: the config caps the context where it would begin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

ROPE_TYPES = ("default", "linear", "llama3", "longrope")


@dataclass(frozen=True)
class Rope:
    dims: int  # features rotated (head_dim, or less with partial rotary)
    base: float
    scaling: tuple = ()  # sorted (key, value) items of the rope-scaling parameters, type included

    @property
    def params(self) -> dict:
        return dict(self.scaling)

    @property
    def kind(self) -> str:
        return self.params.get("rope_type", "default")

    def freqs(self) -> np.ndarray | None:
        """Wavelengths / 2pi of each rotated pair (mx.fast.rope's `freqs`); None for plain `base`."""
        p, kind = self.params, self.kind
        if kind in ("default", "linear"):
            return None
        inv = 1.0 / self.base ** (
            np.arange(0, self.dims, 2, dtype=np.int64).astype(np.float32) / self.dims
        )
        if kind == "longrope":
            inv = 1.0 / (np.asarray(p["short_factor"], np.float32) / inv)
        else:  # llama3
            factor, lo, hi = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
            old = p["original_max_position_embeddings"]
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > old / lo, inv / factor, inv)
            smooth = (old / wavelen - lo) / (hi - lo)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
            inv = np.where(medium, smoothed, scaled)
        return (1.0 / inv).astype(np.float32)

    def feature_scale(self) -> float:
        """LongRoPE's attention factor on the rotated features (1 for the others)."""
        p = self.params
        if self.kind != "longrope":
            return 1.0
        if p.get("attention_factor") is not None:
            return float(p["attention_factor"])
        factor = p["factor"]
        if factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(factor) / math.log(p["original_max_position_embeddings"]))

    def make(self) -> RopeFn:
        freqs = self.freqs()
        scale = 1.0 / self.params["factor"] if self.kind == "linear" else 1.0
        return RopeFn(
            self.dims,
            self.base,
            None if freqs is None else mx.array(freqs),
            scale,
            self.feature_scale(),
        )


class RopeFn:
    """The rotation of one rope: call with (B, H, L, hd) and offsets (B,) or an int, or a
    position a token (B, L)."""

    def __init__(self, dims, base, freqs, scale, feature_scale):
        self.dims, self.base, self.freqs, self.scale = dims, base, freqs, scale
        self.feature_scale = feature_scale

    def __call__(self, x: mx.array, offset: mx.array | int) -> mx.array:
        if isinstance(offset, mx.array) and offset.ndim == 2:  # each token a row of its own
            B, H, L, D = x.shape
            y = self(x.transpose(0, 2, 1, 3).reshape(B * L, H, 1, D), offset.reshape(-1))
            return y.reshape(B, L, H, D).transpose(0, 2, 1, 3)
        if self.feature_scale != 1.0:
            x = x.at[..., : self.dims].multiply(self.feature_scale)
        if self.freqs is None:
            return mx.fast.rope(
                x, self.dims, traditional=False, base=self.base, scale=self.scale, offset=offset
            )
        return mx.fast.rope(
            x,
            self.dims,
            traditional=False,
            base=None,
            scale=self.scale,
            offset=offset,
            freqs=self.freqs,
        )
