"""The output of fixed classify jobs in every mode is byte-identical to the recorded outputs.

`tests/golden/` was written by `tests/golden_jobs.py` with the code as it stood before the
package was restructured. The fast-path files were re-recorded once, deliberately, when the
CPU fast path moved SiLU and the attention softmax to host kernels: labels and
error rows unchanged, scores within 6.3e-7 of the old ones; and again when each batch
came to run whole on one CPU lane instead of split across the lanes (labels and error rows
unchanged, scores within 7.2e-7); and when the fast path became batch-invariant
(labels and error rows unchanged, scores within 5.4e-7, and sorted_* now equal naive_* byte for
byte). The gold loop's files (sequential_*) never changed by a bit. Float bits depend on the BLAS kernels: on the machine kind that
recorded them (ENV.json: SkylakeX kernels on an AMD EPYC, whichever build of OpenBLAS supplies
them; a Zen 5 under OPENBLAS_CORETYPE=SkylakeX matched all ten files byte for byte), in the
host kernels' tiled layout (MLXBATCH_HOST_LAYOUT=tiled where the BLAS probe finds a faster
one), the comparison is byte for byte; elsewhere labels must be identical and scores
within 1e-5.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from golden_jobs import CASES, make_inputs, run_case

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def recorded_env_matches() -> bool:
    env = json.loads((GOLDEN / "ENV.json").read_text())
    out = subprocess.run(
        [sys.executable, "-m", "mlxbatch", "doctor", "--json", "--size", "64"],
        capture_output=True,
        text=True,
        check=True,
    )
    here = json.loads(out.stdout)
    # the family's name as the library spells it: "SKYLAKEX" (the build that recorded them),
    # "SkylakeX" (scipy-openblas32's corename); compared exactly, the bytes were never compared
    kernels = str(here["blas_kernels"]).lower() == str(env["blas_kernels"]).lower()
    # the host kernels' layout too: recorded in the tiled one, which SkylakeX's kernels now
    # run only under MLXBATCH_HOST_LAYOUT=tiled (the plain one is faster and held there)
    layout = here.get("host_layout") == env["host_layout"]
    return kernels and layout and here["device_name"] == env["cpu"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    return root, *make_inputs(root)


def rows(text: str, suffix: str) -> list[dict]:
    if suffix == ".csv":
        return list(csv.DictReader(io.StringIO(text)))
    return [json.loads(x) for x in text.splitlines()]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_classify_output_is_unchanged(inputs, case, recorded_env_matches):
    root, model, src = inputs
    out = run_case(root, model, src, *case)
    want = (GOLDEN / case[0]).read_text()
    got = out.read_text()
    if recorded_env_matches:
        assert got == want
        return
    a, b = rows(got, out.suffix), rows(want, out.suffix)
    assert [r.get("label") for r in a] == [r.get("label") for r in b]
    for x, y in zip(a, b):
        for k in x:
            if k.startswith("score_") and x[k]:
                assert abs(float(x[k]) - float(y[k])) < 1e-5
        for k, v in (x.get("scores") or {}).items():
            assert abs(v - y["scores"][k]) < 1e-5
