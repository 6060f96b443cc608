"""The service's Prometheus metrics (`mlxbatch_*`, docs/serving.md), in their own registry."""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from ..engine.planner import PaddingStats

SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKENS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "mlxbatch_requests",
            "HTTP requests by outcome and status",
            ["outcome", "status"],
            registry=r,
        )
        self.connections_refused = Counter(
            "mlxbatch_connections_refused", "Connections refused past --max-connections", registry=r
        )
        self.connections_dropped = Counter(
            "mlxbatch_connections_dropped",
            "Connections dropped: replies unread past --timeout-reply",
            registry=r,
        )
        self.items = Counter("mlxbatch_items", "Texts classified", registry=r)
        self._timings(r)

    def _timings(self, r: CollectorRegistry) -> None:
        """The metrics of time and batch sizes, then the others, and their running counts."""
        self.request_seconds = Histogram(
            "mlxbatch_request_seconds",
            "Request duration, body read to reply",
            buckets=SECONDS,
            registry=r,
        )
        self.queue_seconds = Histogram(
            "mlxbatch_queue_seconds",
            "An item's wait, arrival to its batch's start",
            buckets=SECONDS,
            registry=r,
        )
        self.inference_seconds = Histogram(
            "mlxbatch_inference_seconds", "A batch's scoring time", buckets=SECONDS, registry=r
        )
        self.predicted_ratio = Histogram(
            "mlxbatch_batch_time_vs_predicted",
            "A batch's scoring time over the cost model's prediction",
            buckets=(0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3),
            registry=r,
        )
        self.batch_size = Histogram(
            "mlxbatch_batch_size", "Rows in a batch", buckets=ROWS, registry=r
        )
        self.batch_tokens = Histogram(
            "mlxbatch_batch_tokens",
            "Padded tokens in a batch (rows x width)",
            buckets=TOKENS,
            registry=r,
        )
        self._tokens(r)
        self._verification(r)
        self._lock = threading.Lock()  # batches end on several lanes' threads
        self._padded = self._useful = 0
        self._deviation = 0.0

    def _tokens(self, r: CollectorRegistry) -> None:
        """The metrics of tokens fed, padding and the shared prefix, and the queue's depth."""
        self.padded = Counter("mlxbatch_padded_tokens", "Tokens fed, padding included", registry=r)
        self.useful = Counter(
            "mlxbatch_useful_tokens", "Tokens fed that are not padding", registry=r
        )
        self.padding_ratio = Gauge(
            "mlxbatch_padding_ratio", "Padding over tokens fed, since start", registry=r
        )
        self.prefix_saved = Counter(
            "mlxbatch_prefix_tokens_saved",
            "Shared-prefix tokens not recomputed (served from the pinned prefix KV)",
            registry=r,
        )
        self.queue_depth = Gauge(
            "mlxbatch_queue_depth", "Items waiting in the scheduler", registry=r
        )

    def _verification(self, r: CollectorRegistry) -> None:
        """The metrics of the gold-loop verification and of readiness."""
        self.verified = Counter(
            "mlxbatch_items_verified",
            "Items re-scored on the gold loop (--verify-sample)",
            registry=r,
        )
        self.mismatches = Counter(
            "mlxbatch_verify_mismatches",
            "Verified items whose gold-loop label differs from the served one",
            registry=r,
        )
        self.verify_deviation = Gauge(
            "mlxbatch_verify_max_abs_diff",
            "Largest probability difference seen by verification",
            registry=r,
        )
        self.startup_seconds = Gauge(
            "mlxbatch_startup_seconds",
            "Start to ready: model load, prefix prefill, calibration",
            registry=r,
        )
        self.ready = Gauge("mlxbatch_ready", "1 when serving, else 0", registry=r)

    def track_queue(self, depth: Callable[[], int]) -> None:
        self.queue_depth.set_function(depth)

    def request(self, outcome: str, status: int, seconds: float | None = None) -> None:
        self.requests.labels(outcome, str(status)).inc()
        if seconds is not None:
            self.request_seconds.observe(seconds)

    def batch(self, record) -> None:
        """One scored batch (a scheduler BatchRecord); runs on the scheduler's thread."""
        self.batch_size.observe(record.rows)
        self.batch_tokens.observe(record.padded_tokens)
        self.inference_seconds.observe(record.seconds)
        if record.predicted_seconds:
            self.predicted_ratio.observe(record.seconds / record.predicted_seconds)
        for q in record.queue_seconds:
            self.queue_seconds.observe(q)
        self.padded.inc(record.padded_tokens)
        self.useful.inc(record.useful_tokens)
        with self._lock:
            self._padded += record.padded_tokens
            self._useful += record.useful_tokens
            self.padding_ratio.set(PaddingStats(self._useful, self._padded).overhead)
        self.prefix_saved.inc(record.prefix_tokens_saved)

    def verification(self, mismatch: bool, max_abs_diff: float) -> None:
        self.verified.inc()
        if mismatch:
            self.mismatches.inc()
        with self._lock:
            self._deviation = max(self._deviation, max_abs_diff)
            self.verify_deviation.set(self._deviation)

    def render(self) -> bytes:
        return generate_latest(self.registry)
