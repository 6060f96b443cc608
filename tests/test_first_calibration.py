"""A first job on a new machine checks the planner's default cost model against one timed
batch and calibrates when it is off by more than 2x, saying so."""

from __future__ import annotations

import pytest

from mlxbatch.engine import calibration
from mlxbatch.engine.planner import CostModel


@pytest.fixture
def engine(tiny_model_dir, monkeypatch, tmp_path):
    from mlxbatch.api.classifier import Classifier

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a machine with no calibration yet
    return Classifier.load(tiny_model_dir).engine


def timed_check(engine) -> float:
    import random

    return calibration._time(engine, *calibration.CHECK, random.Random(0))


@pytest.mark.parametrize("factor", [40.0, 1 / 40.0])
def test_defaults_far_off_are_replaced_by_a_calibration_that_says_so(engine, monkeypatch, factor):
    seconds = timed_check(engine)
    per_token = seconds / factor / (calibration.CHECK[0] * calibration.CHECK[1])
    wrong = CostModel(0.0, per_token, 0.0, engine.lanes, "default")
    monkeypatch.setattr(calibration, "default_model", lambda e: wrong)
    said = []
    model = calibration.cost_model(engine, said.append)
    assert model.source == "calibrated" and "calibrating it for this machine" in said[0]
    assert any(m.startswith("planner calibrated") for m in said)
    assert calibration.cached(engine) == model  # once: the next job reads it back
    assert calibration.cost_model(engine, said.append) == model and len(said) == 2


def test_defaults_within_2x_are_kept_and_remembered(engine, monkeypatch):
    seconds = timed_check(engine)
    per_batch = seconds * 1.3  # the check predicts 1.3x what it measured: within 2x
    fair = CostModel(per_batch, 0.0, 0.0, engine.lanes, "default")
    monkeypatch.setattr(calibration, "default_model", lambda e: fair)
    monkeypatch.setattr(calibration, "_time", lambda *a: seconds)
    said = []
    assert calibration.cost_model(engine, said.append) == fair and said == []
    monkeypatch.setattr(calibration, "_time", lambda *a: pytest.fail("timed again"))
    assert calibration.cost_model(engine, said.append) == fair  # cached: not timed again


def test_a_first_jobs_calibration_is_not_counted_as_classifying(tiny_model_dir, monkeypatch):
    """A newcomer's demo said sorted batching was 1.38x the gold loop for 2.5x: the planner's
    one-time calibration (146 s) ran inside the job's clock. The clock starts once the
    settings (and the cost model behind them) are resolved."""
    import time

    from mlxbatch.api.classifier import Classifier
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.inputs import Row
    from mlxbatch.jobs.job import run_job

    clf = Classifier.load(tiny_model_dir)
    model = clf.cost_model()
    ended = []

    def slow_lookup():  # as a calibration would: seconds before the job can plan
        time.sleep(1.0)
        ended.append(time.perf_counter())
        return model

    monkeypatch.setattr(clf, "cost_model", slow_lookup)
    rows = [Row(i + 1, i, f"ticket {i}: my invoice is wrong") for i in range(4)]
    result = run_job(clf, rows, RunSpec(), output=None)
    after = time.perf_counter()
    assert ended, "the cost planner's model was not asked for"
    assert result.seconds <= after - ended[0]  # the clock started after the lookup


@pytest.mark.parametrize(
    "field, value",
    [
        ("per_token", "abc"),
        ("per_token", float("nan")),
        ("per_batch", -1.0),
        ("per_key", None),
        ("lanes", 0),
        ("lanes", 2.5),
        ("source", 7),
    ],
)
def test_an_edited_calibration_is_made_again_and_saved_over(engine, monkeypatch, field, value):
    """A cached calibration is a file a person can edit: a per_token of "abc" failed inside the
    planner (a traceback, the output left as .part), NaN failed writing the journal, and -1
    planned a job predicted at -98 s. An entry no calibration writes is made again."""
    import json

    from mlxbatch.runtime.files import cache_dir

    seconds = timed_check(engine)
    fair = CostModel(seconds, 0.0, 0.0, engine.lanes, "default")  # exactly right: kept
    monkeypatch.setattr(calibration, "default_model", lambda e: fair)
    monkeypatch.setattr(calibration, "_time", lambda *a: seconds)
    assert calibration.cost_model(engine) == fair
    path = cache_dir() / "planner.json"
    data = json.loads(path.read_text())
    data[calibration.cache_key(engine)]["model"][field] = value
    path.write_text(json.dumps(data))  # NaN as JSON's NaN, which json.loads reads back
    with pytest.raises(ValueError, match="cost_model"):
        CostModel.from_dict(data[calibration.cache_key(engine)]["model"])
    assert calibration.cached(engine) is None
    assert calibration.cost_model(engine) == fair  # measured again: within 2x, kept
    assert calibration.cached(engine) == fair  # and saved over the edited entry


def test_a_cost_model_refuses_what_no_calibration_writes():
    good = CostModel(0.01, 1e-5, 0.0, 2, "calibrated").to_dict()
    assert CostModel.from_dict(good) == CostModel(0.01, 1e-5, 0.0, 2, "calibrated")
    assert CostModel.from_dict(good | {"gone": 1}).lanes == 2  # an older version's field
    for bad in (
        [],
        {"per_batch": 0.01},
        good | {"per_key": float("inf")},
        good | {"lanes": True},
        good | {"lanes": 10**30},
        good | {"per_batch": True},
    ):
        with pytest.raises(ValueError, match="cost_model"):
            CostModel.from_dict(bad)


def wrong_defaults(engine, monkeypatch) -> None:
    """Defaults 40x off the timed check: the first job calibrates."""
    per_token = timed_check(engine) / 40.0 / (calibration.CHECK[0] * calibration.CHECK[1])
    wrong = CostModel(0.0, per_token, 0.0, engine.lanes, "default")
    monkeypatch.setattr(calibration, "default_model", lambda e: wrong)


@pytest.mark.parametrize("load, warned", [(5.0, True), (0.5, False)])
def test_a_calibration_beside_other_work_says_the_machine_is_busy(
    engine, monkeypatch, load, warned
):
    """A newcomer's demo calibrated beside two busy cores (126 s) and cached constants that
    predicted every later job 1.7-3.4x slower than it ran, without a word."""
    wrong_defaults(engine, monkeypatch)
    monkeypatch.setattr(calibration.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(calibration, "usable_cores", lambda: [0, 1])
    said = []
    calibration.cost_model(engine, said.append)
    busy = f"the machine is busy (load {load:.1f} on 2 cores)"
    assert (busy in said[0]) == warned, said[0]
    assert ("mlxbatch doctor --calibrate" in said[0]) == warned


def test_the_demo_says_how_long_its_calibration_took(engine, tiny_model_dir, monkeypatch, tmp_path):
    """The demo's last line counted a 126 s calibration as "the rest loading"."""
    from mlxbatch.bench.demo import run_demo

    wrong_defaults(engine, monkeypatch)
    lines, passed = run_demo(6, tiny_model_dir, tmp_path / "demo", progress=lambda m: None)
    took = calibration.cached_entry(engine)["measured"]["took_s"]
    assert passed and lines[-1].endswith(
        f"also calibrated the planner, once: {took:.0f} s of the rest)"
    ), lines[-1]
