"""Formatting of benchmark results: the text table and the optional plot."""

from __future__ import annotations

from pathlib import Path

from ..engine.planner import CostModel


def _gold(r: dict) -> dict | None:
    return next((x for x in r["modes"] if x["name"] == "sequential (gold)"), None)


def _sorted(r: dict) -> dict | None:
    return next((x for x in r["modes"] if x["name"] == "sorted (default)"), None)


def format_report(r: dict) -> str:
    lines = _header_lines(r) + _mode_lines(r) + _efficiency_lines(r)
    lines += _peer_lines(r) + _against_lines(r)
    lines += [
        "",
        "speedup: over the gold loop, same run; pred s: the planner's cost model for "
        "those batches; MFU: useful model FLOPs per second over the peak matmul rate above; "
        "agree/max|dp|: against the gold loop's labels and probabilities.",
    ]
    return "\n".join(lines)


def _header_lines(r: dict) -> list[str]:
    """The workload, the machine, the cost model, the token lengths and the padding tax."""
    m, tax = r["meta"], r["padding_tax"]
    cm = r["cost_model"]
    return [
        f"mlxbatch bench: {r['items']} tickets ({m['tickets']}); prompt {m.get('prompt', 'default')}"
        f" ({r.get('prefix_tokens', '?')} shared prefix tokens); model {m['model']}",
        f"device {m['device']} ({m['device_name']}), dtype {m['dtype']}, BLAS {m['blas']}",
        f"peak matmul rate measured in this run: {m['peak_matmul_gflops']:.1f} GFLOP/s ({m['dtype']})",
        f"planner cost model ({cm['source']}): {CostModel.from_dict(cm).constants()}, "
        f"{cm['lanes']} lane(s) at once",
        "",
        "ticket tokens: median {median:.0f}, p90 {p90:.0f}, max {max}".format(**r["ticket_tokens"]),
        "fed tokens per item (prompt minus the shared prefix): median {median:.0f}, p90 {p90:.0f}, "
        "max {max}".format(**r["fed_tokens"]),
        f"padding tax (processed / useful item tokens): pad to global max {tax['global_max_factor']:.2f}x, "
        f"naive {tax['naive_factor']:.2f}x, greedy {tax['greedy_factor']:.2f}x, "
        f"cost planner {tax['sorted_factor']:.2f}x",
        "",
    ]


def _mode_lines(r: dict) -> list[str]:
    """One row a mode: time, rate, speedup over the gold loop, padding, agreement, MFU."""
    peak = r["meta"]["peak_matmul_gflops"]
    head = (
        f"{'mode':<28} {'time s':>8} {'pred s':>7} {'items/s':>8} {'speedup':>8} {'padding':>8} "
        f"{'processed':>10} {'useful':>8} {'agree':>7} {'max|dp|':>9} {'peak GiB':>9} {'MFU':>6}"
    )
    lines = [head, "-" * len(head)]
    gold = _gold(r)
    for x in r["modes"]:
        mfu = x["useful_flops"] / x["seconds"] / (peak * 1e9)
        pred = f"{x['predicted_seconds']:>7.1f}" if x.get("predicted_seconds") else f"{'':>7}"
        speed = f"{gold['seconds'] / x['seconds']:>7.2f}x" if gold else f"{'':>8}"
        lines.append(
            f"{x['name']:<28} {x['seconds']:>8.1f} {pred} {x['items_per_s']:>8.2f} {speed} "
            f"{x['padding_overhead']:>8.1%} {x['processed_tokens']:>10} {x['useful_tokens']:>8} "
            f"{_pct(x['agreement']):>7} {_sci(x['max_abs_diff']):>9} {x['peak_memory'] / 2**30:>9.2f} "
            f"{mfu:>6.1%}"
        )
    return lines


def _efficiency_lines(r: dict) -> list[str]:
    gold, best = _gold(r), _sorted(r)
    if not (gold and best):
        return []
    gold_rate = gold["processed_tokens"] / gold["seconds"]
    useful_rate = best["useful_tokens"] / best["seconds"]
    return [
        "",
        f"batching efficiency (sorted useful tok/s over gold tok/s): "
        f"{useful_rate:.0f} / {gold_rate:.0f} = {useful_rate / gold_rate:.2f}",
    ]


def _peer_lines(r: dict) -> list[str]:
    if not r.get("peers"):
        return []
    best = _sorted(r)
    lines = ["", f"{'peer':<46} {'time s':>8} {'items/s':>8} {'agree':>7} {'sorted is':>10}"]
    for p in r["peers"]:
        if "error" in p:
            lines.append(f"{p['name']:<46} {'' if 'crashed' in p else 'skipped: '}{p['error']}")
            continue
        ratio = f"{p['seconds'] / best['seconds']:>9.2f}x" if best else f"{'n/a':>10}"
        lines.append(
            f"{p['name']:<46} {p['seconds']:>8.1f} {p['items_per_s']:>8.2f} "
            f"{p['agreement']:>7.1%} {ratio}"
        )
    return lines


def _against_lines(r: dict) -> list[str]:
    a = r.get("against")
    if not a:
        return []
    return [
        "",
        f"against {a['reference']}: label agreement {a['label_agreement']:.1%}, "
        f"max |prob diff| {a['max_abs_prob_diff']:.2e} over {a['items']} items",
        f"  this model: {a['items_per_s']:.2f} items/s, peak {a['peak_memory'] / 2**30:.2f} GiB; "
        f"reference: {a['reference_items_per_s']:.2f} items/s, peak "
        f"{a['reference_peak_memory'] / 2**30:.2f} GiB",
    ]


def plot(r: dict, path: Path, lengths: list[int]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ..errors import UsageError

        raise UsageError("--plot needs matplotlib: pip install 'mlxbatch[plot]'") from None
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ax[0].hist(lengths, bins=40)
    ax[0].set(title="ticket length", xlabel="tokens", ylabel="tickets")
    names = [x["name"] for x in r["modes"]]
    ax[1].barh(names, [x["items_per_s"] for x in r["modes"]])
    ax[1].set(title="throughput", xlabel="items/s")
    sweep = r["padding_tax"]["sweep"]
    if sweep:
        ax[2].plot(
            list(map(int, sweep)), [100 * v for v in sweep.values()], marker="o", label="greedy"
        )
        ax[2].axhline(
            100 * (1 - 1 / r["padding_tax"]["sorted_factor"]), color="C1", label="cost planner"
        )
        ax[2].legend()
    ax[2].set(title="padding vs budget", xlabel="--batch-tokens", ylabel="padding %", xscale="log")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _sci(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1e}"
