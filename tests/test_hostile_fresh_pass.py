"""What a fresh adversarial pass (by someone who had not seen the hostile table) found, each
case with its siblings: files a report or a --force replaced, a lock two names of one output
did not share, an evaluation that hid its error rows."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

from mlxbatch.bench.workload import generate, write_jsonl
from mlxbatch.cli import cli


def invoke(*args, cwd=None):
    old = os.getcwd()
    if cwd:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)


def test_a_report_never_replaces_a_file_that_is_not_a_report(tiny_model_dir, tmp_path):
    """eval --plot/--json through a link onto model weights, or onto any file of another kind."""
    src, preds = tmp_path / "t.jsonl", tmp_path / "p.jsonl"
    write_jsonl(generate(6, seed=1), src)
    assert invoke("classify", src, "--model", tiny_model_dir, "-o", preds).exit_code == 0
    weights = tiny_model_dir / "model.safetensors"
    before = weights.read_bytes()
    (tmp_path / "pic.png").symlink_to(weights)
    (tmp_path / "notes.json").write_text("my notes, not JSON\n")
    for option, path in (("--plot", "pic.png"), ("--json", "notes.json")):
        r = invoke("eval", src, preds, "--gold-field", "intent", option, tmp_path / path)
        assert r.exit_code == 2 and "is not a" in r.output and "will not replace" in r.output
    assert weights.read_bytes() == before
    assert (tmp_path / "notes.json").read_text() == "my notes, not JSON\n"
    ok = invoke("eval", src, preds, "--gold-field", "intent", "--json", tmp_path / "r.json")
    again = invoke("eval", src, preds, "--gold-field", "intent", "--json", tmp_path / "r.json")
    assert ok.exit_code == again.exit_code == 0  # its own report is replaced


def test_force_replaces_only_a_model_directory_and_never_the_source(tiny_model_dir, tmp_path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "sub" / "thesis.txt").write_text("years of work")
    r = invoke("init-random", "--preset", "tiny", "--force", docs)
    assert r.exit_code == 2 and "not a model" in r.output
    assert (docs / "sub" / "thesis.txt").read_text() == "years of work"
    box = tmp_path / "box"
    (box / "src").mkdir(parents=True)
    for f in tiny_model_dir.iterdir():
        if f.is_file():
            (box / "src" / f.name).write_bytes(f.read_bytes())
    (box / "notes.txt").write_text("keep")
    for out in (box, box / "src" / "inner"):  # a directory holding the source, or inside it
        r = invoke("convert", box / "src", out, "--force")
        assert r.exit_code == 2 and "source checkpoint" in r.output, r.output
    assert (box / "notes.txt").exists() and (box / "src" / "config.json").exists()
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    r = invoke("init-random", "--preset", "tiny", "--force", tmp_path / "link")
    assert r.exit_code == 2 and "is a link" in r.output and (tmp_path / "link").is_symlink()
    model = tmp_path / "m"
    assert invoke("init-random", "--preset", "tiny", model).exit_code == 0
    assert invoke("init-random", "--preset", "tiny", "--force", model).exit_code == 0


def test_two_names_of_one_output_share_one_journal_and_its_lock(tmp_path):
    from mlxbatch.errors import UsageError
    from mlxbatch.io.sinks import Journal, journal_path

    out, alias = tmp_path / "out.jsonl", tmp_path / "alias.jsonl"
    out.write_text("")
    alias.symlink_to(out)
    assert journal_path(alias) == journal_path(out)
    first = Journal(out, {"fingerprint": "f"}, resume=False)
    try:
        try:
            Journal(alias, {"fingerprint": "f"}, resume=False)
            raise AssertionError("a second run through a link was let in")
        except UsageError as e:  # another process is told its pid; this one, the journal
            assert "another run is writing" in str(e) or "holds an interrupted run" in str(e)
    finally:
        first.close()


def test_an_evaluation_names_the_rows_it_could_not_score(tiny_model_dir, tmp_path):
    src, preds = tmp_path / "t.jsonl", tmp_path / "p.jsonl"
    rows = generate(6, seed=2)
    rows[1]["text"] = rows[4]["text"] = "   "  # two bad rows: error rows under --on-error skip
    write_jsonl(rows, src)
    r = invoke("classify", src, "--model", tiny_model_dir, "-o", preds, "--on-error", "skip")
    assert r.exit_code == 0
    r = invoke("eval", src, preds, "--gold-field", "intent", "--json", tmp_path / "e.json")
    assert r.exit_code == 0
    assert "over 4 of 6 rows" in r.output and "error rows (not scored, not evaluated): 2 of 6" in (
        r.output
    )
    assert json.loads((tmp_path / "e.json").read_text())["error_rows"] == 2


def test_a_second_fresh_pass_tickets_force_inputs_that_change_or_cannot_be_read_twice(
    tiny_model_dir, tmp_path
):  # fmt: skip
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
    r = invoke("tickets", 3, "-o", journal)
    assert r.exit_code == 2 and "journal" in r.output and journal.read_bytes() == before

    model = tmp_path / "m"
    assert invoke("init-random", "--preset", "tiny", model).exit_code == 0
    (model / "out.jsonl").write_text("keep")
    r = invoke("init-random", "--preset", "tiny", "--force", model)
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
    r = invoke("classify", pq, "--model", tiny_model_dir, "--on-error", "skip")
    assert r.exit_code == 2 and "compressed Parquet" in r.output

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    write_jsonl(generate(30, seed=5), tmp_path / "again.jsonl")
    text = (tmp_path / "again.jsonl").read_bytes()
    writer = threading.Thread(target=lambda: fifo.write_bytes(text))
    writer.start()
    res = run_job(clf, JobInput.of_file(str(fifo)), RunSpec(window=7), tmp_path / "f.jsonl",
                  keep_results=False)  # fmt: skip
    writer.join(timeout=60)
    assert res.rows == 30 and res.errors == 0
