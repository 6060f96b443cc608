"""Batch invariance under every OpenBLAS kernel family this CPU can run.

The DYNAMIC_ARCH OpenBLAS picks its kernels for the CPU at load; OPENBLAS_CORETYPE forces a
family, so one machine tests several. Under each, in a fresh process: the kernels mlxbatch
runs are that family's, its probe found them batch-invariant, and a job writes the same bytes
with 1 or 2 lanes, budgets of 1,024 and 4,096 tokens and windows of 7 or all rows. The probe
itself must tell the layouts apart: the plain one fails under Haswell's kernels (a row's bits
depend on its place in each 12-row group there) and holds under SkylakeX's.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from mlxbatch.runtime import cpu, scipy_openblas

FLAGS = cpu.flags()
NEEDS = {
    "SkylakeX": cpu.AVX512,
    "Cooperlake": cpu.FAMILY_NEEDS["cooperlake"],
    "SapphireRapids": cpu.FAMILY_NEEDS["sapphirerapids"],
    "Haswell": {"avx2", "fma"},
    "Zen": {"avx2", "fma"},
    "SandyBridge": {"avx"},
}
# what the library runs for a family it may not build: Zen runs Haswell's kernels, and a
# scipy-openblas32 without Cooperlake's or Sapphire Rapids' (0.3.34) runs SkylakeX's
RUNS_AS = {
    "Zen": {"haswell"},
    "Cooperlake": {"cooperlake", "skylakex"},
    "SapphireRapids": {"sapphirerapids", "skylakex"},
}
X86 = platform.system() == "Linux" and platform.machine() == "x86_64"

JOB = """
import hashlib, json, pathlib, sys
from mlxbatch.runtime import blas
assert blas.activate_in_process(), blas.warning()
from mlxbatch.runtime import executor
from mlxbatch.api.classifier import Classifier
from mlxbatch.api.spec import RunSpec
from mlxbatch.io.inputs import read_rows
from mlxbatch.jobs.job import run_job
from mlxbatch.runtime import sgemm

