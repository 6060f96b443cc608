"""Interrupted runs: SIGKILL at random moments, Ctrl-C, torn lines, foreign journals."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from mlxbatch.bench.workload import generate, write_jsonl
from mlxbatch.errors import ResumeError
from mlxbatch.io.sinks import Journal, journal_path
from mlxbatch.runtime.testhold import VARIABLE


@pytest.fixture(scope="module")
def job(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    src = root / "tickets.jsonl"
    write_jsonl(generate(300, seed=9), src)  # ~150 batches of 2
    return root, src


def command(model, src, out, *extra):
    return [
        sys.executable,
        "-m",
        "mlxbatch",
        "classify",
        str(src),
        "--model",
        str(model),
        "-o",
        str(out),
        "--max-batch",
        "2",
        "--batch-tokens",
        "1024",
        *extra,
    ]


def journal_rows(out) -> int:
    p = journal_path(out)
    return max(0, len(p.read_bytes().split(b"\n")) - 2) if p.exists() else 0


def held_after(batches: int) -> dict:
    """An environment in which a run stops for good after `batches` journaled batches: it
    cannot finish before the test interrupts it, however fast or slow the machine."""
    return {**os.environ, VARIABLE: str(batches)}


def wait_until_held(proc: subprocess.Popen) -> str:
    """What the run wrote to stderr up to its hold point; fails if it ended before."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if f"({VARIABLE})" in line:
            return "".join(seen)
    raise AssertionError(f"the run ended (exit {proc.wait()}) before its hold point: {seen}")


