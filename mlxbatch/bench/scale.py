"""`bench --scale`: classify jobs of growing length, each a child process measured by the
OS, and a projection from the measurements (one run: scale_runs.py)."""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..io.outputs import write_json_report
from ..io.streams import report_stream
from .scale_runs import (
    TOKENIZER_SAMPLE,
    WINDOW_ROWS,
    plan_padding,
    repeats_agree,
    run_job,
    tokenizer_rate,
    write_workload,
)

DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (2_000, 6_000)
PROJECT_TO = 10_000_000


@dataclass(frozen=True)
class ScaleRequest:
    sizes: tuple[int, ...] = DEFAULT_SIZES  # tickets for the tiny model
    large: int = 6_000  # tickets for the 0.5B-shaped model; 0 skips it
    large_preset: str = "qwen2.5-0.5b"  # init-random's preset for it ("tiny" in the tests)
    compare: int = 1_200  # tickets of the 0.5B's repeats / no-repeats pair (0: none)
    duplicates: float = 0.2  # share of rows that repeat an earlier row's text exactly
    seed: int = 0
    json_path: Path | None = None
    plot_path: Path | None = None


def _row(run: dict, n: int, repeats: int, tok: dict, progress, **extra) -> dict:
    share = (n / tok["items_per_s"]) / run["job_seconds"] if run["job_seconds"] else 0.0
    progress(
        f"scale: {n} tickets: {run['items_per_s']:.1f} items/s, max RSS "
        f"{run['max_rss_mb']:.0f} MB, padding {run['padding']:.2%}, "
        f"{run['duplicates_scored_once']} scored once, {run['wall_seconds']:.0f} s"
    )
    return {
        "tickets": n,
        "duplicates_in_file": repeats / n,
        "tokenizer_share": share,
        **run,
        **extra,
    }


def run_scale(request: ScaleRequest, progress=print) -> dict:
    """Every run of the request, then the targets and the projection (see `assess`)."""
    from ..model.convert import init_random

    result: dict = {
        "request": {
            "sizes": list(request.sizes),
            "large": request.large,
            "compare": request.compare,
            "duplicates": request.duplicates,
            "seed": request.seed,
        },
        "host": {"cpus": os.cpu_count(), "load_before": os.getloadavg()},
        "tiny": [],
        "large": [],
        "plans": [],
    }
    with tempfile.TemporaryDirectory(prefix="mlxbatch-scale-") as tmp:
        tmp = Path(tmp)
        init_random(tmp / "tiny", preset="tiny", seed=request.seed)
        out = tmp / "out.jsonl"
        sample = tmp / "sample.jsonl.gz"
        write_workload(sample, TOKENIZER_SAMPLE, request.duplicates, request.seed)
        tok = result["tokenizer"] = tokenizer_rate(tmp / "tiny", sample)
        for n in request.sizes:
            src = tmp / f"tickets-{n}.jsonl.gz"
            repeats = write_workload(src, n, request.duplicates, request.seed)
            progress(f"scale: tiny model, {n} tickets ({repeats} repeats) ...")
            result["tiny"].append(_row(run_job(tmp / "tiny", src, out), n, repeats, tok, progress))
            src.unlink()
        if request.large:
            result["large"], result["plans"] = _large_runs(tmp, request, tok, progress)
    result["host"]["load_after"] = os.getloadavg()
    result.update(assess(result))
    return result


def _large_runs(tmp: Path, request: ScaleRequest, tok: dict, progress) -> tuple[list, list]:
    """The 0.5B-shaped model: `large` tickets in 4 windows (the streamed job, measured whole);
    the padding of that file's plans with 1 window (the global plan), 4, and the default
    window (planned only: no scoring, and checked against the run's own padding); and a pair
    of `compare`-ticket files, with and without repeats, each one window, for the time saved."""
    from ..model.convert import init_random

    n, model, out = request.large, tmp / "large", tmp / "out.jsonl"
    init_random(model, preset=request.large_preset, seed=request.seed)
    src = tmp / "large.jsonl.gz"
    repeats = write_workload(src, n, request.duplicates, request.seed)
    quarter = math.ceil(n / 4)
    progress(f"scale: 0.5B-shaped model, {n} tickets in windows of {quarter} ...")
    run = run_job(model, src, out, "--window-rows", str(quarter))
    runs = [
        _row(run, n, repeats, tok, progress, name="windows", repeats_agree=repeats_agree(src, out))
    ]
    plans = plan_padding(
        model, src, {"global": max(n, 1), "windows": quarter, "default": WINDOW_ROWS}
    )
    progress(
        "scale: planned padding: " + ", ".join(f"{p['name']} {p['padding']:.2%}" for p in plans)
    )
    m = min(request.compare, n)
    if m:
        pair = (
            ("repeats", tmp / "pair.jsonl.gz", request.duplicates),
            ("no repeats", tmp / "pair-unique.jsonl.gz", 0.0),
        )
        for name, path, share in pair:
            reps = write_workload(path, m, share, request.seed)
            progress(f"scale: 0.5B-shaped model, {m} tickets, {name}, one window ...")
            run = run_job(model, path, out, "--window-rows", str(max(m, WINDOW_ROWS)))
            agree = repeats_agree(path, out) if share else None
            runs.append(_row(run, m, reps, tok, progress, name=name, repeats_agree=agree))
    return runs, plans


