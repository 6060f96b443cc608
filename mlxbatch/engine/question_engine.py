"""Several questions asked of each text: one engine whose items carry a prompt per question.

Question k's prompt for a text is the single-question prompt of `text + tails[k]` (the blank
line and the question's words), in the checkpoint's chat template. An item holds its text's
prompts packed into one token list (`pack`): the planner, the duplicate check, the journal and
the ranks see one item per text, as they do without questions. A scored item's probabilities
are its questions' label probabilities side by side, question after question (`columns`).

The gold loop scores each (text, question) prompt alone and whole (`QuestionsGold`); the fast
path (`QuestionsScorer`) feeds a text's common tokens once and each question's tail behind them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from ..model.load import LoadedModel
from ..runtime import executor as executors
from .engine import Engine
from .labels import LabelSet, continuation_logprobs, first_token_logits, normalise
from .layout import split
from .question_layout import QuestionRows, TailLayout, text_and_tails
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
    ):
        """`tails[k]`: what question k adds after the text; `label_sets[k]`: its labels."""
        self.tails, self.label_sets = tuple(tails), tuple(label_sets)
        super().__init__(lm, columns(label_sets), system_prompt, prefix_cache, executor)

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
        """The prefix, and the multi-token questions' label pass: a row per label of each,
        each feeding its question's tail (as a one-word text's) and its later label tokens."""
        multi = [q for q, labels in enumerate(self.label_sets) if labels.max_len > 1]
        if not multi:
            return len(self.prefix), 0, 0
        tails = text_and_tails(unpack(self.prompt("x")))[1]
        rows = sum(len(self.label_sets[q].names) for q in multi)
        fed = max(len(tails[q]) + self.label_sets[q].max_len - 1 for q in multi)
        return len(self.prefix), rows, fed

    def prompt(self, text: str) -> list[int]:
        """The packed gold prompts of one text, a question each."""
        return pack([self.tokenizer.prompt(self.system_prompt, text + tail) for tail in self.tails])

    def prompts(self, texts: list[str]) -> list[list[int]]:
        per_question = [
            self.tokenizer.prompts(self.system_prompt, [t + tail for t in texts])
            for tail in self.tails
        ]
        return [pack(parts) for parts in zip(*per_question)] if texts else []

    def split(self, prompt: list[int]) -> tuple[int, list[int]]:
        return 0, self.fed(prompt)

    def fed(self, prompt: list[int]) -> list[int]:
        """The tokens an item feeds through the model: its text's common tokens past the
        shared prefix, then each question's tail."""
        common, tails = text_and_tails(unpack(prompt))
        return [*split(common, self.prefix)[1], *(t for tail in tails for t in tail)]


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
    (the text and its tails), "heads" (single-token labels), "labels" (multi-token ones)."""

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
    shared prefix, then every question's tail, in one forward (`QuestionRows`); each
    multi-token question then feeds its tail again with each label behind the text rows
    (question_layout.py)."""

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
        self.phases = Phases()

    def _score_rows(self, prompts: list[list[int]], lane: int) -> mx.array:
        t = time.perf_counter()
        rows = QuestionRows.build([text_and_tails(unpack(p)) for p in prompts], self.prefix)
        tokens, positions, mask = rows.tokens(), rows.positions(), rows.mask()
        t = self.phases.add("layout", t)
        kv = self._batch_cache(lane, rows.batch, rows.capacity)
        kv.use_rows(rows.batch)
        h = self.model(
            mx.array(tokens),
            kv,
            mx.array(positions),
            mx.array(mask),
            host_kernels=self.host_kernels,
            keep=mx.array(rows.last()),
        )  # (B, K, D): each tail's last position
        mx.eval(h)
        t = self.phases.add("forward", t)
        out = self._first_tokens(h)
        t = self.phases.add("heads", t)
        kv.crop(rows.text.capacity)  # the text rows, for the label passes behind them
        for q, labels in enumerate(self.label_sets):
            if labels.max_len > 1:
                asked = tuple(tails[q] for tails in rows.tails)
                out[q] = self._labelled(TailLayout(rows.text, asked), kv, labels)
                mx.eval(out[q])
                t = self.phases.add("labels", t)
        kv.crop(rows.text.prefix_width)
        return mx.concatenate([out[q] for q in range(len(self.label_sets))], axis=1)

    def _first_tokens(self, h: mx.array) -> dict[int, mx.array]:
        """(B, J) probabilities of every question whose labels are one token each, from the
        hidden state of its tail's last token (`h[:, q]`)."""
        out = {
            q: normalise(first_token_logits(self.model, h[:, q], labels))
            for q, labels in enumerate(self.label_sets)
            if labels.max_len == 1
        }
        mx.eval(list(out.values()))
        return out

    def _labelled(self, rows: TailLayout, kv, labels: LabelSet) -> mx.array:
        """(B, J) probabilities of multi-token labels: each label's row feeds the tail and the
        label's teacher tokens behind the text (`TailLayout.repeated`)."""
        J, L = len(labels.names), labels.max_len - 1
        lab = rows.repeated(labels.teacher_inputs())
        lab_kv = kv.repeat_rows(J, lab.capacity)
        h = self.model(
            mx.array(lab.tokens()),
            lab_kv,
            mx.array(lab.positions()),
            mx.array(lab.mask()),
            host_kernels=self.host_kernels,
        )
        at = rows.label_inputs(J, L)  # (B * J, 1 + L)
        flat = np.arange(len(at))[:, None] * lab.width + at
        h = h.reshape(-1, h.shape[-1])[mx.array(flat.reshape(-1))].reshape(len(at), 1 + L, -1)
        scores = first_token_logits(self.model, h[::J, 0], labels).astype(mx.float32)
        scores = scores + continuation_logprobs(self.model, h[:, 1:], labels, self.host_kernels)
        return normalise(scores)
