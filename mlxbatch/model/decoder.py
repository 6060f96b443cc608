"""The decoder of every supported family in MLX, with Hugging Face parameter names: a family
(family.py) sets its block's norms, attention and MLP; the forward takes explicit inputs only
and returns final-normed hidden states (the head is `Decoder.head`)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from . import hostops
from .cache import KVCache
from .config import SLIDING, ModelArgs
from .quantize import row_weights

Mask = mx.array | str | None  # bool (B, 1, Lq, Lk), "causal", or None
EVAL_EACH_LAYER = True  # on the host-kernel path (see Decoder.__call__); off only to measure it


def sliding_mask(mask: Mask, window: int, q_len: int, k_len: int) -> mx.array:
    """`mask` restricted to each query's last `window` visible keys: transformers'
    `kv_idx > q_idx - sliding_window`, since our masks show a query its positions in order."""
    if mask is None or isinstance(mask, str):  # "causal": the last q_len of k_len keys
        mask = (mx.arange(k_len)[None] <= mx.arange(k_len - q_len, k_len)[:, None])[None, None]
    later = mx.cumsum(mask.astype(mx.int32), axis=-1, reverse=True)  # visible keys at or after
    return mask & (later <= window)


class OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: scales by (1 + w) (weights stored around 0), in float32."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.weight = mx.zeros((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        w = 1.0 + self.weight.astype(mx.float32)
        return mx.fast.rms_norm(x.astype(mx.float32), w, self.eps).astype(x.dtype)


def norm(args: ModelArgs, dims: int) -> nn.Module:
    if args.family.norm_offset:
        return OffsetRMSNorm(dims, args.rms_norm_eps)
    return nn.RMSNorm(dims, eps=args.rms_norm_eps)


def linear(layer: nn.Module, x: mx.array, host_kernels: bool) -> mx.array:
    """`layer(x)`; on the host-kernel path each row's result is independent of the others."""
    if not host_kernels or type(layer) is not nn.Linear:
        return layer(x)
    return hostops.matmul_t(x, layer.weight, layer.bias if "bias" in layer else None)


def linear_rows(layer: nn.Module, x: mx.array, start: int, stop: int, host_kernels: bool):
    """Output features [start, stop) of `layer(x)` (a fused projection's part)."""
    if type(layer) is not nn.Linear:
        return layer(x)[..., start:stop]
    w = layer.weight[start:stop]
    return hostops.matmul_t(x, w) if host_kernels else x @ w.T


def kept(x: mx.array, keep: mx.array) -> mx.array:
    """The kept positions of each row of `x` (B, L, D): `keep` (B,) one a row, (B, K) several;
    (B, 1 or K, D)."""
    rows = mx.arange(x.shape[0])
    return x[rows, keep][:, None] if keep.ndim == 1 else x[rows[:, None], keep]


def kept_offsets(offsets: mx.array | int, keep: mx.array) -> mx.array:
    """The rotary positions of the kept positions: (B,) for a `keep` (B,), else (B, K)."""
    if keep.ndim == 1:
        return offsets + keep
    if isinstance(offsets, mx.array) and offsets.ndim == 2:  # a position a token
        return mx.take_along_axis(offsets, keep, axis=1)
    return (offsets[:, None] if isinstance(offsets, mx.array) else offsets) + keep


