"""The scoring engine: the sequential gold path and the batched shared-prefix fast path."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import mlx.core as mx
import numpy as np

from . import blas
from .batching import Batch, unsort
from .cache import KVCache, batch_mask
from .load import LoadedModel
from .prompt import common_prefix_len
from .scoring import LabelSet, continuation_logprobs, first_token_logits, normalise

PAD_ID = 0  # any in-vocabulary id: padded slots are masked out of every row


class Engine:
    def __init__(
        self, lm: LoadedModel, labels: LabelSet, system_prompt: str, prefix_cache: bool = True
    ):
        self.lm, self.model, self.tokenizer = lm, lm.model, lm.tokenizer
        self.labels, self.system_prompt = labels, system_prompt
        self.prefix = self.tokenizer.shared_prefix(system_prompt) if prefix_cache else []
        self.prefix_kv = self._prefill(self.prefix) if self.prefix else None
        self._lane_kv: dict[int, KVCache] = {}
        # On the CPU, MLX's elementwise ops (exp in SiLU and softmax) run on one thread per
        # stream: a batch is split into row "lanes" on separate streams, one core each.
        cpu = mx.default_device() == mx.cpu
        self.lanes = (
            [mx.new_stream(mx.cpu) for _ in range(min(os.cpu_count() or 1, 8))] if cpu else []
        )

    def prompt(self, text: str) -> list[int]:
        """The gold tokenization of one item's whole prompt."""
        return self.tokenizer.prompt(self.system_prompt, text)

    def split(self, prompt: list[int]) -> tuple[int, list[int]]:
        """(prefix slots this row shares, the tokens it feeds itself).

        Usually the whole cached prefix; less when the text's first characters merge with the
        prefix's final `\\n` under BPE, so the fed tokens are always the gold tokens.
        """
        k = min(common_prefix_len(prompt, self.prefix), len(prompt) - 1)
        return k, prompt[k:]

    def _new_cache(self, batch: int, capacity: int) -> KVCache:
        a = self.model.args
        dtype = self.model.model.embed_tokens.weight.dtype
        return KVCache.allocate(
            a.num_hidden_layers, batch, a.num_key_value_heads, a.head_dim, capacity, dtype
        )

    def _prefill(self, tokens: list[int]) -> KVCache:
        cache = self._new_cache(1, len(tokens))
        self.model(mx.array([tokens]), cache, 0, "causal")
        mx.eval(cache.keys, cache.values)
        return cache

    def _batch_cache(self, lane: int, batch: int, capacity: int) -> KVCache:
        """The prefix broadcast to `batch` rows; the lane's previous buffers when they fit."""
        kv = self._lane_kv.get(lane)
        P = len(self.prefix)
        if kv is not None and kv.batch == batch and kv.capacity >= capacity:
            kv.crop(P)
            return kv
        if self.prefix_kv is None:
            kv = self._new_cache(batch, capacity)
        else:
            kv = self.prefix_kv.expand(batch, capacity)
        mx.eval(kv.keys, kv.values)  # lazy sources would serialise the lanes' streams
        self._lane_kv[lane] = kv
        return kv

    def score_batch(self, prompts: list[list[int]]) -> np.ndarray:
        """Label probabilities (B, J) for a batch of prompts, through the prefix cache."""
        n = min(len(self.lanes), len(prompts))
        if n < 2:
            probs = self._score_rows(prompts, 0)
            mx.eval(probs)
            return np.array(probs)
        bounds = np.linspace(0, len(prompts), n + 1).round().astype(int)
        outs = []
        for lane, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            with mx.stream(self.lanes[lane]):
                outs.append(self._score_rows(prompts[a:b], lane))
        with blas.single_threaded():  # one core per lane
            mx.eval(outs)
        return np.concatenate([np.array(o) for o in outs])

    def _score_rows(self, prompts: list[list[int]], lane: int) -> mx.array:
        P, labels = len(self.prefix), self.labels
        split = [self.split(p) for p in prompts]
        ks = np.array([k for k, _ in split])
        lengths = np.array([len(s) for _, s in split])
        B, W, T = len(prompts), int(lengths.max()), labels.max_len - 1
        tokens = np.full((B, W), PAD_ID, np.int32)
        for r, (_, s) in enumerate(split):
            tokens[r, : len(s)] = s
        kv = self._batch_cache(lane, B, P + W + T)
        mask = batch_mask(P, ks, lengths, W, P, W)
        h = self.model(mx.array(tokens), kv, mx.array(ks), mx.array(mask))  # (B, W, D)
        h_last = h[mx.arange(B), mx.array(lengths - 1)]  # (B, D)
        scores = first_token_logits(self.model, h_last, labels).astype(mx.float32)
        if T:
            J = len(labels.names)
            lab_kv = kv.repeat_rows(J, P + W + T)
            ks_r, len_r = np.repeat(ks, J), np.repeat(lengths, J)
            lab_tokens = np.tile(labels.teacher_inputs(), (B, 1))  # (B * J, T)
            lab_mask = batch_mask(P, ks_r, len_r, W, P + W, T)
            h_lab = self.model(
                mx.array(lab_tokens), lab_kv, mx.array(ks_r + len_r), mx.array(lab_mask)
            )
            scores = scores + continuation_logprobs(self.model, h_lab, labels)
        kv.crop(P)
        return normalise(scores)

    def score_gold(self, prompt: list[int]) -> np.ndarray:
        """The reference: whole prompt, no cache, full-vocabulary log-softmax. Simple on purpose."""
        n = len(prompt)
        sums, logps = [], {}  # single-token labels share one forward
        for label in self.labels.tokens:
            seq = tuple(prompt) + label[:-1]
            if seq not in logps:
                h = self.model(mx.array([seq]))[0, n - 1 :]  # the positions predicting labels
                logits = self.model.head(h).astype(mx.float32)
                logps[seq] = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            sums.append(sum(logps[seq][i, t] for i, t in enumerate(label)))
        probs = normalise(mx.stack(sums)[None])[0]
        mx.eval(probs)
        return np.array(probs)

    def run(
        self, prompts: list[list[int]], batches: list[Batch], gold: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[Batch, np.ndarray]]:  # fmt: skip
        """Score `batches` of `prompts`, yielding (batch, probabilities) as each completes."""
        for batch in batches:
            if gold:
                probs = np.stack([self.score_gold(prompts[i]) for i in batch.indices])
            else:
                probs = self.score_batch([prompts[i] for i in batch.indices])
            if progress:
                progress(len(batch.indices))
            yield batch, probs

    def score_all(
        self, prompts: list[list[int]], batches: list[Batch], gold: bool = False
    ) -> np.ndarray:
        """Probabilities (N, J) of every prompt, back in input order."""
        done = [(b, list(p)) for b, p in self.run(prompts, batches, gold=gold)]
        return np.stack(unsort(done, len(prompts)))
