"""Batch invariance of the fast path: a ticket's probabilities are the same bits whatever batch
it lands in (its size, width, the ticket's position, the CPU lane), on the host-kernel path."""

from __future__ import annotations

import random

import numpy as np
import pytest
from fast_path import score_batch

from mlxbatch.bench.workload import generate
from mlxbatch.engine import scorers
from mlxbatch.engine.engine import Engine
from mlxbatch.engine.labels import LabelSet
from mlxbatch.engine.prompt import default_system_prompt
from mlxbatch.model import hostops
from mlxbatch.model.load import load_model
from mlxbatch.runtime.executor import CpuLanes, SingleStream

SINGLE = ("billing", "technical", "account")
MULTI = ("billing issue", "technical problem", "account access deletion")
SIZES = (3, 9, 17)


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    lm = load_model(tiny_model_dir)
    if not hostops.available(lm.dtype):
        pytest.skip("the invariance holds on the CPU float32 host-kernel path")
    return lm


def engine(lm, labels, prefix_cache=True, lanes=1, system=None) -> Engine:
    label_set = LabelSet.build(labels, lm.tokenizer.label, lm.model.args.vocab_size)
    executor = CpuLanes(lanes) if lanes > 1 else SingleStream()
    system = system or default_system_prompt(labels)
    return Engine(lm, label_set, system, prefix_cache, executor)


def tickets(e: Engine, n: int, seed: int) -> list[list[int]]:
    """Prompts of widely varied lengths, the second one past 448 own tokens (OpenBLAS's K
    blocking)."""
    texts = [t["text"] for t in generate(n, seed=seed, mix="heavy-tail")]
    texts.insert(1, " ".join(texts[1:12]))
    return [e.prompt(t) for t in texts]


def needle_batches(prompts: list[list[int]], seed: int) -> list[tuple[list[list[int]], int]]:
    """The first prompt at a random position among random others, for each batch size (the
    long second prompt in the larger batches)."""
    r = random.Random(seed)
    out = []
    for size in SIZES:
        batch = (
            r.sample(prompts[2:], size - 1)
            if size < 8
            else [prompts[1], *r.sample(prompts[2:], size - 2)]
        )
        r.shuffle(batch)
        pos = r.randrange(size)
        batch.insert(pos, prompts[0])
        out.append((batch, pos))
    return out


@pytest.mark.parametrize(
    "labels, prefix_cache, lanes",
    [(SINGLE, True, 1), (MULTI, True, 2), (MULTI, False, 3), (SINGLE, False, 2)],
    ids=[
        "single-prefix-1lane",
        "multi-prefix-2lanes",
        "multi-noprefix-3lanes",
        "single-noprefix-2lanes",
    ],
)
def test_a_ticket_scores_the_same_bits_in_any_batch(lm, labels, prefix_cache, lanes):
    e = engine(lm, labels, prefix_cache, lanes)
    prompts = tickets(e, 30, seed=lanes)
    widths = {max(e.fed_lengths(b)) for b, _ in needle_batches(prompts, lanes)}
    assert len(widths) > 1 and max(widths) > 448  # the batches really differ in width
    alone = score_batch(e, [prompts[0]])[0]
    for batch, pos in needle_batches(prompts, lanes):  # one batch split over the lanes
        got = score_batch(e, batch)[pos]
        assert np.array_equal(got, alone), (len(batch), pos, np.abs(got - alone).max())
    plan = needle_batches(prompts, lanes + 10)[:2]  # a job's way: each batch whole on a lane
    for (_, pos), probs in zip(plan, e.score_batches([b for b, _ in plan])):
        assert np.array_equal(probs[pos], alone), (pos, np.abs(probs[pos] - alone).max())


