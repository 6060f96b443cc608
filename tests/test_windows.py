"""Jobs in windows: the file is read, planned and written a window of rows at a time, and rows
whose prompts are identical are scored once within a window. The output must not depend on
the window size, on where a window boundary falls, or on where a resume starts."""

from __future__ import annotations

import gzip
import json

import pytest

from mlxbatch.bench.workload import generate, write_jsonl


@pytest.fixture(scope="module")
def clf(tiny_model_dir):
    from mlxbatch.api.classifier import Classifier

    return Classifier.load(tiny_model_dir)


@pytest.fixture(scope="module")
def tickets(tmp_path_factory):
    """40 tickets; rows 5, 9 and 31 repeat row 4's text (9 inside its window of 8, 31 far
    away), row 16 (a window boundary at 8) is empty, so it is a bad row."""
    rows = generate(40, seed=3)
    for k in (5, 9, 31):
        rows[k] = dict(rows[k], text=rows[4]["text"])
    rows[16] = dict(rows[16], text="   ")
    path = tmp_path_factory.mktemp("win") / "t.jsonl"
    write_jsonl(rows, path)
    return path


def job(clf, source, out, resume=False, **settings):
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.windows import JobInput
    from mlxbatch.jobs.job import run_job

    spec = RunSpec(on_error="skip", **settings)
    return run_job(clf, JobInput.of_file(str(source)), spec, out, resume=resume, keep_results=False)


