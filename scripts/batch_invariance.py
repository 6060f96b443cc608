"""Measure batch invariance of the fast path: a "needle" prompt scored alone, then at random
positions among filler prompts of other lengths (so batch widths differ), batch sizes 1..64.

    python scripts/batch_invariance.py MODEL_DIR [--labels multi] [--no-prefix] [--lanes 2]
    python scripts/batch_invariance.py MODEL_DIR --localise   # which op of which layer leaks
    python scripts/batch_invariance.py MODEL_DIR --time 120   # seconds to score 120 tickets

Prints the largest difference between the needle's probabilities alone and in a batch, and
with --localise the largest difference of the needle row's intermediates, op by op and layer
by layer (the first op that differs is where the leak starts).
"""

from __future__ import annotations

import argparse
import random
import time

from mlxbatch.runtime import blas

blas.activate_in_process()

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlxbatch.bench.workload import generate  # noqa: E402
from mlxbatch.engine import scorers  # noqa: E402
from mlxbatch.engine.engine import Engine  # noqa: E402
from mlxbatch.engine.labels import LabelSet  # noqa: E402
from mlxbatch.engine.prompt import default_system_prompt  # noqa: E402
from mlxbatch.model import hostops, qwen2  # noqa: E402
from mlxbatch.model.load import load_model  # noqa: E402
from mlxbatch.runtime.executor import CpuLanes, SingleStream  # noqa: E402

LABELS = {
    "single": ("billing", "technical", "account"),
    "multi": ("billing issue", "technical problem", "account access"),
}


def make_engine(lm, labels: str, prefix: bool, lanes: int, examples=()) -> Engine:
    names = LABELS[labels]
    label_set = LabelSet.build(names, lm.tokenizer.label, lm.model.args.vocab_size)
    ex = CpuLanes(lanes) if lanes > 1 else SingleStream()
    return Engine(lm, label_set, default_system_prompt(names), prefix, ex, examples)


def needle_runs(e: Engine, prompts: list[list[int]], sizes: list[int], trials: int, seed: int):
    """Yield (size, position, width, max |needle alone - needle in batch|)."""
    r = random.Random(seed)
    needle, fillers = prompts[0], prompts[1:]
    alone = e.score_batch([needle])[0]
    for size in sizes:
        for _ in range(trials):
            batch = r.sample(fillers, size - 1)
            pos = r.randrange(size)
            batch.insert(pos, needle)
            got = e.score_batch(batch)[pos]
            width = max(len(e.fed(p)) for p in batch)
            yield size, pos, width, float(np.abs(got.astype(np.float64) - alone).max())


class Recorder:
    """Wraps the forward's ops to keep the needle row's intermediates (real positions only)."""

    def __init__(self):
        self.on, self.row, self.n, self.log = False, 0, 0, []
        self._attn, self._silu = hostops.attention, hostops.silu_mul
        self._layer = qwen2.DecoderLayer.__call__
        rec = self

        def attention(q, k, v, scale, mask):
            out = rec._attn(q, k, v, scale, mask)
            rec.keep("attn", out, axis=2)
            return out

        def silu_mul(g, u):
            out = rec._silu(g, u)
            rec.keep("silu", out, axis=1)
            return out

        def layer(self_, x, *a, **kw):
            out = rec._layer(self_, x, *a, **kw)
            rec.keep("layer", out, axis=1)
            return out

        hostops.attention, hostops.silu_mul = attention, silu_mul
        qwen2.DecoderLayer.__call__ = layer

    def keep(self, name: str, a: mx.array, axis: int) -> None:
        if not self.on:
            return
        x = np.array(a[self.row])  # drop the batch axis
        axis -= 1
        if x.shape[axis] > 1:
            x = np.take(x, np.arange(self.n), axis=axis)
        self.log.append((name, x))


def localise(e: Engine, prompts: list[list[int]], sizes: list[int], seed: int) -> None:
    rec = Recorder()
    r = random.Random(seed)
    needle = prompts[0]
    rec.n = len(e.fed(needle))

    def run(batch, pos):
        rec.on, rec.row, rec.log = True, pos, []
        e.score_batch(batch)
        rec.on = False
        return rec.log

    alone = run([needle], 0)
    for size in sizes:
        batch = r.sample(prompts[1:], size - 1)
        pos = r.randrange(size)
        batch.insert(pos, needle)
        width = max(len(e.fed(p)) for p in batch)
        got = run(batch, pos)
        first = None
        layer = 0
        diffs = []
        for (name, a), (_, b) in zip(alone, got):
            d = float(np.abs(a - b).max()) if a.shape == b.shape else float("nan")
            diffs.append(f"{name}{layer}:{d:.1e}")
            if d != 0 and first is None:
                first = f"{name} of layer {layer}"
            layer += name == "layer"
        print(f"B={size:3d} pos={pos:3d} width={width:4d} first leak: {first}")
        print("   ", " ".join(diffs))


def timing(e: Engine, texts: list[str], budget: int, repeats: int) -> list[float]:
    from mlxbatch.engine.planner import plan_batches

    prompts = [e.prompt(t) for t in texts]
    batches = plan_batches(e.fed_lengths(prompts), "greedy", budget, 64)
    grouped = [[prompts[i] for i in b.indices] for b in batches]
    e.score_batches(grouped)  # warm: buffers, BLAS threads
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        e.score_batches(grouped)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--labels", choices=list(LABELS), default="single")
    ap.add_argument("--no-prefix", action="store_true")
    ap.add_argument("--lanes", type=int, default=1)
    ap.add_argument("--sizes", default="1,2,3,4,5,7,8,9,13,16,17,24,31,32,33,48,64")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=0, help="PREFILL_CHUNK, with examples")
    ap.add_argument("--localise", action="store_true")
    ap.add_argument("--time", type=int, default=0, help="tickets to time scoring (A/B)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    lm = load_model(args.model)
    examples = ()
    if args.chunk:
        scorers.PREFILL_CHUNK = args.chunk
        examples = tuple((t["text"], t["intent"]) for t in generate(6, seed=9))
    e = make_engine(lm, args.labels, not args.no_prefix, args.lanes, examples)
    if args.time:
        texts = [t["text"] for t in generate(args.time, seed=args.seed)]
        secs = timing(e, texts, 2048, 1)
        print(f"scored {args.time} tickets in {min(secs):.3f}s (best of {len(secs)})")
        return
    texts = [t["text"] for t in generate(120, seed=args.seed)]
    prompts = [e.prompt(t) for t in texts]
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.localise:
        localise(e, prompts, sizes, args.seed)
        return
    worst, leaks, runs = 0.0, 0, 0
    for size, pos, width, d in needle_runs(e, prompts, sizes, args.trials, args.seed):
        runs += 1
        leaks += d != 0
        worst = max(worst, d)
        print(f"B={size:3d} pos={pos:3d} width={width:4d} max|diff|={d:.3e}")
    print(f"{leaks}/{runs} batches changed the needle's probabilities; max |diff| {worst:.3e}")


if __name__ == "__main__":
    main()