def test_killed_ten_times_then_resumed_matches_an_uninterrupted_run(tiny_model_dir, job):
    root, src = job
    reference = root / "reference.jsonl"
    subprocess.run(command(tiny_model_dir, src, reference), check=True, capture_output=True)
    out = root / "killed.jsonl"
    rng = random.Random(1234)
    for kill in range(10):
        # let each run journal a random number of new rows, then SIGKILL it at a random instant;
        # it holds after `hold` batches (>= `hold` rows), so it is still there to be killed, and
        # ten holds of at most 12 batches leave at least 30 of the ~150 batches undone
        hold = rng.randint(1, 12)
        target = journal_rows(out) + rng.randint(1, hold)
        err = root / f"killed-{kill}.err"
        with open(err, "wb") as f:
            proc = subprocess.Popen(
                command(tiny_model_dir, src, out, *(["--resume"] if kill else [])),
                stdout=subprocess.DEVNULL,
                stderr=f,
                env=held_after(hold),
            )
        while (
            proc.poll() is None and journal_rows(out) < target and VARIABLE not in err.read_text()
        ):
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.03))
        if proc.poll() is not None or journal_rows(out) < target:
            proc.kill()
            raise AssertionError(
                f"run {kill} ended (exit {proc.wait()}) or held with fewer than "
                f"{target} rows journaled: {err.read_text()[-2000:]}"
            )
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not out.exists()
    assert 0 < journal_rows(out) < 300
    final = subprocess.run(command(tiny_model_dir, src, out, "--resume"), capture_output=True)
    assert final.returncode == 0, final.stderr.decode()[-2000:]
    assert out.read_bytes() == reference.read_bytes()
    assert not journal_path(out).exists()


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tiny_model_dir, job):
    root, src = job
    out = root / "interrupted.jsonl"
    # SIGINT at its default in the child: a shell starting this suite in the background
    # (`pytest &` without job control) leaves it ignored, and Python then never raises
    # KeyboardInterrupt (the run would sleep at its hold point until the timeout)
    proc = subprocess.Popen(
        command(tiny_model_dir, src, out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=held_after(2),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    err = wait_until_held(proc)  # two batches are journaled and the run cannot finish
    assert journal_rows(out) >= 2
    proc.send_signal(signal.SIGINT)
    err += proc.communicate(timeout=300)[1]
    assert proc.returncode == 130
    assert "--resume" in err and "Traceback" not in err
    done = subprocess.run(
        command(tiny_model_dir, src, out, "--resume"), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert len(out.read_text().splitlines()) == 300


def test_torn_last_line_is_dropped_and_redone(tmp_path):
    out = tmp_path / "o.jsonl"
    j = Journal(out, {"fingerprint": "f"}, resume=False)
    row = lambda i: {"id": i, "label": "a", "scores": {"a": 0.75, "b": 0.25}}  # noqa: E731
    j.append([(0, row(0)), (1, row(1))])
    j.close()
    with open(journal_path(out), "a") as f:
        f.write('{"row": 2, "result": {"id"')  # a write cut short by a crash
    j = Journal(out, {"fingerprint": "f"}, resume=True)
    assert sorted(j.done) == [0, 1]
    j.append([(2, row(2))])
    j.finish(3, ("a", "b"))
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == [0, 1, 2]


def test_journal_of_another_run_is_refused(tiny_model_dir, job, tmp_path):
    _, src = job
    out = tmp_path / "o.jsonl"
    Journal(out, {"fingerprint": "something else"}, resume=False).close()
    r = subprocess.run(
        command(tiny_model_dir, src, out, "--resume"), capture_output=True, text=True
    )
    assert r.returncode == 2 and "different input" in r.stderr
    r = subprocess.run(command(tiny_model_dir, src, out), capture_output=True, text=True)
    assert r.returncode == 2 and "add --resume" in r.stderr
    with pytest.raises(ResumeError):
        Journal(out, {"fingerprint": "x"}, resume=False)
    assert os.path.exists(journal_path(out))


def test_a_resume_with_less_free_memory_keeps_the_first_runs_item_limit(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Under --too-long error (--on-error fail), a resume on a machine with less free memory
    checks each row against the limit the first run recorded, not a fresh one: every row the
    first run accepted is accepted again, and the file equals an uninterrupted run's."""
    import sys as system

    from mlxbatch.api.classifier import Classifier
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.jobs.job import run_job
    from mlxbatch.runtime import testhold

    src, ref, out = tmp_path / "t.jsonl", tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    write_jsonl(generate(60, seed=4, mix="heavy-tail"), src)
    clf = Classifier.load(tiny_model_dir)
    rows, _ = read_rows(str(src))
    spec = RunSpec(max_batch=2)
    run_job(clf, rows, spec, ref, keep_results=False)

    def stop(n: int) -> None:
        if n == 3:
            raise KeyboardInterrupt

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(testhold, "after_batch", stop)
        run_job(clf, rows, spec, out, keep_results=False)
    # now the free memory holds one item of 8 tokens fewer than the longest row feeds
    longest = max(len(clf.engine.fed(clf.engine.prompt(r.text))) for r in rows)
    fp = clf.footprint
    less = fp.weight_bytes + fp.batch_cost(longest - 8, 1, longest - 8).total
    for name, module in list(system.modules.items()):
        if name.startswith("mlxbatch") and hasattr(module, "available_bytes"):
            monkeypatch.setattr(module, "available_bytes", lambda: less)
    fresh = Classifier.load(tiny_model_dir)  # a new process: its own limit, measured now
    assert fresh.settings(spec).limit.tokens < longest  # a fresh run would refuse the longest
    run_job(fresh, rows, spec, out, resume=True, keep_results=False)
    assert out.read_bytes() == ref.read_bytes()


def test_a_resumes_rate_counts_only_the_rows_it_scored(tiny_model_dir, tmp_path, monkeypatch):
    """A newcomer found: after --resume the summary's items/s divided every row of the job, the
    journal's too, by the time of the rows the resume scored."""
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.jobs.job import run_job
    from mlxbatch.runtime import testhold

    src, out = tmp_path / "t.jsonl", tmp_path / "out.jsonl"
    tickets = generate(40, seed=6)
    for copy, first in zip(tickets[-4:], tickets):  # 4 duplicates, scored once
        copy["text"] = first["text"]
    write_jsonl(tickets, src)
    clf = Classifier.load(tiny_model_dir)
    rows, _ = read_rows(str(src))
    spec = RunSpec(max_batch=2, batch_tokens=1024)

    def stop(n: int) -> None:
        if n == 5:
            raise KeyboardInterrupt

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(testhold, "after_batch", stop)
        run_job(clf, rows, spec, out, keep_results=False)
    journaled = journal_rows(out)
    assert 0 < journaled < 40
    result = run_job(clf, rows, spec, out, resume=True, keep_results=False)
    assert result.resumed == journaled and result.scored == 40
    assert result.computed == 40 - journaled
    rate = f"{(40 - journaled) / result.seconds:.2f} items/s"
    assert rate in result.summary(), result.summary()
    assert result.duplicates == 4 and 0 <= result.computed_duplicates <= 4
    fresh = run_job(clf, rows, spec, tmp_path / "fresh.jsonl", keep_results=False)
    assert fresh.computed == fresh.scored == 40 and fresh.resumed == 0
    assert fresh.computed_duplicates == fresh.duplicates == 4


def test_a_resumes_summary_figures_are_this_runs():
    """The rate and the time the duplicates saved are this run's: 290 of 300 rows read back
    from the journal, 10 scored in 1 s, none of them a duplicate (the 30 were journaled)."""
    from mlxbatch.jobs.result import JobResult

    result = JobResult(
        rows=300,
        scored=300,
        errors=0,
        seconds=1.0,
        padding_overhead=0.0,
        batch_tokens=1024,
        peak_memory=0,
        memory_bound=0,
        duplicates=30,
        resumed=290,
        computed=10,
        computed_duplicates=0,
    )
    line = result.summary()
    assert (
        "10.00 items/s" in line and "30 duplicates scored once (10.0% of the rows, ~0.0 s" in line
    )
    again = JobResult(**{**result.__dict__, "computed_duplicates": 5})
    assert "~1.0 s saved" in again.summary()  # 5 copies at the pace of the 5 items computed
