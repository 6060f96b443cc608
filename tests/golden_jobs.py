"""The fixed classify jobs whose outputs were recorded before the package was restructured.

`python tests/golden_jobs.py DIR` writes them (used once, to record `tests/golden/`);
`test_golden.py` re-runs them and compares byte for byte.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LABELS = {
    "single": "billing,technical,account",
    "multi": "billing issue,technical problem,account access",
}
CASES = [
    (f"{mode}_{lab}{'_noprefix' if noprefix else ''}.{ext}", mode, lab, noprefix)
    for mode in ("sorted", "naive", "sequential")
    for lab in LABELS
    for noprefix, ext in ((False, "jsonl"), (True, "csv"))
    if not (noprefix and mode == "sequential")
]


def make_inputs(root: Path) -> tuple[Path, Path]:
    from mlxbatch.bench.workload import generate, write_jsonl
    from mlxbatch.model.convert import init_random

    model = root / "tiny"
    if not model.exists():
        init_random(model, preset="tiny", seed=0, dtype="float32")
    tickets = generate(40, seed=3)
    tickets[5]["text"] = ""  # a bad row: an error row under --on-error skip
    src = root / "in.jsonl"
    write_jsonl(tickets, src)
    return model, src


def run_case(
    root: Path, model: Path, src: Path, name: str, mode: str, lab: str, noprefix: bool
) -> Path:
    out = root / name
    cmd = [
        sys.executable,
        "-m",
        "mlxbatch",
        "classify",
        str(src),
        "--model",
        str(model),
        "-o",
        str(out),
        "--mode",
        mode,
        "--labels",
        LABELS[lab],
        "--on-error",
        "skip",
        "--batch-tokens",
        "256",
        "--max-batch",
        "8",
    ]
    if noprefix:
        cmd.append("--no-prefix-cache")
    if mode == "sorted":  # recorded when greedy budget filling was the only sorted planner
        cmd += ["--planner", "greedy"]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


if __name__ == "__main__":
    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    model, src = make_inputs(root)
    for case in CASES:
        print(run_case(root, model, src, *case))
