"""Several questions asked of each text: one engine whose items carry a prompt per question.

Question k's prompt for a text is the single-question prompt of `text + tails[k]` (the blank
line and the question's words), in the checkpoint's chat template. An item holds its text's
prompts packed into one token list (`pack`): the planner, the duplicate check, the journal and
the ranks see one item per text, as they do without questions. A scored item's probabilities
are its questions' label probabilities side by side, question after question (`columns`).

The gold loop scores each (text, question) prompt alone and whole (`QuestionsGold`); the fast
path (`QuestionsScorer`) feeds a text's common tokens once and its questions' tails behind them,
each part that tails share once (`tail_parts`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace

import mlx.core as mx
import numpy as np

from ..model.load import LoadedModel
from ..model.tokenizer import Examples
from ..runtime import executor as executors
from .engine import Engine
from .labels import LabelSet, continuation_logprobs, first_token_logits, normalise
from .layout import split
from .question_layout import QuestionRows, fed_tails, text_and_tails
from .scorers import GoldScorer, PrefixScorer


def pack(prompts: Sequence[list[int]]) -> list[int]:
    """One token list holding `prompts`: their count, their lengths, then their tokens."""
    return [len(prompts), *(len(p) for p in prompts), *(t for p in prompts for t in p)]


def unpack(packed: list[int]) -> list[list[int]]:
    """The prompts `pack` put in `packed`."""
    n = packed[0]
    out, at = [], 1 + n
    for length in packed[1 : 1 + n]:
        out.append(list(packed[at : at + length]))
        at += length
    return out


def columns(label_sets: Sequence[LabelSet]) -> LabelSet:
    """The label sets side by side: the engine's columns, named `k.label` (question k)."""
    names = tuple(f"{k}.{n}" for k, labels in enumerate(label_sets) for n in labels.names)
    return LabelSet(names, tuple(t for labels in label_sets for t in labels.tokens))


class QuestionsEngine(Engine):
    def __init__(
        self,
        lm: LoadedModel,
        tails: Sequence[str],
        label_sets: Sequence[LabelSet],
        system_prompt: str,
        prefix_cache: bool = True,
        executor: executors.Executor | None = None,
        shots: Sequence[Examples] = (),
    ):
        """`tails[k]`: what question k adds after the text; `label_sets[k]`: its labels;
        `shots[k]`: its few-shot turns, if any (the prompts then share less than the text)."""
        self.tails, self.label_sets = tuple(tails), tuple(label_sets)
        self.shots = tuple(shots) or ((),) * len(self.tails)
        super().__init__(lm, columns(label_sets), system_prompt, prefix_cache, executor)
        self.footprint = replace(self.footprint, segment_slots=self.cost_terms()[2])

    def _scorers(self, labels: LabelSet, executor: executors.Executor) -> dict:
        return {
            "gold": QuestionsGold(self.model, self.label_sets),
            "fast": QuestionsScorer(
                self.model, labels, self.prefix, self.lm.dtype, executor, self.label_sets
            ),
        }

    def spans(self) -> list[tuple[int, int]]:
        """Each question's columns: [start, end) of a row of probabilities."""
        out, at = [], 0
        for labels in self.label_sets:
            out.append((at, at + len(labels.names)))
            at += len(labels.names)
        return out

    def cost_terms(self) -> tuple[int, int, int]:
        """The prefix, and what a text's row holds past its fed tokens: a segment of each
        multi-token label's earlier tokens (one more row's worth of slots, not a row each)."""
        slots = sum(len(labels.names) * (labels.max_len - 1) for labels in self.label_sets)
        return len(self.prefix), int(slots > 0), slots

    def prompt(self, text: str) -> list[int]:
        """The packed gold prompts of one text, a question each."""
        return pack(
            [
                self.tokenizer.prompt(self.system_prompt, text + tail, shots)
                for tail, shots in zip(self.tails, self.shots)
            ]
        )

    def prompts(self, texts: list[str]) -> list[list[int]]:
        per_question = [
            self.tokenizer.prompts(self.system_prompt, [t + tail for t in texts], shots)
            for tail, shots in zip(self.tails, self.shots)
        ]
        return [pack(parts) for parts in zip(*per_question)] if texts else []

    def split(self, prompt: list[int]) -> tuple[int, list[int]]:
        return 0, self.fed(prompt)

    def fed(self, prompt: list[int]) -> list[int]:
        """The tokens an item feeds through the model: its text's common tokens past the
        shared prefix, then its tails' parts (`tail_parts`)."""
        common, tails = text_and_tails(unpack(prompt))
        return [*split(common, self.prefix)[1], *fed_tails(tails)]


