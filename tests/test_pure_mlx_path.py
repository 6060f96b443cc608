"""The pure-MLX fast path, the one a Mac runs (no host kernels, float16 or bfloat16), for every
family: labels equal to the gold loop's, probabilities within the dtype's tolerance, and on the
CPU the same bytes whatever the batches (two token budgets).

The host-kernel switch is `hostops.available(dtype)`: float32 on the CPU unless
`MLXBATCH_HOST_KERNELS=0`, read each time a fast scorer is made (not at import), so the
variable set here reaches every engine built after it; float16 and bfloat16 never take the
host kernels. float32 with the switch off is checked against the gold loop too; its bytes are
not promised batch-invariant (its products go through OpenBLAS as MLX lays them out).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import make_hf_checkpoint
from test_families import TEXTS, make_checkpoint

from mlxbatch.engine.engine import Engine
from mlxbatch.engine.labels import LabelSet
from mlxbatch.engine.planner import plan_batches
from mlxbatch.engine.prompt import default_system_prompt
from mlxbatch.engine.scheduler import score_all
from mlxbatch.model.load import load_model

# one checkpoint a family, its own switches on (test_families.CASES; Qwen2 from conftest)
FAMILIES = ("qwen2", "qwen3_tied", "llama3_tied_biased", "gemma3_sliding", "phi4mini_longrope")
DTYPES = ("float16", "bfloat16", "float32")
# two tokens each: the continuation path runs, and the probabilities stay far from 0 and 1
# (labels of unequal length put nearly all the mass on the shortest)
LABELS = ("billing issue", "technical problem", "account access")
BUDGETS = ((10_000, 8), (60, 2))  # (batch_tokens, max_batch): all rows in one batch; pairs


def tolerance(dtype: mx.Dtype) -> float:
    """Both paths accumulate in float32 and round each layer's output to the dtype, at points
    that differ by a few ulps (eps) of O(1) activations; a probability moves by at most 1/4 of
    its log-odds, so 16 eps bounds it (float32: 1.9e-6, test_families.py's 2e-6)."""
    return 16 * mx.finfo(dtype).eps


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pure_mlx")
    out = {"qwen2": make_hf_checkpoint(root / "qwen2")}
    return out | {name: make_checkpoint(root / name, name) for name in FAMILIES[1:]}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_fast_path_without_host_kernels_equals_the_gold_loop(
    family, dtype, checkpoints, monkeypatch
):
    monkeypatch.setenv("MLXBATCH_HOST_KERNELS", "0")
    lm = load_model(checkpoints[family], dtype=dtype)
    labels = LabelSet.build(LABELS, lm.tokenizer.label, lm.model.args.vocab_size)
    engine = Engine(lm, labels, default_system_prompt(LABELS))
    assert engine.scorers["fast"].host_kernels is False
    prompts = [engine.prompt(t) for t in TEXTS]
    gold = np.stack([engine.score_gold(p) for p in prompts])
    runs = [
        score_all(
            engine, prompts, plan_batches(engine.fed_lengths(prompts), "greedy", budget, most)
        )
        for budget, most in BUDGETS
    ]
    for probs in runs:
        assert (probs.argmax(1) == gold.argmax(1)).all(), (family, dtype)
        np.testing.assert_allclose(probs, gold, atol=tolerance(lm.dtype), err_msg=family)
    if dtype != "float32" and mx.default_device() == mx.cpu:  # Metal's kernels promise no such
        assert runs[0].tobytes() == runs[1].tobytes(), (family, dtype)
