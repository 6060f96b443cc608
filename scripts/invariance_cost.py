"""CPU seconds of scoring one batch of N synthetic tickets on one stream (OpenBLAS on one
thread), the second of two passes: run it with PYTHONPATH pointing at two trees to compare
them (docs/benchmarks.md, "What does batch invariance cost?").

    python scripts/invariance_cost.py MODEL_DIR N
"""

from __future__ import annotations

import sys
import time

import mlxbatch

mlxbatch.Classifier  # the fast BLAS, in-process, before mlx is used  # noqa: B018

from mlxbatch.api.classifier import Classifier  # noqa: E402
from mlxbatch.bench.workload import generate  # noqa: E402
from mlxbatch.engine.engine import Engine  # noqa: E402
from mlxbatch.runtime import executor, sgemm  # noqa: E402

clf = Classifier.load(sys.argv[1])
engine = Engine(clf.lm, clf.labels, clf.system_prompt, executor=executor.SingleStream())
prompts = [engine.prompt(t["text"]) for t in generate(int(sys.argv[2]), seed=1)]
with sgemm.single_threaded():
    for _ in range(2):
        wall, cpu = time.perf_counter(), time.process_time()
        engine.score_batches([prompts])
    print(
        f"rows {len(prompts)} wall {time.perf_counter() - wall:.2f} s "
        f"cpu {time.process_time() - cpu:.2f} s"
    )
