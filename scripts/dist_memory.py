"""How a 2-rank job's time and peak memory grow with its size (tiny model, this host).

    python scripts/dist_memory.py 1000 10000

For each size: synthetic tickets, `mlx.launch -n 2 --backend ring ... classify`, wall time and
the largest peak RSS of any rank (ru_maxrss of the waited-for processes).
"""

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlxbatch.bench.scaling import classify_command
from mlxbatch.bench.workload import generate, write_jsonl
from mlxbatch.model.convert import init_random

with tempfile.TemporaryDirectory() as tmp:
    model = Path(tmp) / "tiny"
    init_random(model, preset="tiny", seed=0, dtype="float32")
    for n in map(int, sys.argv[1:]):
        src = Path(tmp) / f"t{n}.jsonl"
        write_jsonl(generate(n, seed=1), src)
        cmd = classify_command(src, model, "-o", str(Path(tmp) / f"o{n}.jsonl"), ranks=2)
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        lines = (r.stderr + r.stdout).splitlines()
        summary = next((x for x in lines if " rows (" in x), "?")
        print(
            f"{n} tickets, 2 ranks: {seconds:.1f} s, largest rank peak RSS "
            f"{max(peak, before) / 1024:.0f} MiB (exit {r.returncode}); {summary}"
        )
