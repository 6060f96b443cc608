"""Batch invariance under every OpenBLAS kernel family this CPU can run (issue 26).

The DYNAMIC_ARCH OpenBLAS picks its kernels for the CPU at load; OPENBLAS_CORETYPE forces a
family, so one machine tests several. Under each, in a fresh process: the kernels mlxbatch
runs are that family's, its probe found them batch-invariant, and a job writes the same bytes
with 1 or 2 lanes, budgets of 1,024 and 4,096 tokens and windows of 7 or all rows. The probe
itself must see a layout that is not invariant: a plain product under Haswell's kernels (a
row's bits depend on its place in each 12-row group there).
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
NEEDS = {"SkylakeX": cpu.AVX512,
         "Haswell": {"avx2", "fma"}, "Zen": {"avx2", "fma"}, "SandyBridge": {"avx"}}  # fmt: skip
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
print(json.dumps({"active": blas.ACTIVE, "kernels": sgemm.sgemm_provider()["corename"],
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
def test_the_same_bytes_under_each_kernel_family(family, tiny_model_dir, heavy_tail_tickets,
                                                 tmp_path):  # fmt: skip
    if not NEEDS[family] <= FLAGS:
        pytest.skip(f"this CPU cannot run OpenBLAS's {family} kernels")
    env = {**os.environ, cpu.CORETYPE: family}
    out = subprocess.run([sys.executable, "-c", JOB, str(tiny_model_dir), str(heavy_tail_tickets),
                          str(tmp_path)], capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["active"]["invariant"] is True and got["kernels"] == got["active"]["corename"]
    assert len(set(got["digests"].values())) == 1, got["digests"]  # 0 rows differ
    asked = [r for r in got["tried"] if r["source"] == scipy_openblas.SCIPY]
    assert asked and asked[0].get("chosen") and asked[0]["invariant"] is True, got["tried"]
    # Zen runs Haswell's kernels in this library
    assert got["kernels"].lower() == {"Zen": "haswell"}.get(family, family.lower())


PLAIN = """
import json
from mlxbatch.runtime import blas, cpu
cpu.families = lambda: []  # the family asked for, invariant or not
assert blas.activate_in_process(), blas.warning()
from mlxbatch.model import hostops
from mlxbatch.runtime import sgemm
sgemm._serving_openblas().openblas_set_num_threads(1)
ours = hostops.row_invariance()
hostops.matmul_t = lambda x, w, bias=None: x @ w.T  # rows as OpenBLAS's B columns, unpadded
print(json.dumps([ours, hostops.row_invariance()]))
"""


@pytest.mark.skipif(not X86 or not NEEDS["Haswell"] <= FLAGS, reason="needs Haswell kernels")
def test_the_probe_sees_a_layout_that_is_not_invariant():
    env = {**os.environ, cpu.CORETYPE: "Haswell"}
    out = subprocess.run([sys.executable, "-c", PLAIN], capture_output=True, text=True, env=env,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, False]
