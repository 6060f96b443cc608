"""`bench --against`: the model under test against a reference model on the same tickets."""

from __future__ import annotations

import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..api.classifier import Classifier
from ..engine.scheduler import score_all


def _sorted_run(clf: Classifier, texts: list[str], max_batch: int) -> tuple[np.ndarray, float, int]:
    prompts = [clf.engine.prompt(t) for t in texts]
    batches = clf.plan(prompts, "sorted", None, max_batch)
    mx.synchronize()
    mx.reset_peak_memory()
    t = time.perf_counter()
    probs = score_all(clf.engine, prompts, batches)
    return probs, time.perf_counter() - t, mx.get_peak_memory()


def against(
    clf: Classifier, texts: list[str], max_batch: int, reference: Path, progress=print
) -> dict:
    """The model under test against a reference: agreement, largest difference, speed, memory."""
    progress(f"comparing against {reference} ...")
    probs, seconds, peak = _sorted_run(clf, texts, max_batch)
    clf.engine.release_buffers()  # the first model's caches go; its weights stay
    ref = Classifier.load(reference, clf.labels.names, clf.system_prompt, examples=clf.examples)
    ref_probs, ref_seconds, ref_peak = _sorted_run(ref, texts, max_batch)
    ref_peak -= clf.footprint.weight_bytes  # still resident, but not the reference's
    return {
        "model": clf.lm.describe(),
        "reference": ref.lm.describe(),
        "items": len(texts),
        "label_agreement": float((probs.argmax(1) == ref_probs.argmax(1)).mean()),
        "max_abs_prob_diff": float(np.abs(probs - ref_probs).max()),
        "seconds": seconds,
        "items_per_s": len(texts) / seconds,
        "peak_memory": peak,
        "reference_seconds": ref_seconds,
        "reference_items_per_s": len(texts) / ref_seconds,
        "reference_peak_memory": ref_peak,
    }
