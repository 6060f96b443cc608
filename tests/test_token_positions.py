"""A rotary position a token (a text's tails share its row, each restarting at the text's end):
the rotation equals the per-row offset form, and a forward keeping several positions a row
equals the full forward at those positions."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxbatch.model.load import load_model
from mlxbatch.model.rope import Rope

ROPES = [
    Rope(8, 10000.0),
    Rope(
        8,
        500000.0,
        tuple(
            sorted(
                {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                }.items()
            )
        ),
    ),
]


@pytest.mark.parametrize("rope", ROPES, ids=["default", "llama3"])
def test_a_position_a_token_rotates_as_a_row_offset_does(rope):
    fn = rope.make()
    x = mx.random.normal((2, 3, 5, 8), key=mx.random.key(0))
    offsets = mx.array([3, 7])
    per_token = offsets[:, None] + mx.arange(5)[None]
    want = np.array(fn(x, offsets))
    assert np.array_equal(np.array(fn(x, per_token)), want)
    restarted = mx.array([[3, 4, 5, 4, 5], [7, 8, 9, 10, 8]])  # two rows, tails restarting
    got = np.array(fn(x, restarted))
    assert np.array_equal(got[1, :, 4], np.array(fn(x, mx.array([0, 4])))[1, :, 4])  # at 8
    assert not np.array_equal(got[0, :, 3], want[0, :, 3])


def test_keeping_several_positions_a_row_equals_the_full_forward(tiny_model_dir):
    model = load_model(tiny_model_dir).model
    tokens = mx.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    positions = mx.array([[0, 1, 2, 3, 2, 3], [0, 1, 2, 3, 4, 5]])
    seen = np.tril(np.ones((6, 6), bool))
    seen[4:, 2:4] = False  # the second tail does not see the first
    mask = mx.array(np.broadcast_to(seen, (2, 1, 6, 6)))
    full = np.array(model(tokens, None, positions, mask))
    keep = mx.array([[3, 5], [1, 4]])
    got = np.array(model(tokens, None, positions, mask, keep=keep))
    assert got.shape == (2, 2, full.shape[-1])
    np.testing.assert_allclose(got[0], full[0, [3, 5]], atol=1e-5)
    np.testing.assert_allclose(got[1], full[1, [1, 4]], atol=1e-5)
    alone = np.array(model(tokens[:1, [0, 1, 4, 5]], None, 0, "causal"))  # the second prompt
    np.testing.assert_allclose(got[0, 1], alone[0, 3], atol=1e-5)


def test_a_texts_questions_on_the_pure_mlx_path_equal_the_gold_loop(tiny_model_dir):
    """Without host kernels (a Mac's path: MLX's own attention under the same block mask)."""
    from fast_path import score_batch
    from test_questions import QUESTIONS, TEXTS

    from mlxbatch.api.classifier import Classifier

    e = Classifier.load(tiny_model_dir, questions=QUESTIONS).engine
    e.scorers["fast"].host_kernels = False
    prompts = e.prompts(TEXTS)
    gold = np.stack([e.score_gold(p) for p in prompts])
    np.testing.assert_allclose(score_batch(e, prompts), gold, atol=1e-5)
