"""CLI commands that run workloads: `tickets`, `doctor`, `bench`, `demo`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .batching import DEFAULT_MAX_BATCH


def fail(message: str, code: int = 2) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


model_option = click.option(
    "--model", type=click.Path(path_type=Path), help="Model directory (default: see README)."
)
max_batch_option = click.option(
    "--max-batch",
    type=click.IntRange(1),
    default=DEFAULT_MAX_BATCH,
    show_default=True,
    help="Most rows per batch.",
)


def resolve_model(model: Path | None) -> Path:
    from .defaults import default_model_dir

    return model or default_model_dir(announce=lambda m: click.echo(m, err=True))


@click.command()
@click.argument("n", type=click.IntRange(1), default=600)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--mix",
    type=click.Choice(["default", "short", "long", "heavy-tail"]),
    default="default",
    show_default=True,
)
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="JSONL file (default: stdout)."
)
def tickets(n, seed, mix, output):
    """Generate N synthetic support tickets (JSONL: id, text, intent)."""
    from .tickets import generate, write_jsonl

    write_jsonl(generate(n, seed, mix), output)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--size", type=int, default=1024, show_default=True, help="Square matmul size to time."
)
def doctor(as_json, size):
    """Device, dtype, the BLAS behind MLX's CPU matmuls, and its measured GFLOP/s."""
    from .doctor import report

    info = report(size)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            click.echo(f"{k:>16}: {v}")


def load_tickets(spec: str) -> tuple[list[str], str]:
    """A JSONL/CSV/text file, or a count of built-in synthetic tickets."""
    from .inputs import describe_errors, read_rows
    from .tickets import generate

    if spec.isdigit():
        return [t["text"] for t in generate(int(spec))], f"{spec} synthetic tickets (seed 0)"
    rows, fmt = read_rows(spec)
    if any(r.error for r in rows):
        fail(describe_errors(rows, spec, fmt))
    return [r.text for r in rows], spec


@click.command()
@model_option
@click.option(
    "--tickets",
    "tickets_spec",
    default="600",
    show_default=True,
    help="A ticket file, or a number of synthetic tickets.",
)
@click.option(
    "--batch-tokens",
    type=click.IntRange(1),
    help="Budget of the default sorted run (default: as classify).",
)
@max_batch_option
@click.option(
    "--naive-batch",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="Rows per naive batch.",
)
@click.option(
    "--sweep",
    default="512,1024,2048,4096",
    show_default=True,
    help="Budgets to sweep (comma-separated; empty for none).",
)
@click.option(
    "--peers/--no-peers",
    default=True,
    show_default=True,
    help="Also time mlx-lm and transformers (if installed).",
)
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path), help="Write every figure as JSON."
)
@click.option(
    "--plot", "plot_path", type=click.Path(path_type=Path), help="Write a PNG (needs matplotlib)."
)
@click.option(
    "--quick", is_flag=True, help="Tiny synthetic model, 60 tickets: checks the command in seconds."
)
def bench(model, tickets_spec, batch_tokens, max_batch, naive_batch, sweep, peers, json_path, plot_path, quick):  # fmt: skip
    """Time the gold loop, prefix caching, naive and sorted batching (and peers) in one run."""
    import tempfile

    from .bench import run_bench
    from .convert import init_random

    tmp = tempfile.TemporaryDirectory()
    if quick:
        model = Path(tmp.name) / "tiny"
        init_random(model, preset="tiny", seed=0, dtype="float32")
        tickets_spec = "60" if tickets_spec == "600" else tickets_spec
    texts, source = load_tickets(tickets_spec)
    from .classifier import Classifier
    from .doctor import report as doctor_report
    from .report import format_report, plot

    clf = Classifier.load(resolve_model(model))
    budgets = [int(x) for x in sweep.split(",") if x.strip()]
    prompts = [clf.engine.prompt(t) for t in texts]
    longest = max(clf.fed_lengths(prompts))
    budget = batch_tokens or clf.default_batch_tokens(max_batch, longest)
    info = doctor_report(2048 if not quick else 512)
    result = run_bench(clf, texts, budget, max_batch, naive_batch, budgets,
                       progress=lambda m: click.echo(m, err=True))  # fmt: skip
    result["meta"] = {
        "model": clf.lm.describe(), "tickets": source, "device": info["device"],
        "device_name": info["device_name"], "dtype": info["dtype"], "blas": info["blas_kernels"] or info["blas"],
        "peak_matmul_gflops": info[f"matmul_gflops_{info['dtype']}"], "doctor": info,
    }  # fmt: skip
    if peers:
        result["peers"] = run_peers(clf, prompts, result, budget, max_batch, naive_batch)
    click.echo(format_report(result))
    if json_path:
        json_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    if plot_path:
        plot(result, plot_path, [len(clf.lm.tokenizer.encode(t)) for t in texts])
    tmp.cleanup()
    if any(m["agreement"] < 1.0 for m in result["modes"]):
        fail("a batched mode disagrees with the gold loop", 1)


