"""Hostile evaluations: `eval` of predictions and scores that classify never writes, rounded or
out of the label set, and of rows that could not be scored."""

from __future__ import annotations

import json
import os

import pytest
from cli_run import invoke, one_line_error
from click.testing import CliRunner

from mlxbatch.bench.workload import generate, write_jsonl
from mlxbatch.cli import cli

GOLD = "".join(
    json.dumps({"id": f"r{i}", "text": f"ticket {i} about {w}", "g": g}) + "\n"
    for i, (w, g) in enumerate([("money", "a"), ("crash", "b")] * 3)
)


def _scored(tiny_model_dir, tmp_path):
    src, out = tmp_path / "gold.jsonl", tmp_path / "o.jsonl"
    src.write_text(GOLD)
    r = invoke(["classify", src, "--model", tiny_model_dir, "--labels", "a,b", "-o", out], tmp_path)
    assert r.exit_code == 0, r.output
    return src, out, [json.loads(x) for x in out.read_text().splitlines()]


def invoke_raising(*args, cwd=None):
    old = os.getcwd()
    if cwd:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)


def test_eval_reads_every_output_format_classify_writes(tiny_model_dir, tmp_path):
    """`eval` reads every output format `classify` writes (JSONL, CSV, TSV) alike, numeric ids
    included (a table writes them as text)."""
    import json

    src = tmp_path / "gold.jsonl"
    src.write_text(
        "".join(
            json.dumps({"n": i, "text": f"ticket {i} about {w}", "g": g}) + "\n"
            for i, (w, g) in enumerate(
                [("money", "a"), ("crash", "b"), ("login", "a"), ("refund", "b")] * 3
            )
        )
    )
    reports = {}
    for name in ("o.jsonl", "o.csv", "o.tsv", "o.csv.gz"):
        r = invoke(
            [
                "classify",
                src,
                "--model",
                tiny_model_dir,
                "--labels",
                "a,b",
                "--id-field",
                "n",
                "-o",
                tmp_path / name,
            ],
            tmp_path,
        )
        assert r.exit_code == 0, r.output
        r = invoke(
            [
                "eval",
                src,
                tmp_path / name,
                "--gold-field",
                "g",
                "--id-field",
                "n",
                "--json",
                tmp_path / f"{name}.json",
            ],
            tmp_path,
        )
        assert r.exit_code == 0, r.output
        reports[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert all(m == reports["o.jsonl"] for m in reports.values()), reports
    (tmp_path / "bad.csv").write_text("id,text\n1,hello\n")
    r = invoke(["eval", src, tmp_path / "bad.csv", "--gold-field", "g"], tmp_path)
    one_line_error(r, "bad.csv: not an output of mlxbatch classify")


def test_eval_refuses_scores_that_do_not_sum_to_one(tiny_model_dir, tmp_path):
    # a row's scores halved (a subset of the labels, a hand edit) were evaluated as they were
    src, out, rows = _scored(tiny_model_dir, tmp_path)
    rows[3]["scores"] = {k: v / 2 for k, v in rows[3]["scores"].items()}
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = invoke(["eval", src, out, "--gold-field", "g"], tmp_path)
    one_line_error(r, "o.jsonl: row 4: the scores sum to 0.5, not 1")


def test_eval_takes_scores_rounded_to_two_decimals(tiny_model_dir, tmp_path):
    src, out, rows = _scored(tiny_model_dir, tmp_path)
    for row in rows:
        a = round(row["scores"]["a"], 2)
        row["scores"] = {"a": a, "b": round(1 - a, 2)}
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = invoke(["eval", src, out, "--gold-field", "g"], tmp_path)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    ("scores", "refused"),
    [
        ({"a": 0.33, "b": 0.33, "c": 0.33}, False),
        ({f"l{i}": 0.14 for i in range(7)}, False),
        ({"a": 0.5, "b": 0.2, "c": 0.2}, True),
        ({"a": 0.6, "b": 0.6}, True),
    ],
)
def test_eval_takes_two_decimal_rounding_over_any_number_of_labels(scores, refused):
    # 3 x 0.33 (0.99) was refused by a flat tolerance of 0.01
    from types import SimpleNamespace

    from mlxbatch.cli.evaluate import _not_a_prediction

    row = SimpleNamespace(id=None, number=1)
    problem = _not_a_prediction({"label": next(iter(scores)), "scores": scores}, row)
    assert (problem is not None and "sum to" in problem) == refused, problem


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda r: r["scores"].pop("b"), "its scores name 'a', row 1's 'a', 'b'"),
        (
            lambda r: r.update(label="b" if r["scores"]["a"] > r["scores"]["b"] else "a"),
            "its label '",
        ),
        (lambda r: r.update(abstained=True), "it abstains, yet its label is"),
    ],
)
def test_eval_refuses_rows_classify_never_writes(edit, said, tiny_model_dir, tmp_path):
    # a row scoring other labels, labelled by a score not its top one, or abstaining with a
    # label, was evaluated (the label set dropped a label; correct by label, confident by
    # another's score)
    src, out, rows = _scored(tiny_model_dir, tmp_path)
    rows[2]["scores"] = {"a": 1.0, "b": 0.0} if said.startswith("its scores") else rows[2]["scores"]
    edit(rows[2])
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = invoke(["eval", src, out, "--gold-field", "g"], tmp_path)
    one_line_error(
        r,
        "o.jsonl: row 3: " + said,
        *([] if "scores" in said or "abstains" in said else ["is not its top score"]),
    )


def test_an_evaluation_names_the_rows_it_could_not_score(tiny_model_dir, tmp_path):
    src, preds = tmp_path / "t.jsonl", tmp_path / "p.jsonl"
    rows = generate(6, seed=2)
    rows[1]["text"] = rows[4]["text"] = "   "  # two bad rows: error rows under --on-error skip
    write_jsonl(rows, src)
    r = invoke_raising(
        "classify", src, "--model", tiny_model_dir, "-o", preds, "--on-error", "skip"
    )
    assert r.exit_code == 0
    r = invoke_raising("eval", src, preds, "--gold-field", "intent", "--json", tmp_path / "e.json")
    assert r.exit_code == 0
    assert "over 4 of 6 rows" in r.output and "error rows (not scored, not evaluated): 2 of 6" in (
        r.output
    )
    assert json.loads((tmp_path / "e.json").read_text())["error_rows"] == 2
