"""`bench --ranks N`: the same classify job on one rank and under `mlx.launch -n N` (ring
backend, this host), each as its own process, timed end to end and compared byte for byte."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import JobError


def classify_command(src: Path, model: Path | str, *extra: str, ranks: int = 1) -> list[str]:
    """`mlxbatch classify SRC --model MODEL EXTRA...`, under `mlx.launch` when `ranks` > 1."""
    cmd = [sys.executable, "-m", "mlxbatch", "classify", str(src), "--model", str(model), *extra]
    if ranks == 1:
        return cmd
    launch = shutil.which("mlx.launch") or str(Path(sys.executable).parent / "mlx.launch")
    return [launch, "-n", str(ranks), "--backend", "ring", *cmd]


def measure_ranks(n: int, model: Path, texts: list[str], extra: list[str], progress=print) -> dict:
    """The job on 1 rank and on N: seconds, the ratio, and whether the outputs are identical."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "tickets.jsonl"
        src.write_text(
            "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts))
        )
        runs = {}
        for ranks in (1, n):
            out = Path(tmp) / f"out-{ranks}.jsonl"
            progress(f"running classify on {ranks} rank(s) ...")
            t = time.perf_counter()
            cmd = classify_command(src, model, *extra, "-o", str(out), ranks=ranks)
            r = subprocess.run(cmd, capture_output=True, text=True)
            runs[ranks] = time.perf_counter() - t
            if r.returncode != 0 or not out.exists():
                raise JobError(f"the {ranks}-rank run failed: {(r.stderr or r.stdout)[-400:]}")
        same = (Path(tmp) / "out-1.jsonl").read_bytes() == (
            Path(tmp) / f"out-{n}.jsonl"
        ).read_bytes()
    return {
        "items": len(texts),
        "ranks": n,
        "seconds_1": runs[1],
        f"seconds_{n}": runs[n],
        "speedup": runs[1] / runs[n],
        "identical_output": same,
        "cpu_count": os.cpu_count(),
        "host": socket.gethostname(),
    }
