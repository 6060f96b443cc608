"""The cost planner: exact against brute force, never worse than greedy, within its caps; the
cost model's calibration fits known constants, is cached, and is recorded for resume."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxbatch.engine.planner import CostModel, padding_stats, plan, plan_cost, unsort

CM = CostModel(per_batch=0.08, per_token=2.3e-3, per_key=2e-6, lanes=2)


def predicted(batches, cost=CM, prefix=40):
    return sum(cost.seconds(len(b.indices), b.width, prefix) for b in batches)


def brute_force(lengths, cost, prefix, budget, max_batch):
    """Every contiguous cut of the sorted order; the cheapest."""
    w = sorted(lengths, reverse=True)
    n, best = len(w), float("inf")
    for cuts in itertools.product([0, 1], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        total = 0.0
        for a, b in zip(bounds, bounds[1:]):
            k = b - a
            if k > max_batch or (k > 1 and k * w[a] > budget):
                total = float("inf")
                break
            total += cost.seconds(k, w[a], prefix)
        best = min(best, total)
    return best


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 120), min_size=1, max_size=9),
    budget=st.integers(100, 600),
    max_batch=st.integers(1, 6),
)
def test_the_dp_is_exact_on_small_inputs(lengths, budget, max_batch):
    batches = plan_cost(lengths, CM, 40, budget, max_batch, max_padding=None)
    assert predicted(batches) == pytest.approx(brute_force(lengths, CM, 40, budget, max_batch))


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 400), min_size=1, max_size=200),
    cap=st.sampled_from([0.0, 0.01, 0.03, 0.1]),
    max_batch=st.integers(1, 70),
)
def test_the_padding_cap_holds_at_the_least_cost_it_allows(lengths, cap, max_batch):
    free = plan_cost(lengths, CM, 40, 1 << 20, max_batch, max_padding=None)
    capped = plan_cost(lengths, CM, 40, 1 << 20, max_batch, max_padding=cap)
    assert padding_stats(lengths, capped).overhead <= cap + 1e-12
    assert predicted(capped) >= predicted(free) - 1e-9
    if padding_stats(lengths, free).overhead <= cap:
        assert capped == free  # no penalty when the optimum already meets the cap
    for budget in (256, 1024, 4096):  # a plan padding no more costs no less (Lagrange)
        greedy = plan(lengths, "greedy", max(budget, max(lengths)), max_batch)
        if padding_stats(lengths, greedy).overhead <= padding_stats(lengths, capped).overhead:
            assert predicted(capped) <= predicted(greedy) + 1e-9


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 400), min_size=1, max_size=300),
    budget=st.integers(400, 8000),
    max_batch=st.integers(1, 70),
)
def test_every_item_once_within_caps_and_never_worse_than_greedy(lengths, budget, max_batch):
    batches = plan(lengths, "cost", budget, max_batch, CM, 40)
    flat = [i for b in batches for i in b.indices]
    assert sorted(flat) == list(range(len(lengths)))
    for b in batches:
        assert len(b.indices) <= max_batch
        assert b.padded_tokens <= budget or len(b.indices) == 1
        assert b.width == max(lengths[i] for i in b.indices)
    results = [(b, list(b.indices)) for b in batches]
    assert unsort(results, len(lengths)) == list(range(len(lengths)))
    greedy = plan(lengths, "greedy", max(budget, max(lengths)), max_batch)
    uncapped = plan_cost(lengths, CM, 40, budget, max_batch, max_padding=None)
    assert predicted(uncapped) <= predicted(greedy) + 1e-9


def test_a_long_tail_is_cut_with_little_padding():
    import random

    r = random.Random(0)
    lengths = [max(3, int(r.lognormvariate(3.8, 0.7))) for _ in range(2000)]
    cost = plan(lengths, "cost", 16384, 64, CM, 40)
    greedy = plan(lengths, "greedy", 4096, 64)
    assert padding_stats(lengths, cost).overhead < 0.03 < padding_stats(lengths, greedy).overhead


def test_multi_token_labels_raise_the_predicted_cost():
    assert CM.seconds(4, 50, 40, label_rows=3, label_len=2) > CM.seconds(4, 50, 40)


def test_the_reported_prediction_counts_the_label_pass(tiny_model_dir, tmp_path):
    """The job's "predicted" figure is the time the planner minimised, label pass included."""
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.bench.workload import generate, write_jsonl
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.jobs.job import run_job

    clf = Classifier.load(tiny_model_dir, ("billing issue", "technical problem", "account"))
    prefix, rows, length = clf.engine.cost_terms()
    assert prefix == len(clf.engine.prefix) and rows == 3 and length == clf.labels.max_len - 1 > 0
    src = tmp_path / "t.jsonl"
    write_jsonl(generate(20, seed=3), src)
    result = run_job(clf, read_rows(str(src))[0], RunSpec(), tmp_path / "o.jsonl")
    prompts = [clf.engine.prompt(t["text"]) for t in generate(20, seed=3)]
    cost = clf.cost_model()
    batches = clf.plan(prompts, cost=cost)
    assert result.predicted_seconds == pytest.approx(
        cost.plan_seconds(batches, *clf.engine.cost_terms())
    )
    assert result.predicted_seconds > cost.plan_seconds(batches, prefix)


