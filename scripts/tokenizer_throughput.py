"""Does tokenization keep up with the lanes? Tokens/s of the tokenizer against the lanes' (docs/benchmarks.md, "Tokenization").

    python scripts/tokenizer_throughput.py --tickets 100000 --threads 1 2 --repeats 3 \\
        --model /tmp/tok_tiny --model /tmp/tok_q05b

Tokenizer: per-text `PromptTokenizer.prompt` against one batch `prompts` call on the same
synthetic tickets, each thread count in its own process (the tokenizers library's Rayon pool
is sized once per process, from RAYON_NUM_THREADS). Lanes: `Engine.score_batches` on greedy
batches of <= 2,048 padded tokens spread over the plan, after one warm-up batch (the best of
two passes). Both count fed tokens (the prompt minus the shared prefix), so the ratio is also
texts/s : items/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from mlxbatch.bench.workload import INTENTS, generate
from mlxbatch.engine.prompt import default_system_prompt

SYSTEM = default_system_prompt(INTENTS)


def tokenizer_run(tickets: int, repeats: int) -> dict:
    """In this process (RAYON_NUM_THREADS already set): per-text and batch timings."""
    from mlxbatch.engine.layout import split
    from mlxbatch.model.convert import qwen_tokenizer_dir
    from mlxbatch.model.tokenizer import PromptTokenizer

    tok = PromptTokenizer(qwen_tokenizer_dir())
    texts = [row["text"] for row in generate(tickets)]
    shared = tok.shared_prefix(SYSTEM)
    tok.prompts(SYSTEM, texts[:1000])  # warm the Rayon pool and the tokenizer's cache
    single, batch, rust = [], [], []
    for _ in range(repeats):  # interleaved, so a burst of load hits both alike
        t = time.perf_counter()
        gold = [tok.prompt(SYSTEM, text) for text in texts]
        single.append(time.perf_counter() - t)
        del gold
        t = time.perf_counter()
        prompts = tok.prompts(SYSTEM, texts)
        batch.append(time.perf_counter() - t)
        t = time.perf_counter()  # the Rust call alone: the part that runs without the GIL
        tok._tok.encode_batch_fast([f"user\n{text}" for text in texts], add_special_tokens=False)
        rust.append(time.perf_counter() - t)
    fed = sum(len(split(p, shared)[1]) for p in prompts)
    return {
        "tickets": tickets,
        "fed_tokens": fed,
        "single_s": single,
        "batch_s": batch,
        "rust_s": rust,
        "load": os.getloadavg(),
    }


def tokenizer(tickets: int, threads: int, repeats: int) -> dict:
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--tickets",
        str(tickets),
        "--repeats",
        str(repeats),
    ]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return {"threads": threads, **json.loads(out.splitlines()[-1])}


def lanes(model_dir: str, tickets: int, batches: int, budget: int) -> dict:
    """Fed tokens/s of the fast path on `batches` greedy batches spread over one plan."""
    from mlxbatch.engine.engine import Engine
    from mlxbatch.engine.labels import LabelSet
    from mlxbatch.engine.planner import DEFAULT_MAX_BATCH, plan_batches
    from mlxbatch.model.load import load_model

    lm = load_model(model_dir)
    labels = LabelSet.build(INTENTS, lm.tokenizer.label, lm.model.args.vocab_size)
    engine = Engine(lm, labels, SYSTEM)
    prompts = engine.prompts([row["text"] for row in generate(tickets)])
    fed = engine.fed_lengths(prompts)
    plan = plan_batches(fed, "greedy", budget, DEFAULT_MAX_BATCH)
    step = max(1, len(plan) // (batches + 1))
    chosen = plan[step::step][:batches]  # skip the longest-first head: typical batches
    rows = [[prompts[i] for i in b.indices] for b in chosen]
    engine.score_batches([[prompts[i] for i in plan[0].indices]])  # warm-up (buffers, BLAS)
    t = time.perf_counter()
    engine.score_batches(rows)
    seconds = time.perf_counter() - t
    # The windowed job: the next window (as many texts as these batches hold) tokenized in a
    # thread while the lanes score this one. Same batches again, the tokenizer alongside.
    window = [row["text"] for row in generate(sum(map(len, rows)), seed=1)]
    tokenized = {}

    def tokenize() -> None:
        t0 = time.perf_counter()
        engine.prompts(window)
        tokenized["seconds"] = time.perf_counter() - t0

    thread = threading.Thread(target=tokenize)
    t = time.perf_counter()
    thread.start()
    engine.score_batches(rows)
    overlapped = time.perf_counter() - t
    thread.join()
    t = time.perf_counter()  # alone again: the first timed pass may still be warming up
    engine.score_batches(rows)
    seconds = min(seconds, time.perf_counter() - t)
    return {
        "model": model_dir,
        "batches": len(chosen),
        "seconds": seconds,
        "fed_tokens": sum(fed[i] for b in chosen for i in b.indices),
        "padded_tokens": sum(b.padded_tokens for b in chosen),
        "rows": sum(len(b.indices) for b in chosen),
        "overlapped": overlapped,
        "tokenizer_alongside": tokenized["seconds"],
        "load": os.getloadavg(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tickets", type=int, default=100_000)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", action="append", default=[], help="model dir for the lanes")
    p.add_argument("--lane-tickets", type=int, default=6_000)
    p.add_argument("--lane-batches", type=int, default=6)
    p.add_argument("--budget", type=int, default=2_048, help="padded tokens a batch")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(tokenizer_run(args.tickets, args.repeats)))
        return

    print(f"load average at start: {os.getloadavg()}, cores: {os.cpu_count()}")
    best = 0.0
    for threads in args.threads:
        r = tokenizer(args.tickets, threads, args.repeats)
        n, fed = r["tickets"], r["fed_tokens"]
        for name in ("single_s", "batch_s"):
            med = statistics.median(r[name])
            print(
                f"tokenizer RAYON_NUM_THREADS={threads} {name[:-2]:6}: {fed / med:>10,.0f} fed "
                f"tokens/s {n / med:>8,.0f} texts/s (median of {[round(s, 2) for s in r[name]]} "
                f"s, {n:,} tickets, {fed:,} fed tokens)"
            )
        ratios = [s / b for s, b in zip(r["single_s"], r["batch_s"])]
        gil_free = [rust / b for rust, b in zip(r["rust_s"], r["batch_s"])]
        print(
            f"  batch over per-text, each repeat: {[round(x, 2) for x in ratios]}; share of the "
            f"batch call in Rust without the GIL: {[round(x, 2) for x in gil_free]}; load "
            f"{[round(x, 1) for x in r['load']]}"
        )
        best = max(best, fed / statistics.median(r["batch_s"]))
    for model in args.model:
        r = lanes(model, args.lane_tickets, args.lane_batches, args.budget)
        rate = r["fed_tokens"] / r["seconds"]
        print(
            f"lanes {model}: {rate:>10,.0f} fed tokens/s, "
            f"{r['padded_tokens'] / r['seconds']:,.0f} padded tokens/s, "
            f"{r['rows'] / r['seconds']:,.1f} items/s ({r['batches']} batches, {r['rows']} rows, "
            f"{r['seconds']:.2f} s; load {[round(x, 1) for x in r['load']]})"
        )
        print(f"  tokenizer (batch, best thread count) : lanes = {best / rate:,.1f} : 1")
        print(
            f"  the same batches with the next window ({r['rows']} texts) tokenized alongside "
            f"in a thread: {r['overlapped']:.2f} s against {r['seconds']:.2f} s alone "
            f"({r['overlapped'] / r['seconds'] - 1:+.1%}); the tokenizer took "
            f"{r['tokenizer_alongside']:.2f} s of it"
        )


if __name__ == "__main__":
    main()
