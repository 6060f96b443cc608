"""CPU seconds of one batch of N synthetic tickets on one stream (OpenBLAS on one thread) under
each OpenBLAS kernel family named, in fresh processes taken in turn (A B A B ...), and each
family's ratio to the first: what running an invariant family costs against the one OpenBLAS
picks itself (docs/benchmarks.md, "Which CPU kernel family?"). A family is used here as named, invariant or
not (the probe's choice is bypassed); the printed `invariant` is the probe's verdict.

    python scripts/family_cost.py MODEL_DIR N ROUNDS Haswell SandyBridge [...]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, sys, time
from mlxbatch.runtime import blas, cpu
cpu.families = lambda: []  # OpenBLAS's own kernels under the OPENBLAS_CORETYPE given
assert blas.activate_in_process(), blas.warning()
from mlxbatch.api.classifier import Classifier
from mlxbatch.bench.workload import generate
from mlxbatch.engine.engine import Engine
from mlxbatch.runtime import executor, sgemm
clf = Classifier.load(sys.argv[1])
engine = Engine(clf.lm, clf.labels, clf.system_prompt, executor=executor.SingleStream())
prompts = [engine.prompt(t["text"]) for t in generate(int(sys.argv[2]), seed=1)]
with sgemm.single_threaded():
    for _ in range(2):
        cpu = time.process_time()
        engine.score_batches([prompts])
print(json.dumps({"cpu": time.process_time() - cpu, "kernels": blas.ACTIVE.get("corename"),
                  "invariant": blas.ACTIVE.get("invariant"), "layout": blas.ACTIVE.get("layout"),
                  "tokens": sum(len(p) for p in prompts)}))
"""


def main() -> None:
    model, n, rounds, families = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    seconds: dict[str, list[float]] = {f: [] for f in families}
    seen = {}
    for _ in range(rounds):
        for family in families:
            env = {**os.environ, "OPENBLAS_CORETYPE": family}
            out = subprocess.run(
                [sys.executable, "-c", CHILD, model, n],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
            seconds[family].append(got["cpu"])
            seen[family] = got
            print(
                f"{family}: {got['cpu']:.2f} s CPU ({got['kernels']}, invariant "
                f"{got['invariant']}, {got['tokens']} tokens)",
                flush=True,
            )
    first = statistics.median(seconds[families[0]])
    for family in families:
        med = statistics.median(seconds[family])
        print(
            f"{family:>12}: median {med:.2f} s CPU over {rounds}, {med / first:.3f}x "
            f"{families[0]}, kernels {seen[family]['kernels']}, invariant "
            f"{seen[family]['invariant']}"
        )


if __name__ == "__main__":
    main()
