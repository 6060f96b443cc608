"""Hostile `tickets` runs: standard output, files another run reads, --force."""

from __future__ import annotations

import json
import os

from cli_run import invoke, one_line_error
from click.testing import CliRunner

from mlxbatch.bench.workload import generate, write_jsonl
from mlxbatch.cli import cli


def _rows(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(
            json.dumps({"text": f"ticket {i}", "gold": ["spam", "ham"][i % 2]}) + "\n"
            for i in range(6)
        )
    )
    return src


def invoke_raising(*args, cwd=None):
    old = os.getcwd()
    if cwd:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)


def test_tickets_dash_o_dash_is_standard_output(tmp_path):
    """`tickets N -o -` wrote a file named `-` (52 MB for 100,000) where classify reads `-o -`
    as standard output."""
    r = invoke(["tickets", "3", "-o", "-"], tmp_path)
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 3, r.output
    assert not (tmp_path / "-").exists()


def test_tickets_does_not_replace_a_file_another_run_reads(tmp_path):
    """`tickets 5 -o in.jsonl` replaced the input of a running classify (which then failed:
    "changed while the job read it"); classify's own -o refuses that file."""
    from mlxbatch.io.inputs import open_rows

    src = _rows(tmp_path)
    before = src.read_bytes()
    with open_rows(str(src)) as reading:  # another run, reading it as its input
        r = invoke(["tickets", "5", "-o", src], tmp_path)
        one_line_error(r, "is being read by another mlxbatch run")
        next(iter(reading))
    assert src.read_bytes() == before
    assert invoke(["tickets", "5", "-o", src], tmp_path).exit_code == 0  # once it is done
    assert len(src.read_text().splitlines()) == 5


def test_tickets_force_refuses_inputs_that_change_or_cannot_be_read_twice(tiny_model_dir, tmp_path):
    """tickets -o onto a journal; --force over a model directory holding other files; a file
    edited while a windowed job reads it; compressed Parquet; a pipe or FIFO as the input."""
    import gzip
    import threading

    from mlxbatch.api.classifier import Classifier
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.errors import InputError
    from mlxbatch.io.windows import JobInput
    from mlxbatch.jobs import job as job_module
    from mlxbatch.jobs.job import run_job

    journal = tmp_path / "k.jsonl.part"
    journal.write_bytes(b'{"mlxbatch_journal": 1, "fingerprint": "f"}\n')
    before = journal.read_bytes()
    r = invoke_raising("tickets", 3, "-o", journal)
    assert r.exit_code == 2 and "journal" in r.output and journal.read_bytes() == before

    model = tmp_path / "m"
    assert invoke_raising("init-random", "--preset", "tiny", model).exit_code == 0
    (model / "out.jsonl").write_text("keep")
    r = invoke_raising("init-random", "--preset", "tiny", "--force", model)
    assert r.exit_code == 2 and "out.jsonl" in r.output and (model / "out.jsonl").exists()

    src = tmp_path / "t.jsonl"
    write_jsonl(generate(30, seed=5), src)
    clf = Classifier.load(tiny_model_dir)
    real = job_module.plan_window
    calls = []

    def edit_after_the_first_window(*a, **k):
        calls.append(1)
        if len(calls) == 2:  # the file grows while the job reads it
            with open(src, "a") as f:
                f.write('{"id": "late", "text": "appended"}\n')
        return real(*a, **k)

    job_module.plan_window = edit_after_the_first_window
    try:
        out = tmp_path / "o.jsonl"
        try:
            run_job(clf, JobInput.of_file(str(src)), RunSpec(window=8), out, keep_results=False)
            raise AssertionError("a file that changed mid-job was classified")
        except InputError as e:
            assert "changed while the job read it" in str(e)
        assert not out.exists()
    finally:
        job_module.plan_window = real

    pq = tmp_path / "t.parquet.gz"
    pq.write_bytes(gzip.compress(b"PAR1" + b"\0" * 64))
    r = invoke_raising("classify", pq, "--model", tiny_model_dir, "--on-error", "skip")
    assert r.exit_code == 2 and "compressed Parquet" in r.output

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    write_jsonl(generate(30, seed=5), tmp_path / "again.jsonl")
    text = (tmp_path / "again.jsonl").read_bytes()
    writer = threading.Thread(target=lambda: fifo.write_bytes(text))
    writer.start()
    res = run_job(
        clf,
        JobInput.of_file(str(fifo)),
        RunSpec(window=7),
        tmp_path / "f.jsonl",
        keep_results=False,
    )
    writer.join(timeout=60)
    assert res.rows == 30 and res.errors == 0
