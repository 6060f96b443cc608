"""Formatting of benchmark results: the text table and the optional plot."""

from __future__ import annotations

from pathlib import Path


def format_report(r: dict) -> str:
    m, tax = r["meta"], r["padding_tax"]
    peak = m["peak_matmul_gflops"]
    lines = [
        f"mlxbatch bench: {r['items']} tickets; model {m['model']}",
        f"device {m['device']} ({m['device_name']}), dtype {m['dtype']}, BLAS {m['blas']}",
        f"peak matmul rate measured in this run: {peak:.1f} GFLOP/s ({m['dtype']})",
        "",
        "ticket tokens: median {median:.0f}, p90 {p90:.0f}, max {max}".format(**r["ticket_tokens"]),
        "fed tokens per item (prompt minus the shared prefix): median {median:.0f}, p90 {p90:.0f}, "
        "max {max}".format(**r["fed_tokens"]),
        f"padding tax (processed / useful item tokens): pad to global max {tax['global_max_factor']:.2f}x, "
        f"naive {tax['naive_factor']:.2f}x, sorted {tax['sorted_factor']:.2f}x",
        "",
    ]
    head = (f"{'mode':<30} {'time s':>8} {'items/s':>8} {'speedup':>8} {'padding':>8} "
            f"{'processed':>10} {'useful':>8} {'agree':>7} {'max|dp|':>9} {'peak GiB':>9} {'MFU':>6}")  # fmt: skip
    lines += [head, "-" * len(head)]
    gold = r["modes"][0]["seconds"]
    for x in r["modes"]:
        mfu = x["useful_flops"] / x["seconds"] / (peak * 1e9)
        lines.append(
            f"{x['name']:<30} {x['seconds']:>8.1f} {x['items_per_s']:>8.2f} "
            f"{gold / x['seconds']:>7.2f}x {x['padding_overhead']:>8.1%} {x['processed_tokens']:>10} "
            f"{x['useful_tokens']:>8} {x['agreement']:>7.1%} {x['max_abs_diff']:>9.1e} "
            f"{x['peak_memory'] / 2**30:>9.2f} {mfu:>6.1%}"
        )
    best = next(x for x in r["modes"] if x["name"] == "sorted (default)")
    if r.get("peers"):
        lines += ["", f"{'peer':<46} {'time s':>8} {'items/s':>8} {'agree':>7} {'sorted is':>10}"]
        for p in r["peers"]:
            if "error" in p:
                lines.append(f"{p['name']:<46} skipped: {p['error']}")
                continue
            lines.append(f"{p['name']:<46} {p['seconds']:>8.1f} {p['items_per_s']:>8.2f} "
                         f"{p['agreement']:>7.1%} {p['seconds'] / best['seconds']:>9.2f}x")  # fmt: skip
    lines += ["", "speedup: over the gold loop, same run; MFU: useful model FLOPs per second over "
              "the peak matmul rate above; agree/max|dp|: against the gold loop's labels and "
              "probabilities."]  # fmt: skip
    return "\n".join(lines)


def plot(r: dict, path: Path, lengths: list[int]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'mlxbatch[plot]'") from None
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ax[0].hist(lengths, bins=40)
    ax[0].set(title="ticket length", xlabel="tokens", ylabel="tickets")
    names = [x["name"] for x in r["modes"]]
    ax[1].barh(names, [x["items_per_s"] for x in r["modes"]])
    ax[1].set(title="throughput", xlabel="items/s")
    sweep = r["padding_tax"]["sweep"]
    ax[2].plot(list(map(int, sweep)), [100 * v for v in sweep.values()], marker="o")
    ax[2].set(title="padding vs budget", xlabel="--batch-tokens", ylabel="padding %", xscale="log")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
