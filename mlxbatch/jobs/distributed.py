"""Data-parallel classification over `mlx.launch` ranks: rank 0's settings sent once, whole
batches dealt by padded tokens and gathered to rank 0's journal, collectives under a watchdog."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..api.classifier import Classifier
from ..api.spec import RunSpec, Settings
from ..engine.planner import Batch
from ..errors import JobError
from ..io.sinks import Journal, Sink
from ..runtime import testhold
from .plan import JobPlan
from .rows import append_batch, batch_rows, todo_batches
from .verify import merge_reports, verify_window

HOST_BYTES = 64


class Cluster:
    """The ranks of an `mlx.launch` job, with watchdog-guarded collectives."""

    def __init__(self, group, timeout: float):
        self.group, self.timeout = group, timeout
        self.rank, self.size = group.rank(), group.size()
        self.host = socket.gethostname()
        raw = np.frombuffer(self.host.encode()[:HOST_BYTES].ljust(HOST_BYTES, b"\0"), np.uint8)
        hosts = self.gather(raw.astype(np.int32), "hostnames")
        self.hosts = [
            bytes(h.astype(np.uint8)).rstrip(b"\0").decode(errors="replace") for h in hosts
        ]

    @classmethod
    def join(cls, required: bool, timeout: float) -> Cluster | None:
        """The launch's group of two or more ranks, else None (an error when `required`)."""
        try:
            group = mx.distributed.init(strict=required)
        except Exception as e:  # MLX raises RuntimeError with the backend's reason
            raise JobError(
                f"--distributed: no distributed group could be formed ({e}); start "
                "the job with mlx.launch (see docs/distributed.md)"
            ) from None
        if group.size() < 2:
            if required:
                raise JobError(
                    "--distributed: this process is the only rank; start the job "
                    "with mlx.launch -n N (see docs/distributed.md)"
                )
            return None
        return cls(group, timeout)

    def _guarded(self, what: str, fn):
        fired = threading.Event()

        def fire():
            fired.set()
            sys.stderr.write(
                f"error: rank {self.rank} ({self.host}): the collective '{what}' did not complete "
                f"within {self.timeout:.0f} s: another rank died or hangs (MLX's ring backend "
                "can hang instead of failing); finished batches are kept by rank 0's journal: "
                "run the same command with --resume\n"
            )
            sys.stderr.flush()
            os._exit(3)

        timer = threading.Timer(self.timeout, fire)
        timer.daemon = True
        timer.start()
        try:
            return fn()
        except RuntimeError as e:  # e.g. "[ring] connection to a peer was lost"
            raise JobError(
                f"rank {self.rank} ({self.host}): the collective '{what}' failed ({e}): another "
                "rank died or was stopped (mlx.launch names it); finished batches are kept by "
                "rank 0's journal: run the same command with --resume"
            ) from None
        finally:
            timer.cancel()

    def gather(self, arr: np.ndarray, what: str) -> np.ndarray:
        """(size, *arr.shape): every rank's `arr` (the same shape on every rank)."""

        def run():
            out = mx.distributed.all_gather(mx.array(arr)[None], group=self.group)
            mx.eval(out)
            return np.array(out)

        return self._guarded(what, run)

    def broadcast(self, arr: np.ndarray, what: str) -> np.ndarray:
        """Rank 0's int32 `arr` on every rank."""
        return self.gather(arr if self.rank == 0 else np.zeros_like(arr), what)[0]

    def gather_json(self, value, what: str) -> list:
        """Every rank's JSON-serializable `value` (sizes first, then the padded bytes)."""
        data = json.dumps(value).encode()
        sizes = self.gather(np.array([len(data)], np.int32), f"{what} (sizes)")[:, 0]
        buf = np.zeros(-(-int(sizes.max()) // 4) * 4, np.uint8)
        buf[: len(data)] = np.frombuffer(data, np.uint8)
        got = self.gather(buf.view(np.int32), what).view(np.uint8)
        return [json.loads(bytes(got[k, : sizes[k]])) for k in range(self.size)]


def deal(batches: list[Batch], ranks: int) -> list[list[Batch]]:
    """Whole batches to ranks, largest first to the least loaded (by padded tokens)."""
    loads, out = [0] * ranks, [[] for _ in range(ranks)]
    for b in sorted(batches, key=lambda b: (-b.padded_tokens, b.indices)):
        r = min(range(ranks), key=lambda k: (loads[k], k))
        out[r].append(b)
        loads[r] += b.padded_tokens
    return out


@dataclass
class RankStats:
    items: int = 0
    seconds: float = 0.0
    padded: int = 0


class RankGroup:
    """`job.LocalGroup`'s methods over the ranks of a cluster."""

    def __init__(self, cluster: Cluster):
        self.cluster, self.rank = cluster, cluster.rank
        self.stats = RankStats()
        self.lanes: list[int] | None = None

    def share(self, settings: Settings | None, clf: Classifier, spec: RunSpec) -> Settings:
        """Rank 0's settings on every rank, exactly as it resolved them: a rank with less free
        memory must not cut items at another limit."""
        record = self.cluster.gather_json(
            settings.record() if self.rank == 0 else None, "settings"
        )[0]
        return settings if self.rank == 0 else clf.settings(spec, record)

    def agree(self, fingerprint: str) -> None:
        digest = np.frombuffer(hashlib.sha256(fingerprint.encode()).digest(), np.int32)
        digests = self.cluster.gather(digest, "fingerprints")
        differ = [k for k in range(self.cluster.size) if not np.array_equal(digests[k], digests[0])]
        if differ:
            raise JobError(
                f"rank(s) {differ} ({', '.join(self.cluster.hosts[k] for k in differ)}) "
                "hold a different input, model, labels, settings or compute path "
                "(BLAS, host kernels, device, MLX) than rank 0"
            )

    def opened(self, sink: Sink, output: Path | None) -> None:
        _on_sigterm(sink, output)

    def score(
        self,
        clf: Classifier,
        window,
        plan: JobPlan,
        sink: Sink | None,
        settings: Settings,
        verify: bool,
        bar,
    ) -> tuple[list[tuple[int, dict]], dict | None]:
        """The window's batches not in rank 0's journal, dealt and scored; (rows, verification)."""
        c = self.cluster
        if self.lanes is None:
            self.lanes = [
                int(x[0]) for x in c.gather(np.array([clf.engine.lanes], np.int32), "lanes")
            ]
        done = np.zeros(len(plan.batches), np.int32)
        if sink is not None:
            todo = set(map(id, todo_batches(plan, sink.done)))
            done = np.array([id(b) not in todo for b in plan.batches], np.int32)
        if len(done):
            done = c.broadcast(done, "journal state")
        shares = deal([b for b, d in zip(plan.batches, done) if not d], c.size)
        checking = verify or settings.checking
        written, mine = self._rounds(
            clf, window, plan, shares, sink, settings.spec.on_error, bar, checking
        )
        if not checking:
            return written, None
        prompts = {i: plan.items[i].prompt for i in mine}
        reports = c.gather_json(
            verify_window(clf, window.ids(prompts), prompts, mine, settings, verify),
            "verification",
        )
        merged = merge_reports([r for r in reports if r is not None])
        if merged is not None:  # the ranks verified at once: the window waited for the slowest
            merged["seconds"] = max(r["seconds"] for r in reports if r is not None)
        return written, merged

    def _rounds(self, clf, window, plan, shares, sink, on_error, bar, keep_own: bool):
        """Rounds of a batch a lane on every rank, journaled by rank 0; (rank 0's rows, own)."""
        n_labels = len(clf.labels.names)
        rounds = [
            [share[start : start + n] for start in range(0, len(share), n)]
            for share, n in zip(shares, self.lanes)
        ]
        mine = rounds[self.rank]
        written, own = [], {}
        for r in range(max((len(x) for x in rounds), default=0)):
            rows_at_most = max(len(b.indices) for x in rounds if r < len(x) for b in x[r])
            probs = np.full((max(self.lanes), rows_at_most, n_labels), np.nan, np.float32)
            if r < len(mine):
                started = time.perf_counter()
                for lane, (batch, got, _) in enumerate(plan.scheduler.step(mine[r])):
                    probs[lane, : len(got)] = got
                    if keep_own:
                        own.update(batch_rows(clf, window, plan, batch, got, "skip"))
                self.stats.seconds += time.perf_counter() - started
                self.stats.items += sum(len(b.indices) for b in mine[r])
                self.stats.padded += sum(b.padded_tokens for b in mine[r])
            everyone = self.cluster.gather(probs, f"results of round {r + 1}")
            if sink is None:
                continue
            for rank, batches in enumerate(rounds):
                for lane, batch in enumerate(batches[r] if r < len(batches) else []):
                    got = everyone[rank, lane, : len(batch.indices)]
                    out = append_batch(clf, window, plan, sink, batch, got, on_error)
                    written += out
                    bar.update(len(out))
            testhold.after_batch(r + 1)  # the test seam: a test stops a job here
        return written, {i: row for i, row in own.items() if i in plan.items}

    def ranks(self) -> list[dict]:
        """Every rank's items, padded tokens and computing seconds (a collective)."""
        s = self.stats
        table = self.cluster.gather(
            np.array([s.items, s.padded, int(s.seconds * 1e6)], np.int64).view(np.int32),
            "statistics",
        ).view(np.int64)
        return [
            {
                "rank": k,
                "host": self.cluster.hosts[k],
                "items": int(t[0]),
                "padded_tokens": int(t[1]),
                "seconds": t[2] / 1e6,
            }
            for k, t in enumerate(table)
        ]


def _on_sigterm(sink, output) -> None:
    """mlx.launch stops the other ranks with SIGTERM when one fails: say so, keep the journal."""

    def handler(signum, frame):
        where = (
            f"finished batches are kept in {output}.part: run the same command with "
            "--resume to continue"
            if isinstance(sink, Journal)
            else ""
        )
        sys.stderr.write(
            f"error: rank 0 ({socket.gethostname()}) was stopped by the launcher: "
            f"another rank failed or was killed (mlx.launch names it); {where}\n"
        )
        sys.stderr.flush()
        os._exit(3)

    signal.signal(signal.SIGTERM, handler)