def gelu_tanh(x: mx.array) -> mx.array:
    """GELU, tanh approximation (`gelu_pytorch_tanh`), as PyTorch writes it."""
    return 0.5 * x * (1 + mx.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        fam, d, hd = args.family, args.hidden_size, args.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = (
            args.num_attention_heads,
            args.num_key_value_heads,
            hd,
        )
        self.sliding = args.layer_type(layer) == SLIDING
        self.rope = args.rope(args.layer_type(layer)).make()
        self.scale = args.attention_scale
        qkv_bias = fam.qkv_bias if fam.qkv_bias is not None else args.attention_bias
        q, kv = self.n_heads * hd, self.n_kv_heads * hd
        if fam.fused:  # Phi-3: q, k, v rows stacked in one projection
            self.qkv_proj = nn.Linear(d, q + 2 * kv, bias=False)
        else:
            self.q_proj = nn.Linear(d, q, bias=qkv_bias)
            self.k_proj = nn.Linear(d, kv, bias=qkv_bias)
            self.v_proj = nn.Linear(d, kv, bias=qkv_bias)
        self.o_proj = nn.Linear(q, d, bias=fam.qkv_bias is None and args.attention_bias)
        if fam.qk_norm:
            self.q_norm, self.k_norm = norm(args, hd), norm(args, hd)

    def _kv(self, x: mx.array, on_host: bool) -> tuple[mx.array, mx.array]:
        B, L, _ = x.shape
        if "qkv_proj" in self:
            q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
            k = linear_rows(self.qkv_proj, x, q, q + kv, on_host)
            v = linear_rows(self.qkv_proj, x, q + kv, q + 2 * kv, on_host)
        else:
            k, v = linear(self.k_proj, x, on_host), linear(self.v_proj, x, on_host)
        k = k.reshape(B, L, self.n_kv_heads, -1)
        if "k_norm" in self:
            k = self.k_norm(k)
        return k.transpose(0, 2, 1, 3), v.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)

    def _q(self, x: mx.array, on_host: bool) -> mx.array:
        B, L, _ = x.shape
        if "qkv_proj" in self:
            q = linear_rows(self.qkv_proj, x, 0, self.n_heads * self.head_dim, on_host)
        else:
            q = linear(self.q_proj, x, on_host)
        q = q.reshape(B, L, self.n_heads, -1)
        if "q_norm" in self:
            q = self.q_norm(q)
        return q.transpose(0, 2, 1, 3)

    def __call__(
        self,
        x: mx.array,
        cache: KVCache | None,
        layer: int,
        offsets: mx.array | int,
        mask: Mask,
        host_state: hostops.Host | None = None,
        keep: mx.array | None = None,
    ) -> mx.array:
        """Keys and values for every position; queries for every position, or with `keep`
        (B,) only for position keep[b] of row b (then `mask` is that row's (B, 1, 1, S)), or
        (B, K) for K positions a row (`mask` (B, 1, K, S))."""
        B, L, _ = x.shape
        on_host = host_state is not None
        k, v = self._kv(x, on_host)
        k = self.rope(k, offsets)
        if keep is not None:
            x, offsets = kept(x, keep), kept_offsets(offsets, keep)
            L = x.shape[1]
        q = self.rope(self._q(x, on_host), offsets)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, KV, offset + L, hd)
        if host_state is None:
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        else:
            o = hostops.attention(q, k, v, self.scale, host_state)
        return linear(self.o_proj, o.transpose(0, 2, 1, 3).reshape(B, L, -1), on_host)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d, i, bias = args.hidden_size, args.intermediate_size, args.mlp_bias
        if args.family.fused:  # Phi-3: gate rows first, then up
            self.gate_up_proj = nn.Linear(d, 2 * i, bias=False)
        else:
            self.gate_proj = nn.Linear(d, i, bias=bias)
            self.up_proj = nn.Linear(d, i, bias=bias)
        self.down_proj = nn.Linear(i, d, bias=bias)
        self.silu = args.hidden_act == "silu"

    def _gate_up(self, x: mx.array, on_host: bool) -> tuple[mx.array, mx.array]:
        if "gate_up_proj" in self:  # two products: `u` stays a fresh array (hostops.silu_mul)
            i = self.down_proj.weight.shape[1]
            layer = self.gate_up_proj
            return linear_rows(layer, x, 0, i, on_host), linear_rows(layer, x, i, 2 * i, on_host)
        return linear(self.gate_proj, x, on_host), linear(self.up_proj, x, on_host)

    def __call__(self, x: mx.array, host_kernels: bool = False) -> mx.array:
        if not self.silu:  # GELU-tanh (Gemma): MLX's elementwise ops on every path
            g, u = self._gate_up(x, host_kernels)
            return linear(self.down_proj, gelu_tanh(g) * u, host_kernels)
        if host_kernels:
            g, u = self._gate_up(x, True)
            return linear(self.down_proj, hostops.silu_mul(g, u), True)
        g, u = self._gate_up(x, False)
        # SiLU as g / (1 + exp(-g)): the same function, and MLX's CPU exp beats its sigmoid
        return self.down_proj(g / (1 + mx.exp(-g)) * u)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        d = args.hidden_size
        self.self_attn = Attention(args, layer)
        self.mlp = MLP(args)
        self.input_layernorm = norm(args, d)
        self.post_attention_layernorm = norm(args, d)
        if args.family.sandwich:  # Gemma 3: norms after attention, and before/after the MLP
            self.pre_feedforward_layernorm = norm(args, d)
            self.post_feedforward_layernorm = norm(args, d)
        self.sandwich = args.family.sandwich

    def __call__(
        self,
        x,
        cache,
        layer,
        offsets,
        mask,
        host_state: hostops.Host | None = None,
        keep: mx.array | None = None,
    ):
        r = x if keep is None else kept(x, keep)
        on_host = host_state is not None
        a = self.self_attn(self.input_layernorm(x), cache, layer, offsets, mask, host_state, keep)
        if self.sandwich:
            h = r + self.post_attention_layernorm(a)
            out = h + self.post_feedforward_layernorm(
                self.mlp(self.pre_feedforward_layernorm(h), on_host)
            )
        else:
            h = r + a
            out = h + self.mlp(self.post_attention_layernorm(h), on_host)
        if on_host and EVAL_EACH_LAYER:  # see Decoder.__call__
            mx.eval(out)
        return out


