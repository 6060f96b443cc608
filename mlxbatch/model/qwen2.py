"""The Qwen2/Qwen2.5 decoder in MLX, with Hugging Face parameter names.

The forward takes explicit inputs only: tokens, a KV cache (or None), per-row rotary offsets,
and an attention mask. It returns final-normed hidden states; the output head is a separate
step (`Qwen2.head`) that projects chosen positions onto chosen vocabulary rows.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from . import hostops
from .cache import KVCache
from .config import ModelArgs
from .quantize import row_weights

Mask = mx.array | str | None  # bool (B, 1, Lq, Lk), "causal", or None
EVAL_EACH_LAYER = True  # on the host-kernel path (see Qwen2.__call__); off only to measure it


def linear(layer: nn.Module, x: mx.array, host_kernels: bool) -> mx.array:
    """`layer(x)`; on the host-kernel path, each row's result independent of the other rows
    (OpenBLAS picks its kernel by the row count: see hostops.py)."""
    if not host_kernels or type(layer) is not nn.Linear:
        return layer(x)
    return hostops.matmul_t(x, layer.weight, layer.bias if "bias" in layer else None)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        d, hd = args.hidden_size, args.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = (
            args.num_attention_heads,
            args.num_key_value_heads,
            hd,
        )
        self.rope_theta = args.rope_theta
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=True)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=True)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=True)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)

    def __call__(
        self, x: mx.array, cache: KVCache | None, layer: int, offsets: mx.array | int, mask: Mask,
        host_state: hostops.Host | None = None, keep: mx.array | None = None,
    ) -> mx.array:  # fmt: skip
        """Keys and values for every position; queries for every position, or with `keep`
        (B,) only for position keep[b] of row b (then `mask` is that row's (B, 1, 1, S))."""
        B, L, _ = x.shape
        on_host = host_state is not None
        k = linear(self.k_proj, x, on_host).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = linear(self.v_proj, x, on_host).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        rope = dict(traditional=False, base=self.rope_theta, scale=1.0)
        k = mx.fast.rope(k, self.head_dim, offset=offsets, **rope)
        if keep is not None:
            x, offsets, L = x[mx.arange(B), keep][:, None], offsets + keep, 1
        q = linear(self.q_proj, x, on_host).reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
        q = mx.fast.rope(q, self.head_dim, offset=offsets, **rope)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, KV, offset + L, hd)
        scale = self.head_dim**-0.5
        if host_state is None:
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
        else:
            o = hostops.attention(q, k, v, scale, host_state)
        return linear(self.o_proj, o.transpose(0, 2, 1, 3).reshape(B, L, -1), on_host)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def __call__(self, x: mx.array, host_kernels: bool = False) -> mx.array:
        if host_kernels:
            g, u = linear(self.gate_proj, x, True), linear(self.up_proj, x, True)
            return linear(self.down_proj, hostops.silu_mul(g, u), True)
        g = self.gate_proj(x)
        # SiLU as g / (1 + exp(-g)): the same function, and MLX's CPU exp is ~1.4x its sigmoid
        return self.down_proj(g / (1 + mx.exp(-g)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x, cache, layer, offsets, mask, host_state: hostops.Host | None = None,
                 keep: mx.array | None = None):  # fmt: skip
        r = x if keep is None else x[mx.arange(x.shape[0]), keep][:, None]
        h = r + self.self_attn(self.input_layernorm(x), cache, layer, offsets, mask, host_state,
                               keep)  # fmt: skip
        out = h + self.mlp(self.post_attention_layernorm(h), host_state is not None)
        if host_state is not None and EVAL_EACH_LAYER:  # see Qwen2.__call__
            mx.eval(out)
        return out


class Qwen2Body(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Qwen2(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Qwen2Body(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(
        self,
        tokens: mx.array,  # (B, L) int
        cache: KVCache | None = None,
        offsets: mx.array | int = 0,  # rotary position of each row's first token: (B,) or int
        mask: Mask = "causal",
        host_kernels: bool = False,
        keep: mx.array | None = None,
    ) -> mx.array:
        """Final-normed hidden states (B, L, D); `cache` advances by L.

        `host_kernels=True` runs SiLU and the attention softmax as host kernels (see hostops.py):
        the forward then evaluates inside, layer by layer. Float32 on the CPU only. It also
        evaluates each layer's output: with CPU lanes running at once, graphs spanning two
        layers ran ~18% slower than these (measured, scripts/lane_concurrency.py).
        `keep` (B,): only position keep[b] of each row is wanted, so the last layer computes
        queries, attention output and MLP for those positions alone (keys and values for all):
        the result is (B, 1, D). Needs an array mask.
        """
        x = self.model.embed_tokens(tokens)
        L = tokens.shape[1]
        start = cache.offset if cache is not None else 0
        S = start + L
        state = hostops.prepare(mask, L, S, start) if host_kernels else None
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            if keep is not None and i == last:
                if not isinstance(mask, mx.array):
                    raise ValueError("keep needs an array mask")
                mask = mx.take_along_axis(mask, keep[:, None, None, None], axis=2)  # (B,1,1,S)
                state = hostops.prepare(mask, 1, S, start) if host_kernels else None
                x = layer(x, cache, i, offsets, mask, state, keep)
                break
            x = layer(x, cache, i, offsets, mask, state)
        if cache is not None:
            cache.advance(tokens.shape[1])
        return self.model.norm(x)

    def head_layer(self) -> nn.Module:
        """The output projection: the embedding when tied, else `lm_head` (dense or quantized)."""
        return self.model.embed_tokens if self.args.tie_word_embeddings else self.lm_head

    def head(self, h: mx.array, rows: mx.array | None = None, host_kernels: bool = False):
        """Logits of hidden states `h` (..., D) for vocabulary `rows` (all when None); with
        `rows` or `host_kernels`, each row's logits are the same whatever the other rows (see
        hostops.py)."""
        layer = self.head_layer()
        if rows is None and host_kernels:  # float32 on the CPU: the weights are dense
            return hostops.matmul_t(h, layer.weight)
        if rows is None:
            return layer.as_linear(h) if self.args.tie_word_embeddings else layer(h)
        return hostops.matmul_t(h, row_weights(layer, rows))

    def num_parameters(self) -> int:
        from mlx.utils import tree_flatten

        return sum(v.size for _, v in tree_flatten(self.parameters()))
