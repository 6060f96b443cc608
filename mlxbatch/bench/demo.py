"""`mlxbatch demo`: the main job on the built-in default, verified, with a short report."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from ..api.classifier import Classifier
from ..api.spec import RunSpec
from ..io.inputs import read_rows
from ..jobs.job import run_job
from .workload import generate, write_jsonl


def run_demo(n: int, model: Path, out_dir: Path, progress=print) -> tuple[list[str], bool]:
    """Classify `n` synthetic tickets with sorted batching and --verify; (report lines, passed)."""
    t0 = time.perf_counter()
    src, out = out_dir / "tickets.jsonl", out_dir / "predictions.jsonl"
    tickets = generate(n)
    write_jsonl(tickets, src)
    clf = Classifier.load(model)
    progress(f"classifying {n} synthetic tickets from {src} ...")
    rows, fmt = read_rows(str(src))
    # off a terminal (a log, CI) a line every 10 s: else minutes pass with nothing printed
    spec = RunSpec(progress_every=10.0)
    res = run_job(clf, rows, spec, out, resume=False, verify=True, source=str(src), fmt=fmt)
    preds = [json.loads(x) for x in out.read_text().splitlines()]
    v = res.verify
    counts = Counter(p["label"] for p in preds)
    acc = sum(p["label"] == t["intent"] for p, t in zip(preds, tickets)) / n
    note = " (synthetic weights: chance level is expected)" if clf.lm.synthetic else ""
    lines = [
        f"model: {clf.lm.describe()}",
        f"wrote {out}: {res.summary()}",
        f"gold sequential loop: {v['items'] / v['seconds']:.2f} items/s; sorted batching is "
        f"{v['seconds'] / res.seconds:.2f}x faster, {v['agreement']:.1%} label agreement "
        f"(max |score diff| {v['max_abs_score_diff']:.1e})",
        "labels: " + ", ".join(f"{k} {counts[k]}" for k in clf.labels.names),
        f"accuracy against the generator's intents: {acc:.1%}{note}",
        f"demo: {time.perf_counter() - t0:.0f} s in all ({res.seconds:.0f} s classifying, "
        f"{v['seconds']:.0f} s the gold loop's verification, the rest loading; on a "
        "machine's first job also calibrating the planner, once)",
    ]
    return lines, v["passed"]
