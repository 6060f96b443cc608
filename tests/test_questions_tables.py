"""A CSV/TSV output of several questions read back into the rows it was written from (eval
reads it); an interrupted CSV run resumed to the same bytes; a resume whose questions file
changed refused in one line naming the file and what changed, the journal untouched."""

from __future__ import annotations

import copy
import json

import pytest
from cli_run import invoke, one_line_error

from mlxbatch.api.classifier import Classifier
from mlxbatch.engine.questions import questions_from
from mlxbatch.io.rows import read_results
from mlxbatch.io.sinks import journal_path

QUESTIONS = {
    "system": "You triage support tickets.",
    "questions": [
        {"name": "intent", "ask": "Which team?", "labels": ["billing", "technical", "account"]},
        {"name": "urgency", "ask": "How urgent is it?", "labels": ["low", "high"]},
        {"name": "tags", "multi_label": {"refund": "money back", "login": "", "crash": ""}},
        {"name": "product", "ask": "Which product?", "labels": ["mobile app", "API"]},
    ],
}
TEXTS = ["I was charged twice.", "Why can't I log in?", "The app crashed!", "ok", "refund me"]


@pytest.fixture
def files(tmp_path):
    q = tmp_path / "q.json"
    q.write_text(json.dumps(QUESTIONS))
    src = tmp_path / "in.jsonl"
    rows = [
        {"id": i, "text": TEXTS[i % len(TEXTS)] + " y" * i, "intent": "billing", "tags": "refund"}
        for i in range(12)
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return q, src


def classify(tiny_model_dir, q, src, out, *args):
    r = invoke(["classify", src, "--model", tiny_model_dir, "--questions", q, "-o", out, *args])
    assert r.exit_code == 0, r.output
    return r


@pytest.mark.parametrize("suffix", ["csv", "tsv", "csv.gz"])
def test_a_table_of_answers_reads_back_as_the_jsonl_rows(tiny_model_dir, tmp_path, files, suffix):
    q, src = files
    jsonl, table = tmp_path / "out.jsonl", tmp_path / f"out.{suffix}"
    classify(tiny_model_dir, q, src, jsonl)
    tags = [json.loads(x)["answers"]["tags"]["scores"] for x in jsonl.read_text().splitlines()]
    threshold = str(min(max(s.values()) for s in tags) + 1e-6)  # a row without tags
    # --min-confidence 0.5: some answers abstain, written as an empty label
    args = ["--min-confidence", "0.5", "--tag-threshold", threshold]
    classify(tiny_model_dir, q, src, jsonl, *args)
    classify(tiny_model_dir, q, src, table, *args)
    want = [json.loads(line) for line in jsonl.read_text().splitlines()]
    for row in want:
        row["id"] = str(row["id"])  # a table's ids are its text
    got = read_results(table, questions_from(QUESTIONS))
    assert got == want
    said = [a for r in want for a in r["answers"].values()]
    assert any(a.get("abstained") for a in said) and any(a.get("label") for a in said)
    assert any(a.get("labels") for a in said) and any(a.get("labels") == [] for a in said)
    with pytest.raises(ValueError, match="header"):
        read_results(table)  # without its questions, a table of answers is not read
    other = copy.deepcopy(QUESTIONS)
    other["questions"].pop()
    with pytest.raises(ValueError, match="these questions"):
        read_results(table, questions_from(other))


def test_eval_reads_a_csv_output_as_it_reads_the_jsonl(tiny_model_dir, tmp_path, files):
    q, src = files
    reports = []
    for name in ("out.jsonl", "out.csv"):
        out = tmp_path / name
        classify(tiny_model_dir, q, src, out)
        report = tmp_path / f"{name}.report.json"
        r = invoke(["eval", src, out, "--questions", q, "--json", report])
        assert r.exit_code == 0, r.output
        reports.append(json.loads(report.read_text()))
    assert reports[0] == reports[1] and "intent" in reports[0]


def interrupted(tiny_model_dir, q, src, out, monkeypatch):
    """A run of `out` stopped after its third batch, its journal left behind."""
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.jobs.job import run_job
    from mlxbatch.runtime import testhold

    clf = Classifier.load(tiny_model_dir, questions=q)
    rows, _ = read_rows(str(src))

    def stop(n: int) -> None:
        if n == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(testhold, "after_batch", stop)
    with pytest.raises(KeyboardInterrupt):
        run_job(clf, rows, RunSpec(max_batch=2), out, keep_results=False)
    monkeypatch.undo()
    assert journal_path(out).exists() and not out.exists()


def test_an_interrupted_csv_run_resumes_to_the_same_bytes(
    tiny_model_dir, tmp_path, files, monkeypatch
):
    q, src = files
    ref, out = tmp_path / "ref.csv", tmp_path / "out.csv"
    classify(tiny_model_dir, q, src, ref, "--max-batch", "2")
    interrupted(tiny_model_dir, q, src, out, monkeypatch)
    r = classify(tiny_model_dir, q, src, out, "--max-batch", "2", "--resume", "--verify")
    assert out.read_bytes() == ref.read_bytes()
    assert "resum" in r.output.lower() and "100.00% label agreement" in r.output


@pytest.mark.parametrize(
    "change, words",
    [
        (
            lambda d: d["questions"].append({"name": "x", "ask": "?", "labels": ["a", "b"]}),
            ["question 'x' added"],
        ),
        (lambda d: d["questions"].pop(1), ["question 'urgency' removed"]),
        (
            lambda d: d["questions"][0].update(ask="Which department?"),
            ["question 'intent': ask changed"],
        ),
        (
            lambda d: d["questions"][1].update(labels=["low", "high", "now"]),
            ["question 'urgency': labels changed"],
        ),
        (
            lambda d: d["questions"][0].update(prior={"billing": 0.5}),
            ["question 'intent': prior changed"],
        ),
        (lambda d: d.update(system="Be terse."), ["system prompt changed"]),
    ],
)
def test_a_resume_whose_questions_changed_says_what_changed(
    tiny_model_dir, tmp_path, files, monkeypatch, change, words
):
    q, src = files
    out = tmp_path / "out.csv"
    interrupted(tiny_model_dir, q, src, out, monkeypatch)
    journal = journal_path(out).read_bytes()
    edited = copy.deepcopy(QUESTIONS)
    change(edited)
    q.write_text(json.dumps(edited))
    r = invoke(
        ["classify", src, "--model", tiny_model_dir, "--questions", q, "-o", out, "--resume"]
    )
    one_line_error(r, str(q), "questions changed", *words)
    assert journal_path(out).read_bytes() == journal and not out.exists()


def test_a_resume_with_another_tag_threshold_names_it(tiny_model_dir, tmp_path, files, monkeypatch):
    q, src = files
    out = tmp_path / "out.csv"
    interrupted(tiny_model_dir, q, src, out, monkeypatch)
    journal = journal_path(out).read_bytes()
    args = ["classify", src, "--model", tiny_model_dir, "--questions", q, "-o", out, "--resume"]
    r = invoke([*args, "--tag-threshold", "0.9"])
    one_line_error(r, "--tag-threshold")
    assert journal_path(out).read_bytes() == journal and not out.exists()
