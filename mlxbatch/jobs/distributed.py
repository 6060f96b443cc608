"""Data-parallel classification over MLX's distributed layer (`mlx.launch`: ring, MPI, NCCL).

Every rank reads, validates and tokenizes the whole input and computes the same global batch
plan (rank 0's batch shape and cost model are broadcast first, and the ranks check that they
hold the same input, model and settings). Whole batches are dealt to ranks balanced by padded
tokens; each batch is computed exactly as a single process would, so the scores are
bit-identical. After every round (one batch a rank) the probabilities are all-gathered, padded
to the round's largest batch (every rank knows the plan, so only the numbers travel), and
rank 0 appends them to its journal: `--resume` after a kill of any rank re-deals only the
batches the journal lacks. Every collective runs under a watchdog: MLX's ring backend has been
seen to hang rather than fail when a peer dies.
"""

from __future__ import annotations

import dataclasses
import hashlib
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
from ..api.spec import RunSpec
from ..engine.planner import Batch
from ..errors import JobError
from ..io.inputs import Row
from ..io.sinks import Journal, recorded_header
from ..runtime import testhold
from .fingerprint import fingerprint
from .job import (
    JobResult,
    append_batch,
    job_result,
    open_job_sink,
    progress_bar,
    refuse_bad_rows,
    scheduler_for,
    todo_batches,
)
from .plan import JobPlan, plan_job
from .source import BAD_KEPT, Scan
from .verify import verify_window

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
        """The launch's group when there is more than one rank, else None (or an error when
        `required`)."""
        try:
            group = mx.distributed.init(strict=required)
        except Exception as e:  # MLX raises RuntimeError with the backend's reason
            raise JobError(f"--distributed: no distributed group could be formed ({e}); start "
                           "the job with mlx.launch (see README)") from None  # fmt: skip
        if group.size() < 2:
            if required:
                raise JobError("--distributed: this process is the only rank; start the job "
                               "with mlx.launch -n N (see README)")  # fmt: skip
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


def _f64_to_i32(values: list[float]) -> np.ndarray:
    return np.array(values, np.float64).view(np.int32)


def shared_settings(cluster: Cluster, plan: JobPlan | None, n_fields: int = 7) -> dict | None:
    """Rank 0's batch shape, item limit and cost model, exactly (float64 bits travel as int32
    pairs): a rank with less free memory must not cut items at another limit."""
    from ..engine.planner import CostModel

    if cluster.rank == 0:
        s, c = plan.settings, plan.cost
        vals = [
            s["batch_tokens"],
            s["max_batch"],
            s["item_limit"][0],
            *((c.per_batch, c.per_token, c.per_key, c.lanes) if c else (np.nan,) * 4),
        ]
    else:
        vals = [0.0] * n_fields
    got = cluster.broadcast(_f64_to_i32(vals), "settings").view(np.float64)
    out = {"batch_tokens": int(got[0]), "max_batch": int(got[1]), "cost_model": None,
           "item_limit": [int(got[2]), "rank 0's item limit"]}  # fmt: skip
    if not np.isnan(got[3]):
        out["cost_model"] = CostModel(*map(float, got[3:6]), int(got[6]), "rank 0").to_dict()
    return out


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