model, tickets, out = sys.argv[1:4]
rows = read_rows(tickets)[0]
digests = {}
for lanes in (1, 2):
    executor.usable_cores = lambda: list(range(lanes))
    clf = Classifier.load(model)
    for budget, window in ((1024, 16384), (4096, 16384), (1024, 7)):
        path = pathlib.Path(out, f"{lanes}-{budget}-{window}.jsonl")
        run_job(clf, rows, RunSpec(batch_tokens=budget, window=window), path)
        digests[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
from mlxbatch.model import hostops
print(json.dumps({"active": blas.ACTIVE, "kernels": sgemm.sgemm_provider()["corename"],
                  "layout": hostops.LAYOUT, "ran": hostops.matmul_t.__name__,
                  "tried": blas.tried(), "digests": digests}))
"""


@pytest.fixture(scope="module")
def heavy_tail_tickets(tmp_path_factory):
    from mlxbatch.bench.workload import generate, write_jsonl

    path = tmp_path_factory.mktemp("families") / "t.jsonl"
    write_jsonl(generate(40, seed=5, mix="heavy-tail"), path)
    return path


@pytest.mark.skipif(not X86, reason="OpenBLAS's x86_64 kernel families")
@pytest.mark.parametrize("family", list(NEEDS))
def test_the_same_bytes_under_each_kernel_family(
    family, tiny_model_dir, heavy_tail_tickets, tmp_path
):
    if not NEEDS[family] <= FLAGS:
        pytest.skip(f"this CPU cannot run OpenBLAS's {family} kernels")
    env = {**os.environ, cpu.CORETYPE: family}
    out = subprocess.run(
        [sys.executable, "-c", JOB, str(tiny_model_dir), str(heavy_tail_tickets), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["active"]["invariant"] is True and got["kernels"] == got["active"]["corename"]
    assert len(set(got["digests"].values())) == 1, got["digests"]  # 0 rows differ
    asked = [r for r in got["tried"] if r["source"] == scipy_openblas.SCIPY]
    assert asked and asked[0].get("chosen") and asked[0]["invariant"] is True, got["tried"]
    assert got["active"]["layout"] == asked[0]["layouts"][0] == got["layout"]  # the fastest
    assert got["ran"] == f"_{got['layout']}_matmul_t"  # invariant one ran
    assert got["kernels"].lower() in RUNS_AS.get(family, {family.lower()})


LAYOUTS = """
import json
from mlxbatch.runtime import blas, cpu
cpu.families = lambda: []  # the family asked for, invariant or not
assert blas.activate_in_process(), blas.warning()
from mlxbatch.model import hostops, invariance
from mlxbatch.runtime import sgemm
sgemm._serving_openblas().openblas_set_num_threads(1)
found = invariance.invariant_layouts()
hostops.KERNELS["plain"] = (lambda x, w, bias=None: x @ w.T,  # rows as B columns, unpadded
                           hostops.KERNELS["plain"][1])
print(json.dumps({"found": found, "chosen": blas.ACTIVE["layout"],
                  "unpadded": invariance.row_invariance("plain")}))
"""


@pytest.mark.skipif(not X86, reason="OpenBLAS's x86_64 kernel families")
@pytest.mark.parametrize("family", ["Haswell", "SkylakeX", "SandyBridge"])
def test_the_probe_finds_each_layout_invariant_or_not(family):
    """Under Haswell's kernels only the tiled layout holds (a plain product's rows differ by
    their place in each 12-row group), and the probe sees it; under SkylakeX's and
    SandyBridge's the plain one (1.61x cheaper in the products under SkylakeX) holds too and is
    chosen; an unpadded product, whose small sizes take SkylakeX's small-matrix kernel and
    Haswell's 12-row groups, holds under neither."""
    if not NEEDS[family] <= FLAGS:
        pytest.skip(f"this CPU cannot run OpenBLAS's {family} kernels")
    env = {**os.environ, cpu.CORETYPE: family}
    env.pop("MLXBATCH_HOST_LAYOUT", None)
    out = subprocess.run(
        [sys.executable, "-c", LAYOUTS], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    want = {
        "Haswell": ["tiled"],
        "SkylakeX": ["plain", "tiled"],
        "SandyBridge": ["plain", "tiled"],
    }[family]
    assert got["found"] == want and got["chosen"] == want[0]
    if family != "SandyBridge":  # no small-matrix kernel or row groups there
        assert got["unpadded"] is False


def test_the_layout_is_the_fastest_the_probe_found_invariant_unless_tiled_is_asked(monkeypatch):
    from mlxbatch.runtime import blas

    monkeypatch.delenv(blas.LAYOUT_ENV, raising=False)
    assert blas._layout({"layouts": ["plain", "tiled"]}) == "plain"
    assert blas._layout({"layouts": ["tiled"]}) == "tiled"
    assert blas._layout({"layouts": []}) == "tiled"  # none held: the BLAS is not invariant
    assert blas._layout({}) == "tiled"  # a probe from before layouts were recorded
    monkeypatch.setenv(blas.LAYOUT_ENV, "tiled")
    assert blas._layout({"layouts": ["plain", "tiled"]}) == "tiled"
    assert blas.layout_problem() is None
    monkeypatch.setenv(blas.LAYOUT_ENV, "auto")
    assert blas._layout({"layouts": ["plain", "tiled"]}) == "plain"
    assert blas.layout_problem() is None


@pytest.mark.parametrize("asked", ["plain", "Tiled", "fast"])
def test_a_layout_that_is_not_a_choice_is_one_line_before_any_work(asked, tmp_path):
    env = {**os.environ, "MLXBATCH_HOST_LAYOUT": asked}
    cli = subprocess.run(
        [sys.executable, "-m", "mlxbatch", "tickets", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    lines = cli.stderr.strip().splitlines()
    assert cli.returncode == 2 and len(lines) == 1, (cli.returncode, cli.stderr)
    assert lines[0].startswith(f"error: MLXBATCH_HOST_LAYOUT='{asked}' is not a choice")
    assert not cli.stdout
    api = subprocess.run(
        [sys.executable, "-c", "from mlxbatch import Classifier"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert api.returncode == 1 and "UsageError: MLXBATCH_HOST_LAYOUT=" in api.stderr
