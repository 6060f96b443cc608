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

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from ..model.load import LoadedModel
from ..model.tokenizer import Examples
from ..runtime import executor as executors
from .engine import Engine
from .labels import LabelSet, continuation_logprobs, first_token_logits, normalise
from .layout import RowLayout, split
from .question_layout import TailLayout, repeat_rows, text_and_tails
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


class QuestionsScorer(PrefixScorer):
    """The fast path over packed items: each text's common tokens fed once behind the shared
    prefix, then the questions' tails behind them: those of single-token labels in one pass
    over copies of the text rows, each multi-token one with its labels (question_layout.py)."""

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

    def _score_rows(self, prompts: list[list[int]], lane: int) -> mx.array:
        texts = [text_and_tails(unpack(p)) for p in prompts]
        text = RowLayout.build([common for common, _ in texts], self.prefix, 0)
        longest = max(len(t) for _, tails in texts for t in tails)
        kv = self._batch_cache(lane, text.batch, text.capacity + longest)
        kv.use_rows(text.batch)
        self.model(
            mx.array(text.tokens()),
            kv,
            mx.array(text.positions()),
            mx.array(text.mask()),
            host_kernels=self.host_kernels,
            keep=mx.array(text.last()),
        )  # the text rows' keys and values
        out = self._first_tokens(text, texts, kv)
        for q, labels in enumerate(self.label_sets):
            if labels.max_len > 1:
                out[q] = self._labelled(
                    TailLayout(text, tuple(tuple(t[q]) for _, t in texts)), kv, labels
                )
                mx.eval(out[q])
        kv.crop(text.prefix_width)
        return mx.concatenate([out[q] for q in range(len(self.label_sets))], axis=1)

    def _first_tokens(self, text: RowLayout, texts, kv) -> dict[int, mx.array]:
        """(B, J) probabilities of every question whose labels are one token each: their
        tails in one pass, row r * n + i holding text r's tail of the i-th such question,
        behind a copy of the text rows' cache (one forward, not one a question)."""
        asked = [q for q, labels in enumerate(self.label_sets) if labels.max_len == 1]
        if not asked:
            return {}
        n = len(asked)
        rows = TailLayout(
            repeat_rows(text, n), tuple(tuple(tails[q]) for _, tails in texts for q in asked)
        )
        tail_kv = kv.repeat_rows(n, rows.capacity)
        h = self.model(
            mx.array(rows.tokens()),
            tail_kv,
            mx.array(rows.positions()),
            mx.array(rows.mask()),
            host_kernels=self.host_kernels,
            keep=mx.array(rows.last()),
        )  # (B * n, 1, D)
        out = {
            q: normalise(first_token_logits(self.model, h[i::n, 0], self.label_sets[q]))
            for i, q in enumerate(asked)
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