def run_distributed_job(
    cluster: Cluster, clf: Classifier, rows: list[Row], spec: RunSpec, output: Path | None,
    resume: bool = False, verify: bool = False, source: str = "input", fmt: str = "jsonl",
) -> JobResult | None:  # fmt: skip
    """The classify job over every rank; rank 0 returns the result, the others None."""
    t0, rank = time.perf_counter(), cluster.rank
    header = {"fingerprint": fingerprint(rows, clf, spec)}
    digest = np.frombuffer(hashlib.sha256(header["fingerprint"].encode()).digest(), np.int32)
    digests = cluster.gather(digest, "fingerprints")
    differ = [k for k in range(cluster.size) if not np.array_equal(digests[k], digests[0])]
    if differ:
        raise JobError(f"rank(s) {differ} ({', '.join(cluster.hosts[k] for k in differ)}) hold a "
                       "different input, model, labels or settings than rank 0")  # fmt: skip
    recorded = recorded_header(output, header) if rank == 0 and output and resume else None
    plan0 = (
        plan_job(clf, rows, spec, recorded["settings"] if recorded else None) if rank == 0 else None
    )
    plan = plan0 or plan_job(clf, rows, spec, shared_settings(cluster, None))
    if rank == 0:
        shared_settings(cluster, plan0)
    bad = [dataclasses.replace(r, error=r.error or plan.errors.get(i)) for i, r in enumerate(rows)
           if r.error or i in plan.errors]  # fmt: skip
    refuse_bad_rows(Scan(len(rows), "", bad[:BAD_KEPT], len(bad)), spec, source, fmt)
    sink = None
    if rank == 0:
        sink = open_job_sink(clf, rows, plan, output, header, resume)
        _on_sigterm(sink, output)
    done = np.zeros(len(plan.batches), np.int32)
    if rank == 0:
        todo = set(map(id, todo_batches(plan, sink.done)))
        done = np.array([id(b) not in todo for b in plan.batches], np.int32)
    done = cluster.broadcast(done, "journal state")
    remaining = [b for b, d in zip(plan.batches, done) if not d]
    shares = deal(remaining, cluster.size)
    written: dict[int, dict] = {}  # rank 0's rows, for verification
    stats = _rounds(cluster, clf, rows, plan, shares, sink, spec.on_error, written)
    table = cluster.gather(np.array([stats.items, stats.padded, int(stats.seconds * 1e6)], np.int64)
                           .view(np.int32), "statistics").view(np.int64)  # fmt: skip
    if rank != 0:
        return None
    seconds = time.perf_counter() - t0
    report = verify_window(clf, rows, plan, written, spec, verify)
    sink.finish(len(rows), clf.labels.names)
    per_rank = [{"rank": k, "host": cluster.hosts[k], "items": int(t[0]), "padded_tokens": int(t[1]),
                 "seconds": t[2] / 1e6} for k, t in enumerate(table)]  # fmt: skip
    return job_result(clf, rows, plan, sink, seconds, mx.get_peak_memory(), report, per_rank)


def _rounds(cluster, clf, rows, plan, shares, sink, on_error, written) -> RankStats:
    """Rounds of one batch per CPU lane on every rank (each batch whole on one lane, as in a
    single process); rank 0 journals every round's results."""
    n_labels = len(clf.labels.names)
    lanes = [int(x[0]) for x in cluster.gather(np.array([clf.engine.lanes], np.int32), "lanes")]
    rounds = [[share[start : start + n] for start in range(0, len(share), n)]
              for share, n in zip(shares, lanes)]  # fmt: skip
    mine = rounds[cluster.rank]
    scheduler = scheduler_for(clf, plan, [b for batches in mine for b in batches])
    stats = RankStats()
    todo = sum(len(b.indices) + sum(len(plan.copies.get(i, ())) for i in b.indices)
               for x in shares for b in x)  # fmt: skip
    bar = progress_bar(len(rows), len(rows) - todo) if cluster.rank == 0 else None
    try:
        for r in range(max((len(x) for x in rounds), default=0)):
            rows_at_most = max(len(b.indices) for x in rounds if r < len(x) for b in x[r])
            probs = np.full((max(lanes), rows_at_most, n_labels), np.nan, np.float32)
            if r < len(mine):
                started = time.perf_counter()
                for lane, (_, got, _) in enumerate(scheduler.run(mine[r])):
                    probs[lane, : len(got)] = got
                stats.seconds += time.perf_counter() - started
                stats.items += sum(len(b.indices) for b in mine[r])
                stats.padded += sum(b.padded_tokens for b in mine[r])
            everyone = cluster.gather(probs, f"results of round {r + 1}")
            if sink is None:
                continue
            for rank, batches in enumerate(rounds):
                for lane, batch in enumerate(batches[r] if r < len(batches) else []):
                    got = everyone[rank, lane, : len(batch.indices)]
                    out = append_batch(clf, rows, plan, sink, batch, got, on_error)
                    written.update(out)
                    bar.update(len(out))
            testhold.after_batch(r + 1)
    except BaseException:
        if sink is not None:
            sink.close()
        raise
    finally:
        if bar is not None:
            bar.close()
    return stats


def _on_sigterm(sink, output) -> None:
    """mlx.launch stops the other ranks with SIGTERM when one fails: say so, keep the journal."""

    def handler(signum, frame):
        where = (f"finished batches are kept in {output}.part: run the same command with "
                 "--resume to continue" if isinstance(sink, Journal) else "")  # fmt: skip
        sys.stderr.write(f"error: rank 0 ({socket.gethostname()}) was stopped by the launcher: "
                         f"another rank failed or was killed (mlx.launch names it); {where}\n")  # fmt: skip
        sys.stderr.flush()
        os._exit(3)

    signal.signal(signal.SIGTERM, handler)
