"""Per-stage time of one batch on one CPU lane: where a batch's time goes (docs/benchmarks.md).

    python scripts/profile_batch.py [MODEL] [--rows 16] [--width 96]

Runs the fast path's forward stage by stage on one lane (one thread, BLAS single-threaded, as
each lane runs), evaluating after every stage, and prints each stage's total over the layers
with the matmul stages' rate. Evaluating between stages costs a little overlap, so the stages
sum to slightly more than the fused forward, which is timed too (the last lines). The MLX
elementwise variants (SiLU and softmax on MLX's own CPU kernels, as before the host kernels)
are timed alongside for comparison.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from mlxbatch.runtime import blas, sgemm

blas.activate_in_process()

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlxbatch.engine.labels import LabelSet  # noqa: E402
from mlxbatch.engine.layout import RowLayout  # noqa: E402
from mlxbatch.engine.prompt import DEFAULT_LABELS, default_system_prompt  # noqa: E402
from mlxbatch.model import hostops  # noqa: E402
from mlxbatch.model.cache import KVCache  # noqa: E402
from mlxbatch.model.load import load_model  # noqa: E402
from mlxbatch.runtime import memory  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="weights/qwen2.5-0.5b-synthetic")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--width", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    lm = load_model(a.model)
    m, args = lm.model, lm.model.args
    labels = LabelSet.build(DEFAULT_LABELS, lm.tokenizer.label, args.vocab_size)
    prefix = lm.tokenizer.shared_prefix(default_system_prompt(DEFAULT_LABELS), ())
    rng = np.random.default_rng(0)
    prompts = [prefix + list(rng.integers(1000, 30000, a.width)) for _ in range(a.rows)]
    memory.keep_freed_buffers(4 << 30)
    T: dict[str, float] = defaultdict(float)
    flops: dict[str, float] = defaultdict(float)

    def timed(name, fn, *xs, fl=0.0):
        t = time.perf_counter()
        out = fn(*xs)
        if isinstance(out, (mx.array, tuple, list)):
            mx.eval(out)
        T[name] += time.perf_counter() - t
        flops[name] += fl
        return out

    pre = KVCache.allocate(
        args.num_hidden_layers, 1, args.num_key_value_heads, args.head_dim, len(prefix), mx.float32
    )
    m(mx.array([prefix]), pre, 0, "causal")
    mx.eval(pre.keys, pre.values)

    def one_pass(record: bool):
        if not record:
            T.clear()
            flops.clear()
        layout = timed(
            "host: row layout, tokens, positions, mask",
            lambda: RowLayout.build(prompts, prefix, labels.max_len - 1),
        )
        arrays = timed(
            "host: row layout, tokens, positions, mask",
            lambda: (
                mx.array(layout.tokens()),
                mx.array(layout.positions()),
                mx.array(layout.mask()),
            ),
        )
        tokens, pos, mask = arrays
        t0 = time.perf_counter()
        kv = pre.expand(layout.batch, layout.capacity)
        mx.eval(kv.keys, kv.values)
        T["cache: prefix broadcast (a new lane buffer; reused after)"] += time.perf_counter() - t0
        B, L = layout.batch, layout.width
        S = layout.prefix_width + L
        R = B * L
        d, hd, H, KV = (
            args.hidden_size,
            args.head_dim,
            args.num_attention_heads,
            args.num_key_value_heads,
        )
        inter = args.intermediate_size
        host = timed("host: additive attention mask", lambda: hostops.prepare(mask, L, S))
        x = timed("embedding", lambda: m.model.embed_tokens(tokens))
        rope = dict(traditional=False, base=args.rope_theta, scale=1.0, offset=pos)

        def rotate(t):
            return mx.fast.rope(t, hd, **rope)

        def sdpa(q, k, v):
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=hd**-0.5, mask=mask)

        def mlx_silu(g, u):
            return g / (1 + mx.exp(-g)) * u

        for i, layer in enumerate(m.model.layers):
            at, mlp = layer.self_attn, layer.mlp
            n = timed("norms and residual adds", layer.input_layernorm, x)
            q = timed("matmul: q, k, v projections", at.q_proj, n, fl=2 * R * d * H * hd)
            k = timed("matmul: q, k, v projections", at.k_proj, n, fl=2 * R * d * KV * hd)
            v = timed("matmul: q, k, v projections", at.v_proj, n, fl=2 * R * d * KV * hd)
            q, k, v = (t.reshape(B, L, -1, hd).transpose(0, 2, 1, 3) for t in (q, k, v))
            q = timed("rotary embedding", rotate, q)
            k = timed("rotary embedding", rotate, k)
            k, v = timed("cache: write keys and values", kv.update, i, k, v)
            o = timed(
                "attention (host softmax, both matmuls)",
                hostops.attention,
                q,
                k,
                v,
                hd**-0.5,
                host.mask,
                fl=4 * B * H * L * S * hd,
            )
            if record:
                timed("  compare: attention with MLX's own softmax (sdpa)", sdpa, q, k, v)
            o = o.transpose(0, 2, 1, 3).reshape(B, L, -1)
            h = timed("matmul: o projection", at.o_proj, o, fl=2 * R * H * hd * d)
            h = timed("norms and residual adds", mx.add, x, h)
            n2 = timed("norms and residual adds", layer.post_attention_layernorm, h)
            g = timed("matmul: gate, up", mlp.gate_proj, n2, fl=2 * R * d * inter)
            u = timed("matmul: gate, up", mlp.up_proj, n2, fl=2 * R * d * inter)
            if record:
                timed("  compare: SiLU x up on MLX's CPU kernels", mlx_silu, g, u)
            act = timed("SiLU x up (host)", hostops.silu_mul, g, u)
            y = timed("matmul: down", mlp.down_proj, act, fl=2 * R * inter * d)
            x = timed("norms and residual adds", mx.add, h, y)
        kv.advance(L)
        x = timed("final norm", m.model.norm, x)
        timed(
            "head: label rows at the last positions",
            m.head,
            x[mx.arange(B), mx.array(layout.last())],
            mx.array(labels.first_ids),
        )

    with sgemm.single_threaded():
        one_pass(False)
        T.clear()
        flops.clear()
        for _ in range(a.repeat):
            one_pass(True)
        fused = []
        for _ in range(a.repeat):
            layout = RowLayout.build(prompts, prefix, labels.max_len - 1)
            kv = pre.expand(layout.batch, layout.capacity)
            mx.eval(kv.keys, kv.values)
            t = time.perf_counter()
            h = m(
                mx.array(layout.tokens()),
                kv,
                mx.array(layout.positions()),
                mx.array(layout.mask()),
                host_kernels=True,
                keep=mx.array(layout.last()),
            )
            mx.eval(m.head(h[:, 0], mx.array(labels.first_ids)))
            fused.append(time.perf_counter() - t)
    r = a.repeat
    total = sum(v for k, v in T.items() if not k.startswith("  "))
    print(
        f"one lane (one thread, BLAS single-threaded), {a.rows} rows x {a.width} tokens behind "
        f"{len(prefix)} prefix tokens; {args.num_hidden_layers} layers; per batch, mean of {r}"
    )
    print(f"{'stage':58s} {'ms':>8s} {'share':>6s} {'GFLOP/s':>8s}")
    for k, v in sorted(T.items(), key=lambda kv_: (kv_[0].startswith("  "), -kv_[1])):
        rate = f"{flops[k] / v / 1e9:8.1f}" if flops[k] else ""
        share = "" if k.startswith("  ") else f"{v / total:6.1%}"
        print(f"{k:58s} {v / r * 1e3:8.1f} {share:>6s} {rate:>8s}")
    mm = sum(v for k, v in T.items() if k.startswith("matmul"))
    print(f"{'sum of stages (evaluated one by one)':58s} {total / r * 1e3:8.1f}")
    print(
        f"{'the fused forward + head (host kernels, last layer pruned)':58s} "
        f"{min(fused) * 1e3:8.1f}"
    )
    mm_flops = sum(v for k, v in flops.items() if k.startswith("matmul"))
    print(
        f"matmul stages: {mm / total:.1%} of the staged time, at {mm_flops / mm / 1e9:.0f} GFLOP/s"
    )


if __name__ == "__main__":
    main()