def test_a_plan_is_predicted_shared_among_the_lanes():
    batches = plan([30, 20, 20, 10, 5], "greedy", 40, 64)
    one = CostModel(CM.per_batch, CM.per_token, CM.per_key, lanes=1)
    assert one.plan_seconds(batches, 40) == pytest.approx(predicted(batches, one))
    assert CM.plan_seconds(batches, 40) == pytest.approx(predicted(batches) / 2)


def test_a_cost_model_recorded_by_an_older_version_still_loads():
    old = CM.to_dict() | {"underfill": 0.7}  # a field this version dropped
    assert CostModel.from_dict(old) == CM


def test_fit_recovers_known_constants(tiny_model_dir):
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.engine.calibration import SHAPES, fit

    clf = Classifier.load(tiny_model_dir)
    truth = CostModel(0.05, 1e-3, 3e-6, clf.engine.lanes)
    P = len(clf.engine.prefix)
    seconds = [float(truth.seconds(r, w, P)) for r, w in SHAPES]
    got = fit(clf.engine, list(SHAPES), seconds)
    assert got.per_batch == pytest.approx(truth.per_batch, rel=1e-6)
    assert got.per_token == pytest.approx(truth.per_token, rel=1e-6)
    assert got.per_key == pytest.approx(truth.per_key, rel=1e-6)
    assert got.lanes == truth.lanes


def test_the_preferred_budget_follows_the_device_not_the_lane_count(tiny_model_dir, monkeypatch):
    """A 1-core CPU runs one lane: its batches still run on one core, so they get the CPU's
    budget, not the GPU's."""
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.engine.footprint import PREFERRED_BUDGET
    from mlxbatch.runtime import executor

    for cores in ([0], [0, 1]):
        monkeypatch.setattr(executor, "usable_cores", lambda c=cores: c)
        clf = Classifier.load(tiny_model_dir)
        assert clf.engine.lanes == len(cores)
        assert (
            clf.settings().policy.batch_tokens == PREFERRED_BUDGET["cpu"] < PREFERRED_BUDGET["gpu"]
        )


def test_calibration_is_cached_and_used(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from mlxbatch.engine import calibration

    monkeypatch.setattr(calibration, "OFF_BY", float("inf"))  # a first job keeps the defaults
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.engine.calibration import cached, cached_entries, calibrate

    clf = Classifier.load(tiny_model_dir)
    assert clf.cost_model().source == "default"
    model, meas = calibrate(clf.engine)
    assert model.source == "calibrated" and len(meas["seconds"]) == len(meas["shapes"])
    assert cached(clf.engine) == model
    assert clf.cost_model().source == "default"  # looked up once per classifier
    assert Classifier.load(tiny_model_dir).cost_model() == model  # the next one uses the cache
    assert cached_entries()[0]["model"]["per_token"] == model.per_token


def test_the_journal_records_the_cost_model(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from mlxbatch.engine import calibration

    monkeypatch.setattr(calibration, "OFF_BY", float("inf"))  # a first job keeps the defaults
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.bench.workload import generate, write_jsonl
    from mlxbatch.engine.calibration import calibrate
    from mlxbatch.engine.engine import Engine
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.io.sinks import journal_path
    from mlxbatch.jobs.job import run_job

    src = tmp_path / "t.jsonl"
    write_jsonl(generate(80, seed=2, mix="heavy-tail"), src)
    clf = Classifier.load(tiny_model_dir)
    run_job(clf, read_rows(str(src))[0], RunSpec(max_batch=4), tmp_path / "ref.jsonl")
    real = Engine.run

    def interrupted(self, *a, **k):
        for n, item in enumerate(real(self, *a, **k)):
            if n == 3:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(Engine, "run", interrupted)
    out = tmp_path / "o.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_job(clf, read_rows(str(src))[0], RunSpec(max_batch=4), out)
    head = json.loads(journal_path(out).read_text().splitlines()[0])
    assert head["settings"]["cost_model"]["source"] == "default"
    monkeypatch.setattr(Engine, "run", real)
    calibrate(clf.engine)  # the machine's model changes between the runs: the recorded one is kept
    res = run_job(clf, read_rows(str(src))[0], RunSpec(max_batch=4), out, resume=True)
    assert out.read_bytes() == (tmp_path / "ref.jsonl").read_bytes()
    assert res.planner == "cost (default)"