def model_rate(x: dict) -> float:
    """Items the model itself scored a second (repeats caught in a window excluded): the
    engine's pace, apart from how many repeats a run's windows happened to catch."""
    return (
        (x["scored"] - x["duplicates_scored_once"]) / x["job_seconds"] if x["job_seconds"] else 0.0
    )


def assess(r: dict) -> dict:
    """The issue's targets, each met or not from the runs, and the 10M projection: time from the
    per-window seconds of the largest run, RSS from the slope between the two largest runs."""
    tiny, large = r["tiny"], {x["name"]: x for x in r["large"]}
    targets = _tiny_targets(tiny) + _padding_targets(r.get("plans", []), large)
    targets += _repeat_targets(large)
    return {"targets": targets, "projection": _project(tiny)}


def _tiny_targets(tiny: list[dict]) -> list[dict]:
    """Memory, speed and reading a .gz: the smallest tiny-model run against the largest."""
    if len(tiny) < 2:
        return []
    a, b = tiny[0], tiny[-1]
    grow = b["max_rss_mb"] - a["max_rss_mb"]
    ratio = b["items_per_s"] / a["items_per_s"]
    return [
        {
            "target": f"max RSS at {b['tickets']} within 10% (or 100 MB) of {a['tickets']}",
            "measured": f"{a['max_rss_mb']:.0f} -> {b['max_rss_mb']:.0f} MB ({grow:+.0f} MB)",
            "met": grow <= max(0.1 * a["max_rss_mb"], 100),
        },
        {
            "target": f"items/s at {b['tickets']} within 10% of {a['tickets']}",
            "measured": f"{a['items_per_s']:.1f} -> {b['items_per_s']:.1f} ({ratio - 1:+.1%}); "
            f"repeats caught {a['duplicates_scored_once'] / a['tickets']:.1%} -> "
            f"{b['duplicates_scored_once'] / b['tickets']:.1%}; items the model scored "
            f"{model_rate(a):.1f} -> {model_rate(b):.1f}/s ({model_rate(b) / model_rate(a) - 1:+.1%})",
            "met": ratio >= 0.9,
        },
        {
            "target": f".jsonl.gz of {b['tickets']} classified without unpacking",
            "measured": f"{b['scored']} scored from the .gz",
            "met": b["scored"] == b["tickets"],
        },
    ]


def _padding_targets(plans: list[dict], large: dict) -> list[dict]:
    """The windows' planned padding against one global plan's, and the run's own."""
    plans = {p["name"]: p for p in plans}
    if not {"global", "windows"} <= set(plans):
        return []
    g, w = plans["global"], plans["windows"]
    gap = w["padding"] - g["padding"]
    run = large.get("windows")
    same = run is not None and abs(run["padding"] - w["padding"]) < 0.0005
    return [
        {
            "target": f"0.5B padding, {w['windows']} windows within 0.5 pp of one global plan",
            "measured": f"{w['padding']:.2%} vs {g['padding']:.2%} ({gap * 100:+.2f} pp; "
            f"the run's own {run['padding']:.2%})"
            if run
            else f"{w['padding']:.2%} vs {g['padding']:.2%}",
            "met": abs(gap) <= 0.005 and same,
        }
    ]


def _repeat_targets(large: dict) -> list[dict]:
    """Repeats scored once: faster than a run without them, with the same answers."""
    if not {"repeats", "no repeats"} <= set(large):
        return []
    g, u = large["repeats"], large["no repeats"]
    # CPU seconds (whole child) decide: wall time on a shared host swings with its load
    speed = u["cpu_seconds"] / g["cpu_seconds"]
    agree = bool(g["repeats_agree"] and large.get("windows", g)["repeats_agree"])
    return [
        {
            "target": "0.5B, 20% repeats: >= 1.2x faster than no repeats, repeats agree",
            "measured": f"CPU {u['cpu_seconds']:.0f} s / {g['cpu_seconds']:.0f} s = {speed:.2f}x "
            f"(job wall {u['job_seconds'] / g['job_seconds']:.2f}x) at {g['tickets']} tickets; "
            f"{g['duplicates_scored_once']} scored once; repeats agree {agree}",
            "met": speed >= 1.2 and agree,
        }
    ]


