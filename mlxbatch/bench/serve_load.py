"""`mlxbatch bench-serve`: `mlxbatch serve` under open-loop Poisson load at fractions of what
`classify --mode sorted` does, and one request at a time for latency."""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np


@dataclass(frozen=True)
class LoadOptions:
    model: Path
    texts: tuple[str, ...]
    loads: tuple[float, ...] = (0.25, 0.5, 0.7, 0.9, 1.2, 2.0)  # x classify's items/s
    seconds: float = 10.0  # of arrivals at each load
    sequential: int = 40  # requests sent one at a time
    soak_seconds: float = 0.0  # at 70% of capacity
    max_queue: int = 256
    serve_args: tuple[str, ...] = ()


def baseline(model: Path, texts: list[str], alone: int) -> dict:
    """classify --mode sorted on every ticket, and each of the first `alone` scored alone."""
    from ..api.classifier import Classifier

    clf = Classifier.load(model)
    clf.classify(texts[:32])  # warm the lanes' buffers
    start = time.perf_counter()
    clf.classify(texts, mode="sorted")
    seconds = time.perf_counter() - start
    one = []
    for t in texts[:alone]:
        t0 = time.perf_counter()
        clf.classify([t], mode="sorted")
        one.append(time.perf_counter() - t0)
    return {
        "classify_seconds": seconds,
        "classify_items_per_s": len(texts) / seconds,
        "alone_p50_s": statistics.median(one),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`mlxbatch serve` in a child process, timed from spawn to its first 200 on /health."""

    def __init__(self, model: Path, args: tuple[str, ...]):
        self.url = f"http://127.0.0.1:{(port := free_port())}"
        cmd = [
            sys.executable,
            "-m",
            "mlxbatch",
            "serve",
            "--model",
            str(model),
            "--port",
            str(port),
            "--log-level",
            "warning",
            *args,
        ]
        start = time.perf_counter()
        self.proc = subprocess.Popen(cmd)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlxbatch serve exited with {self.proc.returncode}")
            try:
                r = httpx.get(self.url + "/health", timeout=5)
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.startup_seconds = time.perf_counter() - start
        self.startup = r.json()["startup"]

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("mlxbatch_") and "{" not in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self) -> tuple[int, float]:
        start = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120), time.perf_counter() - start


def percentiles(xs: list[float]) -> dict:
    if not xs:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    p = np.percentile(np.array(xs) * 1e3, [50, 95, 99])
    return {"p50_ms": float(p[0]), "p95_ms": float(p[1]), "p99_ms": float(p[2])}


async def _one(client: httpx.AsyncClient, url: str, text: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    try:
        r = await client.post(url + "/v1/classify", json={"input": text})
        status = r.status_code
    except httpx.TransportError:
        status = 0
    return status, time.perf_counter() - t0


async def _open_loop(
    server: ServerProcess, texts: tuple[str, ...], rate: float, seconds: float
) -> dict:
    rng, loop = random.Random(int(rate * 1000)), asyncio.get_running_loop()
    depth, rss = [], []
    before = server.metrics()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)

    async def sample(stop: asyncio.Event) -> None:
        async with httpx.AsyncClient() as c:
            while not stop.is_set():
                text = (await c.get(server.url + "/metrics")).text
                depth.extend(
                    float(x.split()[1])
                    for x in text.splitlines()
                    if x.startswith("mlxbatch_queue_depth ")
                )
                rss.append(server.rss_mb())
                await asyncio.sleep(0.25)

    stop = asyncio.Event()
    sampler = asyncio.create_task(sample(stop))
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        start, due, tasks, i = loop.time(), 0.0, [], 0
        while due < seconds:
            await asyncio.sleep(max(0.0, start + due - loop.time()))
            tasks.append(asyncio.create_task(_one(client, server.url, texts[i % len(texts)])))
            i, due = i + 1, due + rng.expovariate(rate)
        results = await asyncio.gather(*tasks)
        elapsed = loop.time() - start
    stop.set()
    await sampler
    after = server.metrics()
    ok = [s for st, s in results if st == 200]
    batches = after["mlxbatch_batch_size_count"] - before["mlxbatch_batch_size_count"]
    rows = after["mlxbatch_batch_size_sum"] - before["mlxbatch_batch_size_sum"]
    return {
        "offered_items_per_s": rate,
        "sent": len(results),
        "ok": len(ok),
        "rejected_429": sum(st == 429 for st, _ in results),
        "errors": sum(st not in (200, 429) for st, _ in results),
        "items_per_s": len(ok) / elapsed,
        **percentiles(ok),
        "mean_batch": rows / batches if batches else None,
        "max_queue_depth": max(depth, default=0.0),
        "mean_queue_depth": float(np.mean(depth or [0])),
        "rss_mb_start": rss[0] if rss else None,
        "rss_mb_end": rss[-1] if rss else None,
        "rss_mb_max": max(rss, default=None),
    }


def run(options: LoadOptions, progress=lambda m: None) -> dict:
    texts = list(options.texts)
    progress(f"classify --mode sorted on {len(texts)} tickets, then {options.sequential} alone")
    base = baseline(options.model, texts, options.sequential)
    capacity = base["classify_items_per_s"]
    args = (
        "--max-queue",
        str(options.max_queue),
        "--max-inputs-per-request",
        str(min(256, options.max_queue)),
        *options.serve_args,
    )
    server = ServerProcess(options.model, args)
    progress(f"healthy {server.startup_seconds:.1f} s after spawn; one request at a time")
    seq = [asyncio.run(_sequential(server.url, texts[: options.sequential]))][0]
    rows = []
    for load in options.loads:
        progress(
            f"open loop at {load:.2f}x ({load * capacity:.1f} items/s) for {options.seconds:.0f} s"
        )
        row = asyncio.run(_open_loop(server, options.texts, load * capacity, options.seconds))
        rows.append({"load": load, **row})
    soak = None
    if options.soak_seconds:
        progress(f"soak at 0.70x for {options.soak_seconds:.0f} s")
        soak = asyncio.run(_open_loop(server, options.texts, 0.7 * capacity, options.soak_seconds))
    code, drain = server.stop()
    return {
        "model": str(options.model),
        "tickets": len(texts),
        "baseline": base,
        "startup": {"spawn_to_healthy_s": server.startup_seconds, **server.startup},
        "sequential": {"requests": len(seq), **percentiles(seq)},
        "loads": rows,
        "soak": soak,
        "shutdown": {"exit_code": code, "seconds": drain},
        "max_queue": options.max_queue,
        "targets": targets(base, seq, rows, soak, options.max_queue),
    }


async def _sequential(url: str, texts: list[str]) -> list[float]:
    async with httpx.AsyncClient(timeout=120) as client:
        await _one(client, url, texts[0])  # the connection, opened once
        return [s for st, s in [await _one(client, url, t) for t in texts] if st == 200]


def targets(
    base: dict, seq: list[float], rows: list[dict], soak: dict | None, max_queue: int
) -> dict:
    """The service's targets, each a ratio measured in this run, and whether it is met."""
    saturated = [r for r in rows if r["load"] >= 1.0]
    best = max((r["items_per_s"] for r in saturated), default=None)
    over = [r for r in rows if r["load"] >= 2.0]
    out = {}
    if best:
        ratio = best / base["classify_items_per_s"]
        out["saturation_vs_classify"] = {"ratio": ratio, "target": 0.85, "met": ratio >= 0.85}
    if seq:
        ratio = statistics.median(seq) / base["alone_p50_s"]
        out["one_at_a_time_p50_vs_alone"] = {"ratio": ratio, "target": 1.2, "met": ratio <= 1.2}
    if over:
        r = over[-1]
        growth = (r["rss_mb_end"] - r["rss_mb_start"]) / r["rss_mb_start"]
        out["overload_2x"] = {
            "rejected_429": r["rejected_429"],
            "errors": r["errors"],
            "max_queue_depth": r["max_queue_depth"],
            "rss_growth": growth,
            "met": r["rejected_429"] > 0
            and r["errors"] == 0
            and r["max_queue_depth"] <= max_queue
            and growth < 0.05,
        }
    if soak:
        growth = (soak["rss_mb_end"] - soak["rss_mb_start"]) / soak["rss_mb_start"]
        out["soak_70pct"] = {
            "errors": soak["errors"] + soak["rejected_429"],
            "rss_growth": growth,
            "met": soak["errors"] + soak["rejected_429"] == 0 and growth < 0.05,
        }
    return out


def format_report(r: dict) -> str:
    b, s = r["baseline"], r["startup"]
    lines = [
        f"{r['model']}: {r['tickets']} tickets; classify --mode sorted "
        f"{b['classify_items_per_s']:.1f} items/s; one ticket alone p50 "
        f"{b['alone_p50_s'] * 1e3:.1f} ms",
        f"startup: healthy {s['spawn_to_healthy_s']:.2f} s after spawn (load + prefix "
        f"{s['load_seconds']:.2f} s, policy/calibration {s['plan_seconds']:.2f} s)",
        f"one request at a time: p50 {r['sequential']['p50_ms']:.1f} ms, "
        f"p99 {r['sequential']['p99_ms']:.1f} ms",
        "",
        f"{'load':>5} {'offered/s':>9} {'items/s':>8} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'batch':>6} {'queue max':>9} {'429':>5} {'err':>4} {'RSS MB':>11}",
    ]
    for x in r["loads"] + ([{"load": "soak", **r["soak"]}] if r["soak"] else []):
        load = x["load"] if isinstance(x["load"], str) else f"{x['load']:.2f}"
        lines.append(
            f"{load:>5} {x['offered_items_per_s']:>9.1f} {x['items_per_s']:>8.1f} "
            f"{_ms(x['p50_ms'])} {_ms(x['p95_ms'])} {_ms(x['p99_ms'])} "
            f"{x['mean_batch'] or 0:>6.1f} {x['max_queue_depth']:>9.0f} {x['rejected_429']:>5} "
            f"{x['errors']:>4} {x['rss_mb_start']:>5.0f}->{x['rss_mb_end']:<5.0f}"
        )
    lines.append("")
    for name, t in r["targets"].items():
        shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in t.items()}
        lines.append(f"{name}: {shown}")
    lines.append(
        f"SIGTERM: exit {r['shutdown']['exit_code']} in {r['shutdown']['seconds']:.2f} s"
        " (the load generator ran on the same cores as the server)"
    )
    return "\n".join(lines)


def _ms(x: float | None) -> str:
    return f"{x:>8.1f}" if x is not None else f"{'-':>8}"


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = r["loads"]
    offered = [x["offered_items_per_s"] for x in rows]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        ax.plot(offered, [x[key] for x in rows], marker="o", label=key[:3])
    ax.axhline(r["sequential"]["p50_ms"], ls=":", c="gray", label="p50, one at a time")
    ax.set(
        xlabel="offered items/s",
        ylabel="latency (ms)",
        yscale="log",
        title="latency against offered load",
    )
    ax.legend()
    ax2.plot(offered, [x["items_per_s"] for x in rows], marker="o", label="served (200)")
    ax2.axhline(
        r["baseline"]["classify_items_per_s"], ls="--", c="k", label="classify --mode sorted"
    )
    ax2.set(xlabel="offered items/s", ylabel="items/s", title="throughput")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
