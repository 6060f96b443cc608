"""How `bench --scale` makes and measures one run: the workload, a `classify` child (max RSS
from `wait4`, resident size over time), the repeats' agreement and the plans' padding."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import JobError
from .scaling import classify_command
from .workload import generate

WINDOW_ROWS = 16_384  # classify's default --window-rows, to count the windows of a run
CHUNK = 10_000  # tickets generated at a time, so the generator stays flat in memory too
NEAR = 64  # a close repeat copies one of the last NEAR rows ...
POOL = 4_096  # ... a far one a uniform sample (reservoir) of every earlier original
TOKENIZER_SAMPLE = 20_000

SUMMARY = re.compile(
    r"(?P<rows>\d+) rows \((?P<scored>\d+) scored, (?P<errors>\d+) errors\) in "
    r"(?P<seconds>[\d.]+) s, (?P<rate>[\d.]+) items/s, padding overhead (?P<padding>[\d.]+)%"
)
DUPLICATES = re.compile(r"(\d+) duplicates scored once")
PEAK = re.compile(r"peak memory (?P<peak>[\d.]+) GiB \(bound (?P<bound>[\d.]+) GiB\)")


def write_workload(path: Path, n: int, duplicates: float, seed: int = 0) -> int:
    """`n` tickets as .jsonl.gz, each with chance `duplicates` an exact repeat of an earlier row
    (half from the last NEAR rows); returns the number of repeats."""
    r = random.Random(f"mlxbatch-scale/{seed}/{duplicates}")
    recent: deque[tuple[str, str]] = deque(maxlen=NEAR)
    pool: list[tuple[str, str]] = []
    originals = repeats = 0
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        for start in range(0, n, CHUNK):
            chunk = generate(min(CHUNK, n - start), seed=seed * 100_003 + start // CHUNK)
            for i, row in enumerate(chunk, start):
                ticket = (row["text"], row["intent"])
                if recent and r.random() < duplicates:
                    ticket = r.choice(recent) if r.random() < 0.5 else r.choice(pool)
                    repeats += 1
                else:
                    originals += 1
                    if len(pool) < POOL:
                        pool.append(ticket)
                    elif (j := r.randrange(originals)) < POOL:
                        pool[j] = ticket
                recent.append(ticket)
                f.write(
                    json.dumps(
                        {"id": f"t{i + 1:07d}", "text": ticket[0], "intent": ticket[1]},
                        ensure_ascii=False,
                    )
                    + "\n"
                )
    return repeats


def rss_trace(
    pid: int, stop: threading.Event, every: float = 1.0, peak: list | None = None
) -> list[tuple[float, float]]:
    """(seconds, resident MB) of process `pid` every `every` seconds until `stop` (Linux's /proc;
    empty elsewhere); `peak` gets the child's own VmHWM, which wait4's ru_maxrss is not."""
    t0, out = time.perf_counter(), []
    while not stop.wait(every):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = {
                    x.split(":")[0]: int(x.split()[1])
                    for x in f
                    if x.startswith(("VmRSS:", "VmHWM:"))
                }
            kb = fields["VmRSS"]
        except (OSError, KeyError, ValueError, IndexError):
            break
        if peak is not None and "VmHWM" in fields:
            peak[:] = [fields["VmHWM"] / 1024]
        out.append((round(time.perf_counter() - t0, 1), round(kb / 1024, 1)))
    return out


def run_job(model: Path, src: Path, out: Path, *extra: str) -> dict:
    """One `classify` child: wall seconds, max RSS, resident size over time, the summary's figures."""
    cmd = classify_command(src, model, "-o", str(out), *extra)
    with tempfile.TemporaryFile() as log, ThreadPoolExecutor(1) as pool:
        t = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        stop = threading.Event()
        hwm: list[float] = []
        trace = pool.submit(rss_trace, child.pid, stop, 1.0, hwm)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t
        stop.set()
        child.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read().decode(errors="replace")
    summary = SUMMARY.search(text)
    if child.returncode or not summary:
        raise JobError(f"`{' '.join(cmd)}` exited {child.returncode}: {text[-600:]}")
    dup, peak = DUPLICATES.search(text), PEAK.search(text)
    return {
        "rows": int(summary["rows"]),
        "scored": int(summary["scored"]),
        "errors": int(summary["errors"]),
        "job_seconds": float(summary["seconds"]),
        "items_per_s": float(summary["rate"]),
        "padding": float(summary["padding"]) / 100,
        "duplicates_scored_once": int(dup[1]) if dup else 0,
        "wall_seconds": wall,
        "max_rss_mb": max(hwm[0], max((mb for _, mb in trace.result()), default=0))
        if hwm
        else usage.ru_maxrss / 1024,  # the child's own; else the OS's (no /proc)
        "command": " ".join(cmd),
        # MLX's own peak (the batches' buffers) and the job's bound for it, from the summary
        "mlx_peak_mb": float(peak["peak"]) * 1024 if peak else None,
        "mlx_bound_mb": float(peak["bound"]) * 1024 if peak else None,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,  # less disturbed by a shared host
        "rss_trace": trace.result()[:: -(-len(trace.result()) // 300) or 1],  # <= 300 points
    }


def repeats_agree(src: Path, out: Path) -> bool:
    """Whether every repeat of a text got the same output row (bar its id) as its first copy."""
    first: dict[str, str] = {}
    with gzip.open(src, "rt", encoding="utf-8") as rows, out.open(encoding="utf-8") as results:
        for row, line in zip(rows, results, strict=True):
            result = json.loads(line)
            result.pop("id", None)
            if first.setdefault(json.loads(row)["text"], json.dumps(result)) != json.dumps(result):
                return False
    return True


def tokenizer_rate(model: Path, src: Path) -> dict:
    """`Engine.prompts` timed in this process on the first TOKENIZER_SAMPLE tickets of `src`."""
    from ..api.classifier import Classifier

    engine = Classifier.load(model).engine
    with gzip.open(src, "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line, _ in zip(f, range(TOKENIZER_SAMPLE))]
    t = time.perf_counter()
    tokens = sum(
        len(p) for s in range(0, len(texts), 1024) for p in engine.prompts(texts[s : s + 1024])
    )
    seconds = time.perf_counter() - t
    return {
        "items": len(texts),
        "tokens": tokens,
        "seconds": seconds,
        "items_per_s": len(texts) / seconds,
        "tokens_per_s": tokens / seconds,
    }


def plan_padding(model: Path, src: Path, windows: dict[str, int]) -> list[dict]:
    """The padding of `src`'s plans under classify's defaults for each window size, unscored."""
    from ..api.classifier import Classifier
    from ..api.spec import RunSpec
    from ..engine.planner import PaddingStats
    from ..io.windows import JobInput
    from ..jobs.plan import plan_window

    clf = Classifier.load(model)
    settings = clf.settings(RunSpec())
    out = []
    for name, size in windows.items():
        useful = padded = count = 0
        for start, rows in JobInput.of_file(str(src)).windows(size):
            plan = plan_window(clf, rows, start, settings, False)
            useful, padded, count = (
                useful + plan.useful_tokens,
                padded + plan.padded_tokens,
                count + 1,
            )
        out.append(
            {
                "name": name,
                "window_rows": size,
                "windows": count,
                "useful_tokens": useful,
                "padded_tokens": padded,
                "padding": PaddingStats(useful, padded).overhead,
            }
        )
    return out