class Body(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.norm = norm(args, args.hidden_size)


class Decoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Body(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def embed(self, tokens: mx.array) -> mx.array:
        x = self.model.embed_tokens(tokens)
        if self.args.family.embed_scale:  # Gemma: sqrt(hidden) rounded to the weights' dtype
            x = x * mx.array(self.args.hidden_size**0.5, mx.float32).astype(x.dtype)
        return x

    def __call__(
        self,
        tokens: mx.array,  # (B, L) int
        cache: KVCache | None = None,
        offsets: mx.array | int = 0,  # rotary position of each row's first token: (B,) or int,
        # or of every token: (B, L)
        mask: Mask = "causal",
        host_kernels: bool = False,
        keep: mx.array | None = None,
    ) -> mx.array:
        """Final-normed hidden states (B, L, D); `cache` advances by L.

        `host_kernels=True` runs SiLU and the softmax as host kernels, evaluating layer by
        layer. `keep` (B,): the last layer computes only position keep[b] of each row: (B, 1, D);
        (B, K): K positions a row, (B, K, D); needs an array mask.
        """
        x = self.embed(tokens)
        L = tokens.shape[1]
        start = cache.offset if cache is not None else 0
        S = start + L
        masks = self._masks(mask, L, S)
        if keep is not None and not isinstance(mask, mx.array):
            raise ValueError("keep needs an array mask")
        states = {k: hostops.prepare(m, L, S, start) for k, m in masks.items() if host_kernels}
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            kind = layer.self_attn.sliding
            if keep is not None and i == last:
                at = keep.reshape(keep.shape[0], 1, -1, 1)
                m = mx.take_along_axis(masks[kind], at, axis=2)  # (B, 1, 1 or K, S)
                state = hostops.prepare(m, m.shape[2], S, start) if host_kernels else None
                x = layer(x, cache, i, offsets, m, state, keep)
                break
            x = layer(x, cache, i, offsets, masks[kind], states.get(kind))
        if cache is not None:
            cache.advance(tokens.shape[1])
        return self.model.norm(x)

    def _masks(self, mask: Mask, L: int, S: int) -> dict[bool, Mask]:
        """The mask of full layers (False) and, when the model has any, of sliding ones (True)."""
        masks = {False: mask}
        window = self.args.sliding_window
        if window is not None and any(layer.self_attn.sliding for layer in self.model.layers):
            masks[True] = sliding_mask(mask, window, L, S)
        return masks

    def head_layer(self) -> nn.Module:
        """The output projection: the embedding when tied, else `lm_head` (dense or quantized)."""
        return self.model.embed_tokens if self.args.tie_word_embeddings else self.lm_head

    def head(self, h: mx.array, rows: mx.array | None = None, host_kernels: bool = False):
        """Logits of `h` (..., D) for vocabulary `rows` (all when None); with `rows` or
        `host_kernels`, each row's logits are the same whatever the other rows."""
        layer = self.head_layer()
        if rows is None and host_kernels:  # float32 on the CPU: the weights are dense
            return hostops.matmul_t(h, layer.weight)
        if rows is None:
            return layer.as_linear(h) if self.args.tie_word_embeddings else layer(h)
        return hostops.matmul_t(h, row_weights(layer, rows))

    def num_parameters(self) -> int:
        from mlx.utils import tree_flatten

        return sum(v.size for _, v in tree_flatten(self.parameters()))