class QuestionsGold:
    """The gold loop of each (text, question) prompt, alone and whole (`GoldScorer`)."""

    def __init__(self, model, label_sets: Sequence[LabelSet]):
        self.parts = [GoldScorer(model, labels) for labels in label_sets]

    def score(self, prompts: list[list[int]]) -> np.ndarray:
        return np.stack([self.score_one(p) for p in prompts])

    def score_batches(self, batches):
        for prompts in batches:
            yield self.score(prompts)

    def score_one(self, packed: list[int]) -> np.ndarray:
        return np.concatenate([g.score_one(p) for g, p in zip(self.parts, unpack(packed))])


class Phases:
    """Seconds the fast path spent in each step of its batches, summed over the lanes (for
    `bench --questions`): "layout" (host side: unpack, tokens, positions, mask), "forward"
    (the rows: texts, tails, label segments), "labels" (the head's label rows, and the
    later tokens' log-probabilities of multi-token labels)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}

    def add(self, name: str, since: float) -> float:
        """Count the time from `since` to now under `name`; return now."""
        now = time.perf_counter()
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + now - since
        return now

    def reset(self) -> None:
        with self._lock:
            self.seconds = {}


class QuestionsScorer(PrefixScorer):
    """The fast path over packed items: a text's row holds its common tokens once, behind the
    shared prefix, then every question's tail and a segment a multi-token label, all in one
    forward (`QuestionRows`, question_layout.py)."""

    def __init__(
        self,
        model,
        labels: LabelSet,
        prefix: list[int],
        dtype: mx.Dtype,
        executor: executors.Executor,
        label_sets: Sequence[LabelSet],
    ):
        super().__init__(model, labels, prefix, dtype, executor)
        self.label_sets = tuple(label_sets)
        self.teacher = tuple(
            labels.teacher_inputs() if labels.max_len > 1 else None for labels in label_sets
        )
        self.phases = Phases()

    def _score_rows(self, prompts: list[list[int]], lane: int) -> mx.array:
        t = time.perf_counter()
        texts = [text_and_tails(unpack(p)) for p in prompts]
        rows = QuestionRows.build(texts, self.prefix, self.teacher)
        tokens, positions, mask, kept = rows.tokens(), rows.positions(), rows.mask(), rows.kept()
        t = self.phases.add("layout", t)
        kv = self._batch_cache(lane, rows.batch, rows.capacity)
        kv.use_rows(rows.batch)
        h = self.model(
            mx.array(tokens),
            kv,
            mx.array(positions),
            mx.array(mask),
            host_kernels=self.host_kernels,
            keep=mx.array(kept),
        )  # (B, K + M, D): each tail's last slot, then every label segment's slots
        mx.eval(h)
        t = self.phases.add("forward", t)
        kv.crop(rows.text.prefix_width)
        out = self._label_scores(h)
        self.phases.add("labels", t)
        return out

    def _label_scores(self, h: mx.array) -> mx.array:
        """(B, columns) probabilities: question q's first label tokens at its tail's last slot
        (`h[:, q]`), multi-token labels' later tokens at their segments' slots after them."""
        at, out = len(self.label_sets), []
        for q, labels in enumerate(self.label_sets):
            scores = first_token_logits(self.model, h[:, q], labels).astype(mx.float32)
            if labels.max_len > 1:
                J, L = len(labels.names), labels.max_len - 1
                h_lab = h[:, at : at + J * L].reshape(h.shape[0] * J, L, -1)  # (B * J, L, D)
                scores = scores + continuation_logprobs(
                    self.model, h_lab, labels, self.host_kernels
                )
                at += J * L
            out.append(normalise(scores))
        probs = mx.concatenate(out, axis=1)
        mx.eval(probs)
        return probs
