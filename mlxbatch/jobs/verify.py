"""Verification: items scored again on the gold loop (`--verify`: all of them;
`--verify-sample F`: a share F, the same items for the same input), window by window."""

from __future__ import annotations

import time

import numpy as np

from ..api.classifier import Classifier
from ..api.spec import RunSpec
from ..runtime import progress


def verify_window(clf: Classifier, rows, prompts: dict[int, list[int]], results, spec: RunSpec,
                  every: bool) -> dict | None:  # fmt: skip
    """The report of the items `prompts` (input row -> prompt) against `results` (input row ->
    output row; None when nothing is verified): all of them under `every`, else the sample."""
    if every:
        return run_verify(clf, rows, prompts, results, spec.progress_every)
    if not spec.verify_sample or not prompts:
        return None
    sample = [i for i in sorted(prompts) if sampled(i, spec.verify_sample)]
    return run_verify(clf, rows, {i: prompts[i] for i in sample}, results, spec.progress_every)


def sampled(row: int, share: float) -> bool:
    """Whether input row `row` is in a `share` sample: a hash of the row's index (Knuth's
    multiplicative), so the same rows are verified whatever the windows or batches."""
    return (row * 2654435761) % 2**32 < share * 2**32


def merge_reports(reports: list[dict]) -> dict | None:
    """Window reports as one."""
    if not reports:
        return None
    items = sum(r["items"] for r in reports)
    disagree = [d for r in reports for d in r["disagreements"]]
    return {
        "items": items,
        "agreement": (items - len(disagree)) / items if items else 1.0,
        "max_abs_score_diff": max(r["max_abs_score_diff"] for r in reports),
        "disagreements": disagree,
        "passed": not disagree,
        "seconds": sum(r["seconds"] for r in reports),
    }


def run_verify(clf: Classifier, rows, prompts: dict, results,
               lines_every: float | None = None) -> dict:  # fmt: skip
    """Score items again on the gold path and compare labels and scores."""
    names = clf.labels.names
    disagree, max_diff, t0 = [], 0.0, time.perf_counter()
    bar = progress.bar(len(prompts), "verify", 0, lines_every)
    for i, prompt in prompts.items():
        bar.update(1)
        gold = clf.adjust.apply(clf.engine.score_gold(prompt)[None])[0]
        scores = results[i].get("scores") or {}
        fast = np.array([scores.get(n, np.nan) for n in names], np.float64)
        finite = bool(np.isfinite(gold).all() and np.isfinite(fast).all())
        if finite:
            max_diff = max(max_diff, float(np.abs(gold - fast).max()))
        g = int(np.argmax(np.nan_to_num(gold, nan=-1.0)))
        if not finite:
            disagree.append({"id": rows[i].id, "gold": names[g] if np.isfinite(gold).all() else None,
                             "fast": results[i].get("label"), "error": "non-finite scores"})  # fmt: skip
        elif g != int(np.argmax(fast)):
            top2 = np.sort(gold)[-2:]
            disagree.append({"id": rows[i].id, "gold": names[g], "fast": names[int(np.argmax(fast))],
                             "gold_margin": float(top2[1] - top2[0])})  # fmt: skip
    bar.close()
    n = len(prompts)
    return {
        "items": n,
        "agreement": (n - len(disagree)) / n if n else 1.0,
        "max_abs_score_diff": max_diff,
        "disagreements": disagree,
        "passed": not disagree,
        "seconds": time.perf_counter() - t0,
    }
