"""Same input, same bytes: a classify job's output depends only on the input, the model and
the settings that change answers, never on a timing measurement, the machine's load, a
re-calibration, the batch budget, the planner, the lane count or a resume point.

The root is batch invariance (tests/test_invariance.py): on the CPU float32 path a ticket's
scores do not depend on the batch it lands in, so no plan can change a byte. These tests
check the whole job under the things that change plans or timing."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import pytest

from mlxbatch.bench.workload import generate, write_jsonl


@pytest.fixture(scope="module")
def tickets(tmp_path_factory):
    path = tmp_path_factory.mktemp("det") / "t.jsonl"
    write_jsonl(generate(90, seed=11, mix="heavy-tail"), path)
    return path


@pytest.fixture(scope="module")
def clf(tiny_model_dir):
    from mlxbatch.api.classifier import Classifier

    return Classifier.load(tiny_model_dir)


def run(clf, tickets, out, **settings):
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.jobs.job import run_job

    return run_job(clf, read_rows(str(tickets))[0], RunSpec(**settings), out)


def test_budget_planner_and_cost_model_cannot_change_a_byte(clf, tickets, tmp_path):
    """Plans as different as a calibration can make them (budgets, planners, cost constants
    1000x apart): different batches, the same file."""
    from mlxbatch.engine.planner import CostModel

    ref = tmp_path / "ref.jsonl"
    first = run(clf, tickets, ref)
    outputs, shapes = [], {tuple(map(tuple, (b.indices for b in first_batches(clf, tickets))))}
    cases = [
        dict(batch_tokens=500),
        dict(batch_tokens=900, max_batch=3),
        dict(planner="greedy"),
        dict(mode="naive", max_batch=7),
        dict(mode="sequential-prefix"),
    ]
    for n, case in enumerate(cases):
        out = tmp_path / f"o{n}.jsonl"
        run(clf, tickets, out, **case)
        outputs.append(out)
    for per_key in (1e-12, 1e-6):  # "re-calibrations": cost models far apart
        clf._cost = CostModel(0.01, 1e-6, per_key, clf.engine.lanes, "calibrated")
        shapes.add(tuple(map(tuple, (b.indices for b in first_batches(clf, tickets)))))
        out = tmp_path / f"cal{per_key}.jsonl"
        run(clf, tickets, out)
        outputs.append(out)
    clf._cost = None
    assert len(shapes) > 1  # the plans did differ
    for out in outputs:
        assert out.read_bytes() == ref.read_bytes(), out.name
    assert first.scored == 90


def first_batches(clf, tickets):
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.jobs.plan import plan_window

    spec = RunSpec()
    rows = read_rows(str(tickets))[0]
    return plan_window(clf, rows, 0, clf.settings(spec)).batches


@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_one_two_or_four_lanes_write_the_same_bytes(
    tiny_model_dir, tickets, tmp_path, monkeypatch, lanes
):
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.runtime import executor

    ref = tmp_path / "ref.jsonl"
    run(Classifier.load(tiny_model_dir), tickets, ref)
    monkeypatch.setattr(executor, "usable_cores", lambda: list(range(lanes)))
    clf = Classifier.load(tiny_model_dir)
    assert clf.engine.lanes == lanes
    out = tmp_path / "o.jsonl"
    run(clf, tickets, out)
    assert out.read_bytes() == ref.read_bytes()


def test_lanes_finishing_in_any_order_write_the_same_bytes(
    tiny_model_dir, tickets, tmp_path, monkeypatch
):
    """Each lane's batches delayed at random: batches complete out of order, the file does not
    change."""
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.engine.scorers import PrefixScorer

    clf = Classifier.load(tiny_model_dir)
    ref = tmp_path / "ref.jsonl"
    run(clf, tickets, ref)
    real = PrefixScorer._score_rows
    rng = random.Random(5)

    def jittered(self, prompts, lane):
        time.sleep(rng.random() * 0.03)
        return real(self, prompts, lane)

    monkeypatch.setattr(PrefixScorer, "_score_rows", jittered)
    for n in range(2):
        out = tmp_path / f"o{n}.jsonl"
        run(clf, tickets, out, batch_tokens=500 * (n + 1))
        assert out.read_bytes() == ref.read_bytes()


@pytest.mark.parametrize("stop_after", [1, 3, 6])
def test_resumed_anywhere_equals_an_uninterrupted_run(
    clf, tickets, tmp_path, monkeypatch, stop_after
):
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.engine.engine import Engine
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.jobs.job import run_job

    ref, out = tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    run(clf, tickets, ref, batch_tokens=512, max_batch=4)
    real = Engine.run

    def interrupted(self, *a, **k):
        for n, item in enumerate(real(self, *a, **k)):
            if n == stop_after:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(Engine, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(clf, tickets, out, batch_tokens=512, max_batch=4)
    monkeypatch.setattr(Engine, "run", real)
    rows = read_rows(str(tickets))[0]
    run_job(clf, rows, RunSpec(batch_tokens=512, max_batch=4), out, resume=True)
    assert out.read_bytes() == ref.read_bytes()


def test_repeated_cli_runs_on_a_loaded_machine_after_a_recalibration(
    tiny_model_dir, tickets, tmp_path
):
    """The same command twice, both cores busy, a fresh calibration of the cost model between
    the runs (it measures a loaded machine, so its constants move): one output."""
    env_cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        outs = []
        for n in range(2):
            out = tmp_path / f"o{n}.jsonl"
            cmd = [
                sys.executable,
                "-m",
                "mlxbatch",
                "classify",
                str(tickets),
                "--model",
                str(tiny_model_dir),
                "-o",
                str(out),
            ]
            done = subprocess.run(
                cmd, env=_env(env_cache), capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, done.stderr
            outs.append(out.read_bytes())
            if n == 1:
                break
            calib = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "mlxbatch",
                    "doctor",
                    "--calibrate",
                    "--model",
                    str(tiny_model_dir),
                    "--size",
                    "64",
                ],
                env=_env(env_cache),
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert calib.returncode == 0, calib.stderr
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert outs[0] == outs[1]
    assert len({json.dumps(json.loads(line)) for line in outs[0].splitlines()}) == 90


def _env(extra: dict) -> dict:
    import os

    return {**os.environ, **extra}
