"""Why the host-kernel forward evaluates every layer's output: lanes running at once.

    python scripts/lane_concurrency.py [MODEL] [--rows 8] [--width 128]

Times one batch alone on one lane, then one batch on every lane at once (as a job runs them),
with the forward evaluating each layer's output or letting its graph run into the next
layer's (decoder.EVAL_EACH_LAYER), each in a fresh process, with lane threads pinned to cores
(MLXBATCH_PIN_LANES=1: sched_setaffinity in each lane thread, which its MLX stream thread
inherits) or left to the OS scheduler as the engine leaves them. A lane that kept its speed
with the others running takes as long as alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def measure(model: str, rows: int, width: int, each_layer: bool) -> dict:
    import random
    import time

    from mlxbatch.runtime import blas

    blas.activate_in_process()
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.model import decoder

    decoder.EVAL_EACH_LAYER = each_layer
    if os.environ.get("MLXBATCH_PIN_LANES") == "1":
        import itertools
        import threading

        from mlxbatch.runtime import executor

        cores, lock = itertools.cycle(executor.usable_cores()), threading.Lock()
        plain = executor.CpuLanes._score

        def pinned(self, score_rows, prompts):
            if getattr(self._local, "stream", None) is None:
                with lock:
                    os.sched_setaffinity(0, {next(cores)})
            return plain(self, score_rows, prompts)

        executor.CpuLanes._score = pinned
    clf = Classifier.load(model)
    rng = random.Random(0)
    batch = [
        clf.engine.prefix + [rng.randint(1000, 30000) for _ in range(width)] for _ in range(rows)
    ]
    lanes = clf.engine.lanes
    clf.engine.score_batches([batch] * lanes)  # warm: buffers, streams, threads
    out = {}
    for name, k in (("alone", 1), ("all lanes", lanes)):
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            clf.engine.score_batches([batch] * k)
            best = min(best, time.perf_counter() - t)
        out[name] = best
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="weights/qwen2.5-0.5b-synthetic")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--child", choices=["0", "1"])  # internal: one configuration
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(measure(a.model, a.rows, a.width, a.child == "1")))
        return
    print(f"one batch of {a.rows} x {a.width} tokens per lane; best of 3, seconds")
    print(
        f"{'lanes pinned':>13s} {'eval each layer':>16s} {'alone':>7s} {'all lanes':>10s} {'slowdown':>9s}"
    )
    for pin in ("1", "0"):
        for each in ("1", "0"):
            env = dict(os.environ, MLXBATCH_PIN_LANES=pin)
            cmd = [
                sys.executable,
                __file__,
                a.model,
                "--rows",
                str(a.rows),
                "--width",
                str(a.width),
                "--child",
                each,
            ]
            r = json.loads(
                subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                .stdout.strip()
                .splitlines()[-1]
            )
            print(
                f"{'yes' if pin == '1' else 'no':>13s} {'yes' if each == '1' else 'no':>16s} "
                f"{r['alone']:7.2f} {r['all lanes']:10.2f} "
                f"{r['all lanes'] / r['alone'] - 1:9.1%}"
            )


if __name__ == "__main__":
    main()
