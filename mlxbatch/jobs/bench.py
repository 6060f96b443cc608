"""`mlxbatch bench`: every mode on the same tickets in one process, against the gold loop."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import mlx.core as mx
import numpy as np

from ..engine.engine import Engine
from ..engine.planner import Batch, global_max_stats, padding_stats, plan_batches
from .classifier import Classifier


@dataclass
class ModeResult:
    name: str
    seconds: float
    items: int
    processed_tokens: int  # every token fed through the model, padding and prefixes included
    useful_tokens: int  # the least an exact method must feed: the prefix once + every item's own
    padding_overhead: float
    agreement: float  # label agreement with the gold loop
    max_abs_diff: float | None  # largest |probability difference| from the gold loop
    peak_memory: int
    useful_flops: float
    batches: int
    settings: dict = field(default_factory=dict)

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds


def flops_per_item(clf: Classifier, start: int, n: int) -> float:
    """Forward FLOPs of `n` tokens at positions [start, start + n): matmuls + attention."""
    a = clf.lm.model.args
    hd = a.head_dim
    dense = a.hidden_size * (a.num_attention_heads + 2 * a.num_key_value_heads) * hd
    dense += a.num_attention_heads * hd * a.hidden_size + 3 * a.hidden_size * a.intermediate_size
    attn = 4 * a.num_attention_heads * hd * (n * start + n * (n + 1) / 2)  # QK^T and PV
    return a.num_hidden_layers * (2 * dense * n + attn)


def useful(clf: Classifier, prompts: list[list[int]]) -> tuple[int, float]:
    """Useful tokens and FLOPs: the shared prefix once, then each item's own tokens."""
    P = len(clf.engine.tokenizer.shared_prefix(clf.system_prompt))
    tokens, flops = P, flops_per_item(clf, 0, P)
    for p in prompts:
        k = min(P, len(p) - 1)
        tokens += len(p) - k
        flops += flops_per_item(clf, k, len(p) - k)
    return tokens, flops


def run_mode(
    name: str, engine: Engine, prompts: list[list[int]], batches: list[Batch], scorer: str,
    reference: np.ndarray | None, useful_tokens: int, useful_flops: float, settings: dict,
) -> tuple[ModeResult, np.ndarray]:  # fmt: skip
    mx.synchronize()
    mx.reset_peak_memory()
    t = time.perf_counter()
    probs = engine.score_all(prompts, batches, scorer)
    seconds = time.perf_counter() - t
    gold = scorer == "gold"
    fed = [len(p) for p in prompts] if gold else engine.fed_lengths(prompts)
    stats = padding_stats(fed, batches)
    processed = stats.processed_tokens + (0 if gold else len(engine.prefix))
    ref = probs if reference is None else reference
    return ModeResult(
        name, seconds, len(prompts), processed, useful_tokens, stats.overhead,
        float((probs.argmax(1) == ref.argmax(1)).mean()), float(np.abs(probs - ref).max()),
        mx.get_peak_memory(), useful_flops, len(batches), settings,
    ), probs  # fmt: skip


def length_stats(lengths: list[int]) -> dict:
    arr = np.array(lengths)
    return {"median": float(np.median(arr)), "p90": float(np.percentile(arr, 90)),
            "max": int(arr.max()), "mean": float(arr.mean())}  # fmt: skip


def run_bench(
    clf: Classifier, texts: list[str], batch_tokens: int, max_batch: int, naive_batch: int,
    sweep: list[int], progress=print,
) -> dict:  # fmt: skip
    prompts = [clf.engine.prompt(t) for t in texts]
    tok_lengths = [len(clf.lm.tokenizer.encode(t)) for t in texts]
    fed = clf.fed_lengths(prompts)
    u_tokens, u_flops = useful(clf, prompts)
    n = len(prompts)
    runs: list[ModeResult] = []

    def go(name, engine, batches, scorer="fast", **settings):
        progress(f"running {name} ({len(batches)} batches) ...")
        res, probs = run_mode(
            name, engine, prompts, batches, scorer, ref, u_tokens, u_flops, settings
        )
        runs.append(res)
        progress(
            f"  {res.seconds:.1f} s, {res.items_per_s:.2f} items/s, agreement {res.agreement:.1%}"
        )
        return probs

    ref = None
    ref = go(
        "sequential (gold)",
        clf.engine,
        plan_batches([len(p) for p in prompts], "sequential", 1 << 30, 1),
        scorer="gold",
    )
    go("sequential + prefix cache", clf.engine, plan_batches(fed, "sequential", 1 << 30, 1))
    go(f"naive (batch {naive_batch})", clf.engine, plan_batches(fed, "naive", 1 << 30, naive_batch),
       max_batch=naive_batch)  # fmt: skip
    go("sorted (default)", clf.engine, plan_batches(fed, "sorted", batch_tokens, max_batch),
       batch_tokens=batch_tokens, max_batch=max_batch)  # fmt: skip
    for b in sweep:
        if b != batch_tokens and b >= max(fed):
            go(f"sorted, budget {b}", clf.engine, plan_batches(fed, "sorted", b, max_batch),
               batch_tokens=b, max_batch=max_batch)  # fmt: skip
    sorted_default = plan_batches(fed, "sorted", batch_tokens, max_batch)
    return {
        "items": n,
        "ticket_tokens": length_stats(tok_lengths),
        "fed_tokens": length_stats(fed),
        "padding_tax": {
            "global_max_factor": global_max_stats(fed).factor,
            "naive_factor": padding_stats(
                fed, plan_batches(fed, "naive", 1 << 30, naive_batch)
            ).factor,
            "sorted_factor": padding_stats(fed, sorted_default).factor,
            "sweep": {
                b: padding_stats(fed, plan_batches(fed, "sorted", b, max_batch)).overhead
                for b in sorted({*sweep, batch_tokens})
                if b >= max(fed)
            },
        },  # fmt: skip
        "modes": [asdict(r) | {"items_per_s": r.items_per_s} for r in runs],
        "gold_labels": [clf.labels.names[i] for i in ref.argmax(1)],
    }


