"""CPU seconds of one batch of 8 synthetic tickets under one OpenBLAS kernel family, this
tree against another checkout (a `git worktree` of an older commit) or against this tree
under another environment setting, in fresh processes taken in turn (A B A B ...): what a
change of the host kernels' layout costs (docs/benchmarks.md, "Which CPU kernel family?"). The child is
`family_cost.py`'s.

    git worktree add ../old b0074cc
    python scripts/layout_cost.py weights/qwen2.5-0.5b-synthetic SkylakeX 3 ../old
    python scripts/layout_cost.py weights/qwen2.5-0.5b-synthetic SkylakeX 3 MLXBATCH_HOST_LAYOUT=tiled
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from family_cost import CHILD


def main() -> None:
    model, family, rounds, other = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    here = str(Path(__file__).resolve().parents[1])
    setting = dict([other.split("=", 1)]) if "=" in other else {}  # this tree, so set
    trees = {"this": here, "other": here if setting else other}
    got: dict[str, list[float]] = {k: [] for k in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            env = {**os.environ, "OPENBLAS_CORETYPE": family, "PYTHONPATH": tree}
            env.pop("MLXBATCH_HOST_LAYOUT", None)
            env.update(setting if name == "other" else {})
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(Path(model).resolve()), "8"],
                env=env,
                cwd=tree,
                check=True,
                capture_output=True,
                text=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            got[name].append(r["cpu"])
            print(
                f"{name}: {r['cpu']:.2f} s CPU ({r['kernels']}, invariant {r['invariant']}, "
                f"layout {r.get('layout', 'tiled')})",
                flush=True,
            )
    a, b = statistics.median(got["this"]), statistics.median(got["other"])
    pairs = [round(x / y, 3) for x, y in zip(got["this"], got["other"])]
    print(
        f"{family}: this tree {a:.2f} s, {other} {b:.2f} s (medians of {rounds}): "
        f"{a / b:.3f}x; pairs {pairs}"
    )


if __name__ == "__main__":
    main()
