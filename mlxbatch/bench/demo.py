"""`mlxbatch demo`: the main job on the built-in default, verified, with a short report."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from ..api.classifier import Classifier
from ..api.spec import RunSpec
from ..engine.calibration import cached, cached_entry, model_of
from ..errors import ResumeError
from ..io.inputs import read_rows
from ..io.outputs import check_model_untouched
from ..io.sinks import journal_path
from ..jobs.classify import Interrupted
from ..jobs.job import run_job
from .workload import generate, jsonl_text, write_jsonl


def run_demo(
    n: int, model: Path, out_dir: Path, progress=print, resume: bool = False
) -> tuple[list[str], bool]:
    """`n` synthetic tickets sorted and verified (`resume`: after a Ctrl-C); (lines, passed)."""
    t0 = time.perf_counter()
    check_model_untouched([("--out", out_dir)], model)
    src, out = out_dir / "tickets.jsonl", out_dir / "predictions.jsonl"
    tickets = generate(n)
    if journal_path(out).exists():  # checked before its tickets are written again
        if not resume:
            raise ResumeError(
                f"{journal_path(out)} holds an interrupted demo: `mlxbatch demo "
                "--resume` continues it; delete it to start over"
            )
        if src.exists() and src.read_bytes() != jsonl_text(tickets).encode("utf-8"):
            raise ResumeError(
                f"{journal_path(out)} is a demo of other tickets than --tickets {n} "
                f"makes ({src}): resume with the first run's --tickets"
            )
    write_jsonl(tickets, src)  # the same bytes for the same n: a resume's input is unchanged
    clf = Classifier.load(model)
    first = cached(clf.engine) is None  # this machine's first job checks the planner's defaults
    progress(f"classifying {n} synthetic tickets from {src} ...")
    rows, fmt = read_rows(str(src))
    # off a terminal (a log, CI) a line every 10 s: else minutes pass with nothing printed
    spec = RunSpec(progress_every=10.0)
    try:
        res = run_job(clf, rows, spec, out, resume=resume, verify=True, source=str(src), fmt=fmt)
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted; finished batches are saved in {journal_path(out)}: "
            "`mlxbatch demo --resume` continues"
        ) from None
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
        f"{v['seconds']:.0f} s the gold loop's verification, the rest loading"
        f"{_planner_note(clf, first)})",
    ]
    return lines, v["passed"]


def _planner_note(clf: Classifier, first: bool) -> str:
    """What the planner's first job on this machine added to the demo's time, if it ran now."""
    if not first:
        return ""
    entry = cached_entry(clf.engine)  # the cache read once: its model and what was measured
    model = model_of(entry)
    if model is None:  # the cache is not writable: it was checked, perhaps calibrated
        return "; this machine's first job also checked the planner's cost model"
    if model.source == "default":
        return "; this machine's first job also checked the planner's default cost model, once"
    took = (entry or {}).get("measured", {}).get("took_s")
    spent = f": {took:.0f} s of the rest" if isinstance(took, (int, float)) else ""
    return f"; this machine's first job also calibrated the planner, once{spent}"
