"""`bench --questions FILE`: a questions run against the same prompts asked one question at a
time, in one process on one loaded model.

Three runs over the same texts: each (text, question) prompt as its own sorted single-question
job, one after another (what a user without questions would run); the questions run (a
text's tokens fed once a batch, each question only its tail); and the gold loop. Reported:
the tokens each feeds (the questions run's split into text and tails), the time ratios, the
agreement of every answer, padding, peak memory, and where the questions run's time goes
(its scorer's steps, summed over the lanes). The token ratio is what sharing the text can
save at most; the time ratio is what it saves here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..api.classifier import Classifier
from ..api.questions import QuestionsClassifier
from ..engine.adjust import Adjustment
from ..engine.layout import split
from ..engine.planner import PaddingStats
from ..engine.question_engine import unpack
from ..engine.question_layout import text_and_tails
from ..engine.questions import Questions


@dataclass(frozen=True)
class Run:
    seconds: float
    fed_tokens: int
    padded_tokens: int
    peak_bytes: int

    @property
    def padding(self) -> float:
        return PaddingStats(self.fed_tokens, self.padded_tokens).overhead


def timed(clf: Classifier, texts: list[str], mode: str, batch_tokens: int | None):
    """(predictions, Run) of one `classify` call, its plan's tokens counted the same way."""
    prompts = clf.engine.prompts(texts)
    batches = clf.plan(prompts, mode if mode != "sequential" else "sorted", batch_tokens)
    fed = sum(clf.engine.fed_lengths(prompts))
    mx.eval(mx.zeros(1))
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    said = clf.classify(texts, mode=mode, batch_tokens=batch_tokens)
    seconds = time.perf_counter() - t0
    padded = sum(b.padded_tokens for b in batches)
    return said, Run(seconds, fed, padded, int(mx.get_peak_memory()))


def singles(clf: QuestionsClassifier) -> list[Classifier]:
    """A single-question classifier per prompt a text is given, on the same loaded model,
    with that prompt's examples and prior."""
    return [
        Classifier(
            clf.lm,
            labels,
            clf.system_prompt,
            clf.engine.prefix_cache,
            asked.examples,
            Adjustment(prior=asked.prior),
        )
        for labels, asked in zip(clf.engine.label_sets, clf.asked)
    ]


def bench_questions(
    model: Path,
    questions: Questions,
    texts: list[str],
    batch_tokens: int | None,
    gold: bool,
    progress,
) -> dict:
    """The three runs and their ratios (see the module docstring)."""
    clf = Classifier.load(model, questions=questions)
    alone = singles(clf)
    clf.classify(texts[:4])  # warm: the lanes, and the planner's cost model
    for one, asked in zip(alone, clf.asked):
        one.classify([asked.user_text(t) for t in texts[:4]])
    progress(f"{len(clf.asked)} single-question sorted runs, one after another ...")
    one_runs, one_labels = [], []
    for one, asked in zip(alone, clf.asked):
        said, run = timed(one, [asked.user_text(t) for t in texts], "sorted", batch_tokens)
        one_runs.append(run)
        one_labels.append([p.label for p in said])
    progress("the questions run ...")
    phases = clf.engine.scorers["fast"].phases
    phases.reset()
    said, together = timed(clf, texts, "sorted", batch_tokens)
    out = {
        "texts": len(texts),
        "prompts_a_text": len(clf.asked),
        "single": _sum(one_runs),
        "questions": together.__dict__ | {"padding": together.padding},
        "single_peak_bytes": max(r.peak_bytes for r in one_runs),
        "text_tokens": text_tokens(clf, texts),
        "phases": dict(phases.seconds),
    }
    out["single"]["padding"] = PaddingStats(
        out["single"]["fed_tokens"], out["single"]["padded_tokens"]
    ).overhead
    out["agreement_single"] = _agreement(clf, said, one_labels)
    if gold:
        progress("the gold loop ...")
        loop, gold_run = timed(clf, texts, "sequential", batch_tokens)
        out["gold"] = gold_run.__dict__
        out["agreement_gold"] = _agreement(clf, said, _labels_of(clf, loop))
        out["gold_ratio"] = gold_run.seconds / together.seconds
    out["token_ratio"] = out["single"]["fed_tokens"] / together.fed_tokens
    out["time_ratio"] = out["single"]["seconds"] / together.seconds
    out["memory_ratio"] = together.peak_bytes / max(1, out["single_peak_bytes"])
    return out


def text_tokens(clf: QuestionsClassifier, texts: list[str]) -> int:
    """Tokens the questions run feeds for the texts' common parts (the rest: the tails)."""
    prefix = clf.engine.prefix
    common = (text_and_tails(unpack(p))[0] for p in clf.engine.prompts(texts))
    return sum(len(split(c, prefix)[1]) for c in common)


def _sum(runs: list[Run]) -> dict:
    return {
        "seconds": sum(r.seconds for r in runs),
        "fed_tokens": sum(r.fed_tokens for r in runs),
        "padded_tokens": sum(r.padded_tokens for r in runs),
    }


def _labels_of(clf: QuestionsClassifier, said) -> list[list]:
    """Per prompt a text is given, each text's answer: a label, or whether a tag is on."""
    return [[_answer(asked, p.answers, clf.tag_threshold) for p in said] for asked in clf.asked]


def _answer(asked, answers: dict, threshold: float):
    a = answers[asked.question]
    if asked.tag is None:
        return a.get("label")
    return "yes" if a["scores"][asked.tag] >= threshold else "no"


def _agreement(clf: QuestionsClassifier, said, other: list[list]) -> float:
    mine = _labels_of(clf, said)
    same = [a == b for m, o in zip(mine, other) for a, b in zip(m, o)]
    return float(np.mean(same)) if same else 1.0


def format_questions(r: dict) -> str:
    """The report as text."""
    s, q = r["single"], r["questions"]
    lines = [
        f"{r['texts']} texts x {r['prompts_a_text']} prompts a text",
        f"  {r['prompts_a_text']} single-question sorted runs: {s['seconds']:.2f} s, "
        f"{s['fed_tokens']:,} tokens fed, padding {s['padding']:.1%}",
        f"  questions run:   {q['seconds']:.2f} s, {q['fed_tokens']:,} tokens fed "
        f"({r['text_tokens']:,} of the texts, {q['fed_tokens'] - r['text_tokens']:,} of the "
        f"tails), padding {q['padding']:.1%}",
        f"  its time (summed over the lanes): {_shares(r['phases'])}",
        f"  token ratio {r['token_ratio']:.2f}x, time ratio {r['time_ratio']:.2f}x "
        f"({r['time_ratio'] / r['token_ratio']:.0%} of the token ratio); agreement with the "
        f"single runs {r['agreement_single']:.2%}",
        f"  peak memory {q['peak_bytes'] / 2**30:.2f} GiB, {r['memory_ratio']:.2f}x a "
        "single-question run's",
    ]
    if "gold" in r:
        lines.append(
            f"  gold loop: {r['gold']['seconds']:.2f} s: the questions run is "
            f"{r['gold_ratio']:.1f}x faster; agreement {r['agreement_gold']:.2%}"
        )
    return "\n".join(lines)


def _shares(phases: dict) -> str:
    """Each step's seconds and share, in the order the scorer runs them."""
    total = sum(phases.values()) or 1.0
    order = ("layout", "forward", "labels")
    named = [n for n in order if n in phases] + sorted(set(phases) - set(order))
    return ", ".join(f"{n} {phases[n]:.2f} s ({phases[n] / total:.0%})" for n in named)
