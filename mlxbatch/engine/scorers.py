"""The two scorers behind one interface, `score(prompts) -> (B, J) probabilities`:
`GoldScorer`, one whole prompt at a time, simple on purpose; `PrefixScorer`, the shared prefix
once and rows batched behind it (prepare the row layout, forward, score the labels)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import mlx.core as mx
import numpy as np

from ..model import hostops
from ..model.cache import KVCache
from ..model.decoder import Decoder
from ..runtime import sgemm
from ..runtime.executor import Executor
from .labels import LabelSet, normalise, score_labels
from .layout import RowLayout

PREFILL_CHUNK = 512  # prefix tokens a forward at a time, for prefixes longer than this


def new_cache(model: Decoder, batch: int, capacity: int, dtype: mx.Dtype) -> KVCache:
    a = model.args
    return KVCache.allocate(
        a.num_hidden_layers, batch, a.num_key_value_heads, a.head_dim, capacity, dtype
    )


class GoldScorer:
    def __init__(self, model: Decoder, labels: LabelSet):
        self.model, self.labels = model, labels

    def score(self, prompts: list[list[int]]) -> np.ndarray:
        return np.stack([self.score_one(p) for p in prompts])

    def score_batches(self, batches: Iterable[list[list[int]]]) -> Iterator[np.ndarray]:
        for prompts in batches:
            yield self.score(prompts)

    def score_one(self, prompt: list[int]) -> np.ndarray:
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


class PrefixScorer:
    def __init__(
        self,
        model: Decoder,
        labels: LabelSet,
        prefix: list[int],
        dtype: mx.Dtype,
        executor: Executor,
    ):
        self.model, self.labels, self.prefix, self.dtype = model, labels, prefix, dtype
        self.executor = executor
        self.host_kernels = hostops.available(dtype)  # host elementwise kernels (CPU, float32)
        self.prefix_kv = self._prefill(prefix) if prefix else None
        self._lane_kv: dict[int, KVCache] = {}

    def release_buffers(self) -> None:
        """Free the lanes' batch caches (the prefix cache stays); the next batch makes new ones."""
        self._lane_kv.clear()

    def _prefill(self, tokens: list[int]) -> KVCache:
        """The shared prefix's cache, a long prefix in chunks so attention memory grows with
        chunk x prefix, not prefix squared."""
        # OpenBLAS on one thread, as in the lanes: its threads split a product's rows at points
        # that depend on the thread count, which would reach every row's bits
        with sgemm.single_threaded():
            return self._prefill_chunks(tokens)

    def _prefill_chunks(self, tokens: list[int]) -> KVCache:
        cache = new_cache(self.model, 1, len(tokens), self.dtype)
        if len(tokens) <= PREFILL_CHUNK:
            self.model(mx.array([tokens]), cache, 0, "causal", host_kernels=self.host_kernels)
        else:
            for start in range(0, len(tokens), PREFILL_CHUNK):
                chunk = tokens[start : start + PREFILL_CHUNK]
                end = start + len(chunk)
                seen = mx.arange(end)[None] <= mx.arange(start, end)[:, None]  # (chunk, end)
                self.model(
                    mx.array([chunk]),
                    cache,
                    start,
                    seen[None, None],
                    host_kernels=self.host_kernels,
                )
                mx.eval(cache.keys, cache.values)
        mx.eval(cache.keys, cache.values)
        return cache

    def score(self, prompts: list[list[int]]) -> np.ndarray:
        """One batch (on the CPU: its rows split over the lanes)."""
        return self.executor.run(self._score_rows, prompts)

    def score_batches(self, batches: Iterable[list[list[int]]]) -> Iterator[np.ndarray]:
        """Batch after batch, in order (on the CPU: each whole on the next free lane)."""
        return self.executor.run_batches(self._score_rows, batches)

    def _score_rows(self, prompts: list[list[int]], lane: int) -> mx.array:
        return self._score_labelled(prompts, lane, self.labels)

    def _score_labelled(self, prompts: list[list[int]], lane: int, labels: LabelSet) -> mx.array:
        """(B, J) probabilities of `prompts` over `labels`, in the lane's cache."""
        layout = RowLayout.build(prompts, self.prefix, labels.max_len - 1)
        kv = self._batch_cache(lane, layout.batch, layout.capacity)
        kv.use_rows(layout.batch)
        h = self.model(
            mx.array(layout.tokens()),
            kv,
            mx.array(layout.positions()),
            mx.array(layout.mask()),
            host_kernels=self.host_kernels,
            keep=mx.array(layout.last()),
        )  # (B, 1, D): the last positions
        probs = score_labels(self.model, h[:, 0], kv, layout, labels, self.host_kernels)
        kv.crop(layout.prefix_width)
        return probs

    def _batch_cache(self, lane: int, batch: int, capacity: int) -> KVCache:
        """The prefix broadcast to `batch` rows: the lane's buffers when large enough, else new
        ones of this batch's shape (never grown to the larger of both)."""
        kv = self._lane_kv.get(lane)
        if kv is not None and kv.allocated >= batch and kv.capacity >= capacity:
            kv.crop(len(self.prefix))
            kv.use_rows(batch)
            return kv
        if kv is not None:
            del self._lane_kv[lane], kv  # free the old buffers first
        if self.prefix_kv is None:
            kv = new_cache(self.model, batch, capacity, self.dtype)
        else:
            kv = self.prefix_kv.expand(batch, capacity)
        mx.eval(kv.keys, kv.values)  # lazy sources would serialise the lanes' streams
        self._lane_kv[lane] = kv
        return kv
