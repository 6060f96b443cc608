"""Host-side planning: every item once, budgets kept, order restored, padding counted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxbatch.engine.planner import Batch, global_max_stats, padding_stats, plan_batches, unsort

lengths_st = st.lists(st.integers(1, 300), min_size=1, max_size=200)


@settings(max_examples=200, deadline=None)
@given(
    lengths=lengths_st,
    budget=st.integers(300, 5000),
    max_batch=st.integers(1, 70),
    mode=st.sampled_from(["greedy", "naive", "sequential"]),
)
def test_every_item_is_planned_once_and_unsort_round_trips(lengths, budget, max_batch, mode):
    batches = plan_batches(lengths, mode, budget, max_batch)
    flat = [i for b in batches for i in b.indices]
    assert sorted(flat) == list(range(len(lengths)))
    for b in batches:
        assert b.width == max(lengths[i] for i in b.indices)
        assert len(b.indices) <= (1 if mode == "sequential" else max_batch)
    results = [(b, [f"r{i}" for i in b.indices]) for b in batches]
    assert unsort(results, len(lengths)) == [f"r{i}" for i in range(len(lengths))]


@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, budget=st.integers(300, 5000), max_batch=st.integers(1, 70))
def test_sorted_batches_never_exceed_the_budget(lengths, budget, max_batch):
    for b in plan_batches(lengths, "greedy", budget, max_batch):
        assert b.padded_tokens <= budget
        widths = [lengths[i] for i in b.indices]
        assert widths == sorted(widths, reverse=True)  # contiguous in the sorted order


def test_sorted_pads_less_than_naive_on_a_long_tail():
    lengths = [40, 400, 35, 38, 390, 41, 36, 39, 37, 380, 42, 33] * 10
    naive = padding_stats(lengths, plan_batches(lengths, "naive", 10**6, 8))
    sorted_ = padding_stats(lengths, plan_batches(lengths, "greedy", 1600, 8))
    assert sorted_.overhead < 0.05 < naive.overhead
    assert global_max_stats(lengths).factor == pytest.approx(400 * len(lengths) / sum(lengths))


def test_padding_stats_table():
    batches = [Batch((0, 1), 5), Batch((2,), 2)]
    s = padding_stats([5, 3, 2], batches)
    assert (s.useful_tokens, s.processed_tokens) == (10, 12)
    assert s.overhead == pytest.approx(2 / 12)


def test_item_over_budget_and_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="item 1 has 50 tokens"):
        plan_batches([10, 50], "greedy", 40, 4)
    with pytest.raises(ValueError, match="planner"):
        plan_batches([1], "fastest", 10, 1)
    with pytest.raises(RuntimeError, match="never scored"):
        unsort([(Batch((0,), 1), ["a"])], 2)
    with pytest.raises(RuntimeError, match="twice"):
        unsort([(Batch((0,), 1), ["a"]), (Batch((0,), 1), ["b"])], 1)
