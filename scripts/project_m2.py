#!/usr/bin/env python
"""Roofline projection of a `mlxbatch bench --json` run onto an Apple M2 (a projection, not a
measurement): per mode, time >= max(FLOPs / peak compute, weight bytes read / bandwidth).

    python scripts/project_m2.py bench/full-600.json [--mfu 0.35]

FLOPs per mode are the run's counted useful FLOPs scaled by processed / useful tokens; every
batch forward reads the non-embedding weights once in fp16. M2 figures are Apple's published
ones: 10-core GPU 3.6 TFLOPS (fp16 runs at the fp32 rate on M2), 100 GB/s unified memory.
"""

from __future__ import annotations

import argparse
import json

M2_FLOPS = 3.6e12
M2_BANDWIDTH = 100e9
QWEN25_05B_NON_EMBEDDING = 494_032_768 - 151_936 * 896


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json")
    ap.add_argument("--mfu", type=float, default=0.35, help="assumed achievable share of peak")
    args = ap.parse_args()
    r = json.loads(open(args.bench_json).read())
    weight_bytes = 2 * QWEN25_05B_NON_EMBEDDING
    print(f"| mode | TFLOP | forwards | roofline s | at {args.mfu:.0%} of peak, s | items/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for m in r["modes"]:
        flops = m["useful_flops"] * m["processed_tokens"] / m["useful_tokens"]
        forwards = m["batches"]
        roof = max(flops / M2_FLOPS, forwards * weight_bytes / M2_BANDWIDTH)
        real = max(flops / (M2_FLOPS * args.mfu), forwards * weight_bytes / M2_BANDWIDTH)
        print(
            f"| {m['name']} | {flops / 1e12:.1f} | {forwards} | {roof:.1f} | {real:.1f} | "
            f"{m['items'] / real:.1f} |"
        )


if __name__ == "__main__":
    main()