def run_peers(clf, prompts, result, budget, max_batch, naive_batch) -> list[dict]:
    from .peers import mlx_lm_peer, transformers_peer

    if clf.labels.max_len > 1:
        return [{"name": "peers", "error": "peers score single-token labels only"}]
    names = list(clf.labels.names)
    gold = [names.index(x) for x in result["gold_labels"]]
    ids = clf.labels.first_ids
    out = []
    for name, run in (
        ("mlx-lm", lambda: mlx_lm_peer(clf.lm.path, prompts, ids, gold, naive_batch)),
        ("transformers", lambda: transformers_peer(clf.lm.path, prompts, ids, gold, budget, max_batch)),
    ):  # fmt: skip
        click.echo(f"running peer {name} ...", err=True)
        try:
            out.append(run())
        except ImportError as e:
            out.append({"name": name, "error": f"not installed ({e.name})"})
    return out


@click.command()
@click.option(
    "--tickets",
    "n",
    type=click.IntRange(1),
    default=120,
    show_default=True,
    help="Synthetic tickets to classify.",
)
@model_option
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("runs/demo"),
    show_default=True,
)
def demo(n, model, out_dir):
    """The main job on the built-in default: synthetic tickets, sorted batching, verified."""
    from collections import Counter

    from .classifier import Classifier
    from .inputs import read_rows
    from .job import JobSettings, run_job
    from .tickets import generate, write_jsonl

    src, out = out_dir / "tickets.jsonl", out_dir / "predictions.jsonl"
    tickets = generate(n)
    write_jsonl(tickets, src)
    clf = Classifier.load(resolve_model(model))
    click.echo(f"classifying {n} synthetic tickets from {src} ...", err=True)
    rows, fmt = read_rows(str(src))
    res = run_job(
        clf, rows, JobSettings(), out, resume=False, verify=True, source=str(src), fmt=fmt
    )
    preds = [json.loads(x) for x in out.read_text().splitlines()]
    v = res.verify
    click.echo(f"model: {clf.lm.describe()}")
    click.echo(f"wrote {out}: {res.summary()}")
    click.echo(f"gold sequential loop: {v['items'] / v['seconds']:.2f} items/s; sorted batching is "
               f"{v['seconds'] / res.seconds:.2f}x faster, {v['agreement']:.1%} label agreement "
               f"(max |score diff| {v['max_abs_score_diff']:.1e})")  # fmt: skip
    counts = Counter(p["label"] for p in preds)
    click.echo("labels: " + ", ".join(f"{k} {counts[k]}" for k in clf.labels.names))
    acc = sum(p["label"] == t["intent"] for p, t in zip(preds, tickets)) / n
    note = " (synthetic weights: chance level is expected)" if clf.lm.synthetic else ""
    click.echo(f"accuracy against the generator's intents: {acc:.1%}{note}")
    if not v["passed"]:
        sys.exit(1)