def questions_engine(lm, prefix_cache: bool, lanes: int):
    from mlxbatch.engine.question_engine import QuestionsEngine

    asked = [
        ("\n\nWhich team?", SINGLE),
        ("\n\nWhich problem?", MULTI),
        ("\n\nDoes this message concern refunds? Answer yes or no.", ("yes", "no")),
    ]
    sets = [
        LabelSet.build(labels, lm.tokenizer.label, lm.model.args.vocab_size) for _, labels in asked
    ]
    executor = CpuLanes(lanes) if lanes > 1 else SingleStream()
    return QuestionsEngine(
        lm, [tail for tail, _ in asked], sets, "Answer the question.", prefix_cache, executor
    )


@pytest.mark.parametrize("prefix_cache, lanes", [(True, 1), (True, 2), (False, 3)])
def test_a_texts_answers_are_the_same_bits_in_any_batch(lm, prefix_cache, lanes):
    """Questions: a text's every answer is the same bits whatever the batch, its width (the
    text's and its questions' tails'), the position and the lane."""
    e = questions_engine(lm, prefix_cache, lanes)
    prompts = tickets(e, 30, seed=lanes)
    alone = score_batch(e, [prompts[0]])[0]
    for batch, pos in needle_batches(prompts, lanes):
        got = score_batch(e, batch)[pos]
        assert np.array_equal(got, alone), (len(batch), pos, np.abs(got - alone).max())
    plan = needle_batches(prompts, lanes + 10)[:2]
    for (_, pos), probs in zip(plan, e.score_batches([b for b, _ in plan])):
        assert np.array_equal(probs[pos], alone), (pos, np.abs(probs[pos] - alone).max())


@pytest.mark.parametrize("lanes", [1, 2])
def test_the_same_bits_behind_a_long_prefix_prefilled_in_chunks(lm, monkeypatch, lanes):
    monkeypatch.setattr(scorers, "PREFILL_CHUNK", 50)
    system = "Classify the ticket. " + " ".join(t["text"] for t in generate(6, seed=8))
    e = engine(lm, MULTI, lanes=lanes, system=system)
    assert len(e.prefix) > 3 * scorers.PREFILL_CHUNK
    prompts = tickets(e, 30, seed=5)
    alone = score_batch(e, [prompts[0]])[0]
    for batch, pos in needle_batches(prompts, 7):
        got = score_batch(e, batch)[pos]
        assert np.array_equal(got, alone), (len(batch), pos, np.abs(got - alone).max())


def test_the_padded_key_axis_keeps_cache_and_own_slots_in_whole_blocks():
    B = hostops.BLOCK
    slots = hostops.key_slots(start=3, keys=3 + 70)
    assert slots[:3].tolist() == [0, 1, 2]  # the cache's slots, then padding to a block
    assert slots[3:].tolist() == list(range(B, B + 70))  # own tokens from a block boundary
    assert hostops.padded_keys(3, 73) == 3 * B
    assert hostops.padded_keys(0, 5) == B


def test_the_prefix_cache_does_not_carry_the_loading_threads_blas_setting(lm):
    """The shared prefix is computed once, when an engine is made, on the caller's thread: with
    OpenBLAS at 1 thread (as an interrupted job's lanes can leave it) and at every core, the
    same bits (the service and a Python call in another process scored 1e-7 apart, seen in CI)."""
    from mlxbatch.runtime import sgemm

    lib = sgemm._serving_openblas()
    if lib is None:
        pytest.skip("OpenBLAS does not serve MLX's matmuls here")
    before = lib.openblas_get_num_threads()
    cores = max(2, before)  # more threads than cores still splits the rows
    kv = []
    try:
        for threads in (1, cores):
            lib.openblas_set_num_threads(threads)
            e = engine(lm, SINGLE, system="You sort tickets. " * 40)  # a prefix of ~300 rows
            cache = e.scorers["fast"].prefix_kv
            kv.append([np.array(x) for x in (*cache.keys, *cache.values)])
    finally:
        lib.openblas_set_num_threads(before)
    assert all(np.array_equal(a, b) for a, b in zip(*kv))
