"""The service behind the routes: the classifier and the live scheduler, loaded in the
background (starting -> ready -> draining, or failed), and one request's path to its reply."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import numpy as np

from ..api.classifier import Classifier
from ..api.limits import LIMIT_SETTINGS, prepare
from ..api.questions import answer_words
from ..api.spec import RunSpec
from ..api.verify import Check, check
from ..engine.item import Item
from ..engine.labels import LabelSet
from ..engine.live import LiveScheduler, QueueFull
from ..engine.promptspec import PromptSpec
from ..errors import LabelError, flag, worded
from ..model.tokenizer import PromptTokenizer
from .errors import ApiError
from .limits import ClassifyBody, Limits
from .metrics import Metrics
from .verify import Verifier

log = logging.getLogger("mlxbatch.serve")
# A request whose texts hold more characters is tokenized one at a time, on a thread of its
# own: a 2 MB text under "truncate" held ~170 MB and ~1 s of a worker thread; 16 at once held
# 3.2 GB, and a SIGTERM waited for every thread (8.9 s on a 2 s --drain-timeout)
LONG_CHARS = 1 << 16


@dataclass(frozen=True)
class ServeSpec:
    """Everything the server is started with; no request can change any of it."""

    model: Path
    name: str  # the model name requests may give (the --model argument as typed)
    prompt: PromptSpec = field(default_factory=PromptSpec)  # labels, system prompt, ...
    batch_tokens: int | None = None
    max_batch: int = 64
    limits: Limits = field(default_factory=Limits)
    verify_sample: float = 0.0


def preflight(spec: ServeSpec) -> None:
    """What can be refused before the port is bound and the weights load (a UsageError): the
    tokenizer, and the label sets as it tokenizes them (the rest of the prompt was checked
    when its `PromptSpec` was built)."""
    tokenizer = PromptTokenizer(spec.model)
    questions = spec.prompt.questions
    if questions is None:
        LabelSet.build(spec.prompt.labels, tokenizer.label, tokenizer.vocab_size)
        return
    for asked in questions.asked():
        try:
            LabelSet.build(asked.labels, tokenizer.label, tokenizer.vocab_size)
        except LabelError as e:
            raise LabelError(f"question {asked.question!r}: field 'labels': {e}") from None


class Service:
    def __init__(self, spec: ServeSpec, metrics: Metrics | None = None):
        self.spec, self.limits = spec, spec.limits
        self.metrics = metrics or Metrics()
        self.state, self.failure, self.degraded = "starting", None, False
        self.clf = self.scheduler = self.verifier = self.settings = None
        self.on_drain: list[Callable[[], None]] = []  # the app's: end stalled body reads
        self.startup: dict[str, float] = {}
        self.created = int(time.time())
        self.on_failed: Callable[[], None] = lambda: None  # set by the server: stop serving
        # long requests' tokenizing (LONG_CHARS), one at a time: a turn held by the thread,
        # not by the request, whose cancel (the client gone, the drain) ends it but not its
        # thread (a semaphore the request held let 20 clients that sent 2 MB and left run 14
        # more threads at once, +1.7 GB); a turn not yet begun is cancelled with its request
        self.long_requests = ThreadPoolExecutor(1, thread_name_prefix="mlxbatch-long")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.spec.name, self.spec.model.name, str(self.spec.model))

    def start(self) -> threading.Thread:
        """Load in the background: the server listens (and /health says 503) meanwhile."""
        thread = threading.Thread(target=self._load, name="mlxbatch-load", daemon=True)
        thread.start()
        return thread

    def _load(self) -> None:
        t0 = time.perf_counter()
        try:
            s = self.spec
            self.clf = clf = Classifier.load(s.model, prompt=s.prompt)
            t1 = time.perf_counter()
            self.settings = clf.settings(
                RunSpec(
                    batch_tokens=s.batch_tokens,
                    max_batch=s.max_batch,
                    max_tokens=self.limits.max_tokens,
                )
            )
            self.verifier = Verifier(s.verify_sample, self._check, self._verified)
            self.scheduler = LiveScheduler(
                clf.engine,
                self.settings.policy,
                max_wait=self.limits.max_wait_s,
                max_queue=self.limits.max_queue,
                on_batch=self.metrics.batch,
                on_idle=self.verifier.step,
            )
            self.scheduler.start()
            self.metrics.track_queue(lambda: self.scheduler.queued)
        except Exception as e:  # a bad checkpoint or label set: say so, then stop the server
            self.state, self.failure = "failed", str(e) or type(e).__name__
            log.error("the model failed to load: %s", self.failure)
            self.on_failed()
            return
        t2 = time.perf_counter()
        self.startup = {"load_seconds": t1 - t0, "plan_seconds": t2 - t1, "seconds": t2 - t0}
        self.metrics.startup_seconds.set(t2 - t0)
        if self.state == "starting":  # not draining already
            self.state = "ready"
            self.metrics.ready.set(1)
        log.info("ready in %.2f s: %s", t2 - t0, clf.lm.describe())

    def drain(self) -> None:
        """Stop accepting (503); what is queued still finishes."""
        self.metrics.ready.set(0)
        if self.state in ("starting", "ready"):
            self.state = "draining"
            for hook in self.on_drain:
                hook()

    def close(self, drain: bool = True) -> None:
        """Stop the scheduler: with `drain`, after what is queued is scored."""
        self.drain()
        self.long_requests.shutdown(wait=False)  # what it holds still ends (the drain's deadline)
        if self.scheduler is not None:
            self.scheduler.close(drain=drain)

    def check_accepting(self) -> None:
        if self.state != "ready":
            what = {
                "starting": "the model is still loading",
                "draining": "the server is shutting down",
            }.get(self.state, "the model failed to load")
            raise ApiError(503, what, {"Retry-After": "1"} if self.state == "starting" else None)

    async def classify(self, req: ClassifyBody) -> dict:
        """The reply to one request; ApiError for 422, 429 and 503."""
        # off the event loop however short: a few 1 MB texts held it for seconds
        if sum(len(t) for t in req.texts) > LONG_CHARS:
            try:
                turn = asyncio.get_running_loop().run_in_executor(
                    self.long_requests, self._prepare, req
                )
            except RuntimeError:  # closed: the service is ending
                raise ApiError(503, "the server is shutting down") from None
            items = await turn
        else:
            items = await anyio.to_thread.run_sync(self._prepare, req)
        try:
            future = self.scheduler.submit(items)
        except QueueFull as e:
            wait = max(1, math.ceil(e.retry_after))
            raise ApiError(
                429,
                f"the queue is full ({self.limits.max_queue:,} items); retry in {wait} s",
                {"Retry-After": str(wait)},
            ) from None
        except RuntimeError as e:  # the scheduler began draining
            raise ApiError(503, f"the server is shutting down ({e})") from None
        # shielded: a cancelled request must not cancel the scheduler's future under it; its
        # error, once nobody awaits it (cut at the drain deadline), is read, not logged
        scored = asyncio.wrap_future(future)
        scored.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            probs = await asyncio.shield(scored)
        except asyncio.CancelledError:  # the client is gone, or the drain ended: not scored
            self.scheduler.withdraw(future)
            raise
        rid = f"classify-{uuid.uuid4().hex}"
        self.verifier.offer(rid, [item.prompt for item in items], probs)
        self.metrics.items.inc(len(items))
        return self._reply(rid, items, probs)

    def _prepare(self, req: ClassifyBody) -> list[Item]:
        out = []
        for i, text in enumerate(req.texts):
            item = prepare(self.clf.engine, text, self.settings.limit, req.truncate, i, hint="")
            if isinstance(item, str):
                item = worded(item, flag, LIMIT_SETTINGS)  # the limit is the server's flag
                raise ApiError(422, f'input[{i}]: {item}; send "truncate": true to cut it')
            out.append(item)
        return out

    def _reply(self, rid: str, items: list[Item], probs: np.ndarray) -> dict:
        names = self.clf.labels.names
        data = []
        for i, (item, said) in enumerate(zip(items, self.clf.predictions(probs))):
            if said.not_finite:  # (a NaN reply was a text/plain 500)
                raise ApiError(500, f"input[{i}]: {self.clf.non_finite()}")
            row = (
                {
                    "index": i,
                    "label": said.label,
                    "probs": [said.scores[n] for n in names],
                    "num_classes": len(names),
                    "scores": said.scores,
                    "abstained": said.abstained,
                }
                if said.answers is None
                else {"index": i, "answers": said.answers}
            )
            if item.truncated:
                row["truncated"] = item.truncated
            data.append(row)
        tokens = sum(len(item.prompt) for item in items)
        cached = tokens - sum(item.fed for item in items)
        usage = {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        return {
            "id": rid,
            "object": "list",
            "created": int(time.time()),
            "model": self.spec.name,
            "data": data,
            "usage": usage,
        }

    def _check(self, prompt: list[int], probs: np.ndarray):
        """An item served with raw `probs`, against the gold loop (api/verify.py)."""
        if hasattr(self.clf, "check_answers"):  # questions: every answer, and the scores
            served = self.clf.predictions(np.asarray(probs)[None])[0].answers
            gold, _, diff = self.clf.check_answers(prompt, served)
            return Check(answer_words(gold), answer_words(served), diff, 0.0)
        return check(self.clf, prompt, self.clf.adjust.apply(np.asarray(probs)[None])[0])

    def _verified(self, mismatch: bool, diff: float) -> None:
        self.metrics.verification(mismatch, diff)
        if mismatch:
            self.degraded = True

    def health(self) -> tuple[int, dict]:
        if self.state != "ready":
            body = {"status": self.state}
            if self.failure:
                body["error"] = self.failure
            return 503, body
        v = self.verifier
        return 200, {
            "status": "degraded" if self.degraded else "ok",
            "startup": self.startup,
            "queued": self.scheduler.queued,
            "verify_mismatches": v.mismatches,
            "verify_pending": len(v.pending),
        }

    def describe(self) -> dict:
        """The served model as /v1/models shows it (OpenAI's list shape, plus what we serve)."""
        import mlx.core as mx

        clf = self.clf
        prefix = np.asarray(clf.engine.prefix, np.int64).tobytes()
        card = {
            "id": self.spec.name,
            "object": "model",
            "created": self.created,
            "owned_by": "mlxbatch",
            "checkpoint": clf.lm.describe(),
            "labels": list(clf.columns),
            **(
                {
                    "questions": [
                        {"name": q.name, "multi_label" if q.multi else "labels": list(q.labels)}
                        for q in clf.questions.questions
                    ]
                }
                if hasattr(clf, "questions")
                else {}
            ),
            "prefix": {
                "tokens": len(clf.engine.prefix),
                "sha256": hashlib.sha256(prefix).hexdigest(),
            },
            # as resolved: the item limit the requests meet and the budget batches are cut by
            "limits": self.limits.as_dict()
            | {
                "item_limit": {
                    "tokens": self.settings.limit.tokens,
                    "set_by": worded(self.settings.limit.source, flag, LIMIT_SETTINGS),
                }
            },
            "batching": {
                "max_batch": self.spec.max_batch,
                "batch_tokens": self.settings.policy.batch_tokens,
                "lanes": clf.engine.lanes,
            },
            "calibrate": self.spec.prompt.calibrate,
            "min_confidence": self.spec.prompt.min_confidence,
            "verify_sample": self.spec.verify_sample,
            "device": str(mx.default_device()),
        }
        return {"object": "list", "data": [card]}