def load_tickets(spec: str) -> tuple[list[str], str]:
    """A JSONL/CSV/text file, or a count of built-in synthetic tickets."""
    from ..errors import InputError
    from ..io.inputs import describe_errors, read_rows
    from ..io.tickets import generate

    if spec.isdigit():
        return [t["text"] for t in generate(int(spec))], f"{spec} synthetic tickets (seed 0)"
    rows, fmt = read_rows(spec)
    if any(r.error for r in rows):
        raise InputError(describe_errors(rows, spec, fmt))
    return [r.text for r in rows], spec


def run_peers(
    clf: Classifier, prompts, result, budget, max_batch, naive_batch, progress
) -> list[dict]:
    from .peers import mlx_lm_peer, transformers_peer

    if clf.labels.max_len > 1:
        return [{"name": "peers", "error": "peers score single-token labels only"}]
    names = list(clf.labels.names)
    gold = [names.index(x) for x in result["gold_labels"]]
    ids = clf.labels.first_ids
    out = []
    for name, run in (
        ("mlx-lm", lambda: mlx_lm_peer(clf.lm.path, prompts, ids, gold, naive_batch)),
        ("transformers", lambda: transformers_peer(clf.lm.path, prompts, ids, gold, budget, max_batch)),
    ):  # fmt: skip
        progress(f"running peer {name} ...")
        try:
            out.append(run())
        except ImportError as e:
            out.append({"name": name, "error": f"not installed ({e.name})"})
    return out


def bench_job(
    model, tickets_spec: str, batch_tokens: int | None, max_batch: int, naive_batch: int,
    sweep: list[int], peers: bool, quick: bool, resolve, progress=print, json_path=None,
    plot_path=None,
) -> tuple[dict, str]:  # fmt: skip
    """The whole `bench` command: model, tickets, modes, peers, report, JSON and plot."""
    import json
    import tempfile
    from pathlib import Path

    from ..model.convert import init_random
    from .doctor import report as doctor_report
    from .report import format_report, plot

    with tempfile.TemporaryDirectory() as tmp:
        if quick:
            model = Path(tmp) / "tiny"
            init_random(model, preset="tiny", seed=0, dtype="float32")
            tickets_spec = "60" if tickets_spec == "600" else tickets_spec
        texts, source = load_tickets(tickets_spec)
        clf = Classifier.load(resolve(model))
        prompts = [clf.engine.prompt(t) for t in texts]
        budget = batch_tokens or clf.default_batch_tokens(max_batch, max(clf.fed_lengths(prompts)))
        info = doctor_report(2048 if not quick else 512)
        result = run_bench(clf, texts, budget, max_batch, naive_batch, sweep, progress=progress)
        result["meta"] = {
            "model": clf.lm.describe(), "tickets": source, "device": info["device"],
            "device_name": info["device_name"], "dtype": info["dtype"],
            "blas": info["blas_kernels"] or info["blas"],
            "peak_matmul_gflops": info[f"matmul_gflops_{info['dtype']}"], "doctor": info,
        }  # fmt: skip
        if peers:
            result["peers"] = run_peers(
                clf, prompts, result, budget, max_batch, naive_batch, progress
            )
    text = format_report(result)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, default=str) + "\n")
    if plot_path:
        plot(result, plot_path, [len(clf.lm.tokenizer.encode(t)) for t in texts])
    return result, text
