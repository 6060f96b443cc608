"""Round six: the lows the last passes left open (standard input read by two options, a label
holding `=` given a prior, an abstention forged in a journal), each with the case that found
it."""

from __future__ import annotations

import json

import pytest
from cli_run import invoke, one_line_error

from mlxbatch.engine.adjust import parse_prior
from mlxbatch.io.sinks import journal_path
from mlxbatch.runtime import testhold

GOOD = "".join(f'{{"id": "r{i}", "text": "ticket number {i} about billing"}}\n' for i in range(6))


@pytest.mark.parametrize("option", ["--examples", "--labels-file", "--system-prompt-file"])
def test_standard_input_read_by_two_options_is_refused(option, tiny_model_dir, tmp_path):
    # `--examples -` took all of standard input and INPUT `-` then said "empty input (no rows)"
    r = invoke(["classify", "-", "--model", tiny_model_dir, option, "-"], tmp_path, input=GOOD)
    one_line_error(r, "INPUT and", option, "standard input", alone=True)


def test_a_label_holding_an_equals_sign_takes_a_prior():
    # "a=b=0.3" was split at the first "=": label "a", weight "b=0.3", "not a number"
    assert parse_prior("a=b=0.3,c=0.7", ("a=b", "c")) == pytest.approx((0.3, 0.7))
    assert parse_prior({"a=b": 1, "c": 3}, ("a=b", "c")) == pytest.approx((0.25, 0.75))
    with pytest.raises(ValueError, match="'x' is not a number"):
        parse_prior("a=b=x", ("a=b", "c"))


def _interrupted(tiny_model_dir, tmp_path, monkeypatch, *extra):
    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    src.write_text(GOOD)

    def stop(done):
        raise KeyboardInterrupt

    monkeypatch.setattr(testhold, "after_batch", stop)
    args = ["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", "2", *extra]
    assert invoke(args, tmp_path).exit_code == 130
    monkeypatch.undo()
    return args


def _edit_rows(out, edit):
    lines = journal_path(out).read_text().splitlines()
    rows = [json.loads(x) for x in lines[1:]]
    for row in rows:
        edit(row["result"])
    journal_path(out).write_text("\n".join([lines[0], *map(json.dumps, rows)]) + "\n")
    return journal_path(out).read_bytes()


def _abstain(result):
    result["label"], result["abstained"] = None, True


def _label(result):
    scores = result["scores"]
    result.pop("abstained", None)
    result["label"] = max(scores, key=scores.get)


@pytest.mark.parametrize("floor,edit,words", [
    (None, _abstain, "abstains where this run's --min-confidence (none) does not"),
    ("0.99", _label, "has a label where this run's --min-confidence 0.99 abstains"),
])  # fmt: skip
def test_an_abstention_forged_in_a_journal_is_refused(floor, edit, words, tiny_model_dir,
                                                      tmp_path, monkeypatch):  # fmt: skip
    # a run without --min-confidence resumed rows edited to abstain, and wrote them as its own
    extra = ["--min-confidence", floor] if floor else []
    args = _interrupted(tiny_model_dir, tmp_path, monkeypatch, *extra)
    out = tmp_path / "o.jsonl"
    before = _edit_rows(out, edit)
    r = invoke([*args, "--resume"], tmp_path)
    one_line_error(r, "line 2", words, alone=True)
    assert journal_path(out).read_bytes() == before and not out.exists()


@pytest.mark.parametrize("floor", [None, "0.99"])
def test_a_journal_with_the_run_s_own_abstentions_resumes(floor, tiny_model_dir, tmp_path,
                                                          monkeypatch):  # fmt: skip
    extra = ["--min-confidence", floor] if floor else []
    args = _interrupted(tiny_model_dir, tmp_path, monkeypatch, *extra)
    r = invoke([*args, "--resume"], tmp_path)
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(("abstained" in x) == bool(floor) for x in rows)