def test_the_window_size_changes_no_byte(clf, tickets, tmp_path):
    ref = tmp_path / "whole.jsonl"
    whole = job(clf, tickets, ref, window=1000)
    assert whole.windows == 1 and whole.duplicates == 3 and whole.errors == 1
    for size in (1, 7, 8, 13):
        out = tmp_path / f"w{size}.jsonl"
        res = job(clf, tickets, out, window=size)
        assert res.windows == -(-40 // size)
        assert out.read_bytes() == ref.read_bytes(), size
    rows = [json.loads(x) for x in ref.read_text().splitlines()]
    assert "error" in rows[16] and rows[16]["id"] is not None
    for k in (5, 9, 31):  # a repeat gets the scores of the row it repeats, its own id
        assert rows[k]["scores"] == rows[4]["scores"] and rows[k]["id"] != rows[4]["id"]


def test_a_window_of_long_texts_ends_at_its_characters_and_changes_no_byte(
    clf, tickets, tmp_path, monkeypatch
):
    """A window ends at WINDOW_CHARS characters of text as well as at its rows: 16,384 rows of
    27,000 characters were held at once (3.6 GB for a 54 MB input)."""
    from mlxbatch.api import spec

    ref = tmp_path / "whole.jsonl"
    assert job(clf, tickets, ref, window=1000).windows == 1
    sizes = [len(json.loads(x)["text"]) for x in tickets.read_text().splitlines()]
    total, longest = sum(sizes), max(sizes)
    for chars in (1, 300, 1000):
        monkeypatch.setattr(spec, "WINDOW_CHARS", chars)  # what a fresh run's settings take
        out = tmp_path / f"c{chars}.jsonl"
        res = job(clf, tickets, out, window=1000)
        # each window but the last holds from `chars` to `chars` + one row's characters
        assert total // (chars + longest) <= res.windows <= min(40, total // chars + 1), chars
        assert res.windows > 1
        assert out.read_bytes() == ref.read_bytes(), chars


def test_the_character_bound_is_recorded_and_a_journal_without_it_resumes_without_it(clf):
    """A resume cuts the windows its journal's run cut: the bound is in the recorded settings
    (and their shape); a journal written before it had none, and its shape stays as it was."""
    from mlxbatch.api.spec import WINDOW_CHARS, RunSpec

    fresh = clf.settings(RunSpec())
    assert fresh.window_chars == WINDOW_CHARS and fresh.record()["window_chars"] == WINDOW_CHARS
    assert clf.settings(RunSpec(), fresh.record()) == fresh
    old = {k: v for k, v in fresh.record().items() if k != "window_chars"}
    before = clf.settings(RunSpec(), old)
    assert before.window_chars is None and before.resume_record() == fresh.resume_record()[:-1]


def test_the_tokenizer_encodes_long_texts_in_runs_bounded_by_characters(clf, monkeypatch):
    from mlxbatch.model import tokenizer

    texts = ["short", "a much longer text " * 20, "x", "mid length text " * 5, "y"] * 3
    monkeypatch.setattr(tokenizer, "BATCH_CHARS", 100)
    runs = list(tokenizer._chunks(texts))
    assert [t for run in runs for t in run] == texts
    assert all(len(run) == 1 or sum(map(len, run[:-1])) < 100 for run in runs)
    assert len(runs) > 3
    tok, system = clf.lm.tokenizer, clf.system_prompt
    assert tok.prompts(system, texts) == [tok.prompt(system, t) for t in texts]


def test_duplicates_are_scored_once_within_a_window(clf, tickets, tmp_path):
    res = job(clf, tickets, tmp_path / "o.jsonl", window=8)
    assert res.duplicates == 1  # row 5 (window 0); rows 9 and 31 open windows of their own
    assert res.scored == 39 and res.rows == 40
    # the summary: the share, and the time saved at the pace of the items scored
    assert "1 duplicates scored once (2.5% of the rows, ~" in res.summary()
    assert f"~{res.seconds / 38:.1f} s saved at this job's pace" in res.summary()


def interrupted_at_third_window(clf, tickets, out, monkeypatch) -> None:
    """A job in windows of 8 stopped (Ctrl-C) as it plans its third window: two windows are
    journaled whole."""
    from mlxbatch.jobs import job as job_module

    real, calls = job_module.plan_window, []

    def stop_at_third_window(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(job_module, "plan_window", stop_at_third_window)
    with pytest.raises(KeyboardInterrupt):
        job(clf, tickets, out, window=8)
    monkeypatch.setattr(job_module, "plan_window", real)


def test_a_resume_at_a_window_boundary_equals_an_uninterrupted_run(
    clf, tickets, tmp_path, monkeypatch
):
    ref, out = tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    job(clf, tickets, ref, window=8)
    interrupted_at_third_window(clf, tickets, out, monkeypatch)
    journal = [json.loads(x) for x in (tmp_path / "out.jsonl.part").read_text().splitlines()]
    assert {e["row"] for e in journal[1:]} == set(range(16))  # two whole windows
    job(clf, tickets, out, resume=True, window=8)
    assert out.read_bytes() == ref.read_bytes()


def test_a_resumed_job_verifies_the_rows_its_journal_held(clf, tickets, tmp_path, monkeypatch):
    """--verify after --resume checks every item: those this run scored, and those the
    interrupted run journaled (read back from the journal, re-planned in a second pass)."""
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.windows import JobInput
    from mlxbatch.jobs import job as job_module

    out = tmp_path / "out.jsonl"
    interrupted_at_third_window(clf, tickets, out, monkeypatch)
    spec = RunSpec(on_error="skip", window=8)
    res = job_module.run_job(
        clf, JobInput.of_file(str(tickets)), spec, out, resume=True, verify=True, keep_results=False
    )
    assert res.resumed == 16 and res.verify["passed"]
    assert res.verify["items"] == res.scored - res.duplicates == 38  # every prompt scored


def test_a_resumed_job_returns_every_row_for_the_evaluation(clf, tickets, tmp_path, monkeypatch):
    """The result rows a job returns (classify's --gold-field evaluates them) include the rows
    the interrupted run journaled, in input order: not only the resumed run's own."""
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.windows import JobInput
    from mlxbatch.jobs.job import run_job

    ref, out = tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    job(clf, tickets, ref, window=8)
    interrupted_at_third_window(clf, tickets, out, monkeypatch)
    res = run_job(
        clf, JobInput.of_file(str(tickets)), RunSpec(on_error="skip", window=8), out, resume=True
    )
    assert res.resumed == 16
    assert res.results == [json.loads(x) for x in ref.read_text().splitlines()]


def test_a_batch_whose_copy_was_cut_off_is_scored_again_and_verified_once(
    clf, tickets, tmp_path, monkeypatch
):
    """A journal write cut short after a scored row but before its copy (row 5 repeats row 4):
    the resume scores that batch again, and --verify counts each item once."""
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.windows import JobInput
    from mlxbatch.jobs import job as job_module

    ref, out = tmp_path / "ref.jsonl", tmp_path / "torn.jsonl"
    job(clf, tickets, ref, window=8)
    lines = ref.read_text().splitlines()
    assert json.loads(lines[5])["scores"] == json.loads(lines[4])["scores"]
    spec = RunSpec(on_error="skip", window=8)

    def stop(*a, **k):
        raise KeyboardInterrupt

    real = job_module.execute
    monkeypatch.setattr(job_module, "execute", stop)  # a journal with its header, no batch
    with pytest.raises(KeyboardInterrupt):
        job_module.run_job(clf, JobInput.of_file(str(tickets)), spec, out, keep_results=False)
    monkeypatch.setattr(job_module, "execute", real)
    journal = tmp_path / "torn.jsonl.part"
    header = journal.read_text().splitlines()[0]
    entries = [json.dumps({"row": i, "result": json.loads(lines[i])}) for i in range(16) if i != 5]
    journal.write_text("\n".join([header, *entries]) + "\n")
    res = job_module.run_job(
        clf, JobInput.of_file(str(tickets)), spec, out, resume=True, verify=True, keep_results=False
    )
    assert out.read_bytes() == ref.read_bytes()
    assert res.verify["items"] == 38 and res.verify["passed"]


def test_duplicate_ids_found_by_the_scan_name_the_same_rows_in_every_window(clf, tmp_path):
    """The scan holds the table of ids; the windows' pass takes the rows it found (and holds no
    table), so an id repeated windows away is the same error row whatever the window size."""
    from mlxbatch.io.inputs import open_rows

    rows = [dict(r, id=f"r{i}") for i, r in enumerate(generate(30, seed=4))]
    rows[12]["id"] = rows[2]["id"]  # window 3 of 5 repeats an id of window 1
    rows[29]["id"] = 7  # a number beside strings: no clash
    src = tmp_path / "ids.jsonl"
    write_jsonl(rows, src)
    whole, small = tmp_path / "whole.jsonl", tmp_path / "small.jsonl"
    assert job(clf, src, whole, window=1000).errors == 1
    assert job(clf, src, small, window=5).errors == 1
    assert small.read_bytes() == whole.read_bytes()
    out = [json.loads(x) for x in whole.read_text().splitlines()]
    assert "duplicate id 'r2' (first at 3)" in out[12]["error"] and "label" in out[2]
    first = open_rows(str(src))
    assert [r.error for r in first if r.error] == [out[12]["error"]]
    assert list(first.duplicates.rows) == [13]  # row numbers: 1-based
    again = open_rows(str(src), duplicates=first.duplicates)
    assert [r.error for r in again if r.error] == [out[12]["error"]] and again._seen is None


def test_a_job_keeps_one_table_of_ids_the_scans(clf, tickets, tmp_path, monkeypatch):
    """However many windows, the ids' digests are held by the scan only."""
    from mlxbatch.io import inputs

    made = []

    class Counted(inputs.IdTable):
        def __init__(self, *a, **k):
            made.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(inputs, "IdTable", Counted)
    assert job(clf, tickets, tmp_path / "o.jsonl", window=8).windows == 5
    assert len(made) == 1


def test_the_journal_holds_offsets_not_rows(clf, tickets, tmp_path):
    from mlxbatch.io.rowindex import RowIndex
    from mlxbatch.io.sinks import Journal

    out = tmp_path / "o.jsonl"
    sink = Journal(out, {"fingerprint": "x"}, resume=False)
    sink.append([(3, {"id": 3, "label": "a", "scores": {"a": 0.75, "b": 0.25}})])
    sink.append([(0, {"id": 0, "error": "empty text"})])
    assert isinstance(sink.done, RowIndex) and len(sink.done) == 2
    assert 3 in sink.done and 1 not in sink.done
    assert sink.done[3]["scores"] == {"a": 0.75, "b": 0.25}
    sink.close()


def test_compressed_and_parquet_inputs_give_the_same_file(clf, tickets, tmp_path):
    ref = tmp_path / "ref.jsonl"
    job(clf, tickets, ref, window=8)
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(tickets.read_bytes()))
    out = tmp_path / "gz.jsonl"
    job(clf, packed, out, window=8)
    assert out.read_bytes() == ref.read_bytes()
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [json.loads(x) for x in tickets.read_text().splitlines()]
    table = pa.table({k: [r[k] for r in rows] for k in ("id", "text")})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=7)
    out = tmp_path / "pq.jsonl"
    job(clf, tmp_path / "t.parquet", out, window=8)
    assert out.read_bytes() == ref.read_bytes()


def test_a_bad_file_is_refused_before_anything_is_computed(clf, tickets, tmp_path):
    """--on-error fail: the scan finds the bad row in window 3 before window 1 is scored."""
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.errors import JobError
    from mlxbatch.io.windows import JobInput
    from mlxbatch.jobs.job import run_job

    out = tmp_path / "o.jsonl"
    with pytest.raises(JobError, match=r"1 of 40 rows are invalid \(first: line 17: empty"):
        run_job(clf, JobInput.of_file(str(tickets)), RunSpec(window=8), out)
    assert not out.exists() and not (tmp_path / "o.jsonl.part").exists()
