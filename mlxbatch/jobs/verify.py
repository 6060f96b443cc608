"""Verification: items scored again on the gold loop (`--verify`: all of them;
`--verify-sample F`: a share F, the same items for the same input), window by window."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..api.classifier import Classifier
from ..api.spec import Settings
from ..api.verify import check
from ..runtime import progress


def verify_window(
    clf: Classifier,
    ids: Mapping[int, Any],
    prompts: dict[int, list[int]],
    results,
    settings: Settings,
    every: bool,
) -> dict | None:
    """The report of `prompts` against `results` (all, or the sample), or None."""
    chosen = to_verify(prompts, settings, every)
    if chosen is None:
        return None
    return run_verify(clf, ids, chosen, results, settings.spec.progress_every)


def to_verify(prompts: dict[int, Any], settings: Settings, every: bool) -> dict | None:
    """The items of `prompts` to verify: all under `every`, else the sample (None: none are)."""
    if every:
        return prompts
    share = settings.spec.verify_sample
    if not share or not prompts:
        return None
    return {i: prompts[i] for i in sorted(prompts) if sampled(i, share)}


def sampled(row: int, share: float) -> bool:
    """Whether input row `row` is in a `share` sample, by a hash of its index."""
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


def run_verify(
    clf: Classifier,
    ids: Mapping[int, Any],
    prompts: dict,
    results,
    lines_every: float | None = None,
) -> dict:
    """Score items again on the gold loop and compare labels and scores (`api.verify.check`)."""
    names = clf.labels.names
    disagree, max_diff, t0 = [], 0.0, time.perf_counter()
    bar = progress.bar(len(prompts), "verify", 0, lines_every)
    for i, prompt in prompts.items():
        bar.update(1)
        if hasattr(clf, "check_answers"):  # questions: every question's answer, and scores
            diff, line = answers_check(clf, prompt, results[i], ids[i])
            max_diff = max_diff if np.isnan(diff) else max(max_diff, diff)
            disagree += [line] if line else []
            continue
        scores = results[i].get("scores") or {}
        got = check(clf, prompt, np.array([scores.get(n, np.nan) for n in names], np.float64))
        if not np.isnan(got.diff):
            max_diff = max(max_diff, got.diff)
        if not got.agrees:
            disagree.append(got.disagreement(ids[i]))
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


def answers_check(clf, prompt: list[int], row: dict, item_id) -> tuple[float, dict | None]:
    """A row of answers against the gold loop's: (largest score difference, report line or None)."""
    from ..api.questions import answer_words

    gold, served, diff = clf.check_answers(prompt, row.get("answers") or {})
    want, got = answer_words(gold), answer_words(served)
    if np.isnan(diff) or want != got:
        return diff, {"id": item_id, "gold": want, "fast": got}
    return diff, None