def _project(tiny: list[dict]) -> dict | None:
    if not tiny:
        return None
    b = tiny[-1]
    windows = math.ceil(b["tickets"] / WINDOW_ROWS)
    per_window = b["job_seconds"] / windows
    startup = b["wall_seconds"] - b["job_seconds"]
    slope = 0.0
    if len(tiny) >= 2:
        a = tiny[-2]
        slope = (b["max_rss_mb"] - a["max_rss_mb"]) / (b["tickets"] - a["tickets"])
    rows_per_window = b["tickets"] / windows
    return {
        "tickets": PROJECT_TO,
        "from_tickets": b["tickets"],
        "windows_measured": windows,
        "seconds_per_window": per_window,
        "rows_per_window": rows_per_window,
        "seconds": startup + per_window * PROJECT_TO / rows_per_window,
        "max_rss_mb": b["max_rss_mb"] + slope * (PROJECT_TO - b["tickets"]),
        "rss_slope_kb_per_ticket": slope * 1024,
    }


def format_scale(r: dict) -> str:
    h = r["host"]
    lines = [
        f"mlxbatch bench --scale: {h['cpus']} CPUs, load average {h['load_before'][0]:.1f} "
        f"before, {h['load_after'][0]:.1f} after; {r['request']['duplicates']:.0%} repeats"
    ]
    head = (
        f"{'model':<6} {'run':<11} {'tickets':>9} {'items/s':>8} {'scored/s':>8} {'max RSS MB':>10} {'MLX MB':>7} "
        f"{'padding':>8} {'dup file':>8} {'dup once':>8} {'tok share':>9} {'job s':>8} {'wall s':>8}"
    )
    lines += [head, "-" * len(head)]
    for model, runs in (("tiny", r["tiny"]), ("0.5B", r["large"])):
        for x in runs:
            lines.append(
                f"{model:<6} {x.get('name', 'default'):<11} {x['tickets']:>9} {x['items_per_s']:>8.1f} "
                f"{model_rate(x):>8.1f} "
                f"{x['max_rss_mb']:>10.0f} {x['mlx_peak_mb'] if x.get('mlx_peak_mb') is not None else float('nan'):>7.0f} "
                f"{x['padding']:>8.2%} {x['duplicates_in_file']:>8.1%} "
                f"{x['duplicates_scored_once'] / x['tickets']:>8.1%} {x['tokenizer_share']:>9.1%} "
                f"{x['job_seconds']:>8.1f} {x['wall_seconds']:>8.1f}"
            )
    for p in r.get("plans", []):
        lines.append(
            f"0.5B plan, {p['name']} ({p['windows']} window(s) of <= {p['window_rows']} rows): "
            f"padding {p['padding']:.2%} ({p['padded_tokens']:,} padded / {p['useful_tokens']:,} fed tokens)"
        )
    if t := r.get("tokenizer"):
        lines.append(
            f"tokenizer (Engine.prompts, this process, {t['items']} tickets): "
            f"{t['tokens_per_s']:,.0f} tokens/s, {t['items_per_s']:,.0f} tickets/s"
        )
    if p := r["projection"]:
        lines.append(
            f"projection to {p['tickets']:,}: {p['seconds'] / 3600:.1f} h "
            f"({p['seconds_per_window']:.1f} s a window of {p['rows_per_window']:.0f} rows "
            f"at {p['from_tickets']:,}), max RSS {p['max_rss_mb']:.0f} MB "
            f"({p['rss_slope_kb_per_ticket']:+.3f} KB a ticket between the two largest runs)"
        )
    for t in r["targets"]:
        lines.append(f"[{'met' if t['met'] else 'NOT met'}] {t['target']}: {t['measured']}")
    return "\n".join(lines)


def plot_scale(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [x["tickets"] for x in r["tiny"]]
    fig, (ax, over) = plt.subplots(1, 2, figsize=(12, 4))
    for x in r["tiny"]:  # resident size over each run: flat, or creeping window by window
        if x.get("rss_trace"):
            t, mb = zip(*x["rss_trace"])
            over.plot(t, mb, label=f"{x['tickets']:,} tickets")
    over.set(
        xscale="log",
        xlabel="seconds into the run",
        ylabel="RSS MB",
        ylim=(0, None),
        title="resident size during each run (tiny model)",
    )
    over.legend()
    ax.plot(n, [x["max_rss_mb"] for x in r["tiny"]], "o-", color="tab:blue")
    ax.set(xscale="log", xlabel="tickets (tiny model)", ylabel="max RSS MB", ylim=(0, None))
    rate = ax.twinx()
    rate.plot(n, [x["items_per_s"] for x in r["tiny"]], "s--", color="tab:orange")
    rate.set(ylabel="items/s", ylim=(0, None))
    ax.set_title("classify: max RSS (blue) and items/s (orange) against tickets")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scale_command(request: ScaleRequest, echo) -> int:
    """`bench --scale`: run, print the table, write the JSON and the plot; 0 if every run ran."""
    r = run_scale(request, echo)
    print(format_scale(r), file=report_stream(request.json_path))
    if request.json_path:
        write_json_report(request.json_path, r)  # whole, or straight into a stream (--json -)
    if request.plot_path and r["tiny"]:
        plot_scale(r, request.plot_path)
    return 0
