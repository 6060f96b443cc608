"""Hostile inputs, labels and prompts: empty inputs, standard input read twice, labels and
priors that cannot be written back, a prompt saved on Windows, texts truncated to nothing."""

from __future__ import annotations

import pytest
from cli_run import invoke, one_line_error

from mlxbatch.engine.adjust import parse_prior

GOOD = "".join(f'{{"id": "r{i}", "text": "ticket number {i} about billing"}}\n' for i in range(6))


def test_a_jobs_input_stays_locked_until_the_job_ends(tiny_model_dir, tmp_path, monkeypatch):
    """A one-window job holds its input for the whole job, not only while it reads it: another
    run's -o cannot replace it while the job scores."""
    from mlxbatch.io.sources import read_by_a_run
    from mlxbatch.runtime import testhold

    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    src.write_text("".join(f'{{"text": "ticket number {i}"}}\n' for i in range(8)))
    seen = []
    monkeypatch.setattr(testhold, "after_batch", lambda n: seen.append(read_by_a_run(src)))
    r = invoke(
        ["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", "1"], tmp_path
    )
    assert r.exit_code == 0, r.output
    assert seen and all(seen), seen  # every batch: another run's -o would be refused
    assert not read_by_a_run(src)  # released once the job is done


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


@pytest.mark.parametrize("name", ["in.jsonl", "in.csv", "in.txt"])
def test_an_empty_input_is_refused_before_the_model_loads(
    name, tiny_model_dir, tmp_path, monkeypatch
):
    # refused by the scan, after the load and the planner's first timing: on a fresh machine
    # the planner's notice came first, and the one-line error second (seconds later)
    from mlxbatch.api.classifier import Classifier

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded for an empty input")

    monkeypatch.setattr(Classifier, "load", no_load)
    (tmp_path / name).write_text("")
    r = invoke(
        ["classify", tmp_path / name, "--model", tiny_model_dir, "-o", tmp_path / "o.jsonl"],
        tmp_path,
    )
    one_line_error(r, "empty", alone=True)
    assert not (tmp_path / "o.jsonl").exists()


def test_labels_that_print_alike_or_break_a_line_are_refused():
    # "\u200bbilling" beside "billing" was a second label that printed the same; U+2028 was
    # written raw into JSONL, where splitlines() cut the row
    from mlxbatch.engine.labels import check_names
    from mlxbatch.errors import LabelError

    for names in (["\u200bbilling", "billing"], ["bil\u00adling", "billing", "x"]):
        with pytest.raises(LabelError, match="differ only by invisible"):
            check_names(names)
    for names in (["a\u2028b", "c"], ["a\u2029b", "c"]):
        with pytest.raises(LabelError, match="holds the line break"):
            check_names(names)
    assert check_names(["bug\u200dfix", "billing"]) == ("bug\u200dfix", "billing")


@pytest.mark.parametrize("weight", ["1_0", "\u0661", "0x10", "nan"])
def test_a_priors_weight_is_an_ascii_decimal(weight):
    # float() read "1_0" as 10 and an Arabic-Indic one as 1
    from mlxbatch.engine.adjust import parse_prior

    with pytest.raises(ValueError, match="is not a number"):
        parse_prior(f"a={weight}", ("a", "b"))


def test_a_system_prompt_file_saved_on_windows_is_the_prompt_typed(tmp_path):
    """A BOM and CRLF line ends were kept in the prompt: the same words scored otherwise."""
    from mlxbatch.io.promptspec import system_prompt_from

    typed = "You classify tickets.\nAnswer with one label."
    for raw in (
        typed.encode(),
        b"\xef\xbb\xbf" + typed.encode(),
        typed.replace("\n", "\r\n").encode() + b"\r\n",
    ):
        path = tmp_path / "p.txt"
        path.write_bytes(raw)
        assert system_prompt_from(None, path) == typed, raw


def test_a_truncation_that_keeps_none_of_the_text_is_refused(tiny_model_dir):
    """Where the prompt's suffix left room for the marker and nothing else, every row became
    the bare " […] ": one label for all, "59 duplicates scored once", --verify at 100%."""
    from mlxbatch import Classifier
    from mlxbatch.api.limits import MARK, Limit, prepare, tokenized, truncate

    engine = Classifier.load(tiny_model_dir).engine
    bare = len(engine.fed(tokenized(engine, MARK)))
    text = "the app crashes when I log in " * 10
    one = len(engine.fed(tokenized(engine, text[0] + MARK)))
    assert one > bare  # else this limit would not be the case
    assert truncate(engine, text, bare) is None
    said = prepare(engine, text, Limit(bare, "--max-tokens"), truncating=True)
    assert isinstance(said, str) and "too few tokens remain to truncate into" in said
    cut, n = truncate(engine, text, one)
    assert cut.startswith("t") and MARK in cut and n <= one  # one character or more of it


def test_a_yaml_label_read_as_a_boolean_says_to_quote_it(tmp_path):
    """`yes:` / `no:` keys failed with "label True is not a non-empty string" and no hint."""
    import pytest

    from mlxbatch.errors import LabelError
    from mlxbatch.io.prompts import read_labels_file

    path = tmp_path / "labels.yaml"
    path.write_text("yes: the customer agrees\nno: the customer refuses\n")
    with pytest.raises(LabelError, match="label True is not a non-empty string .*quote the label"):
        read_labels_file(path)
    path.write_text('"yes": the customer agrees\n"no": the customer refuses\n')
    assert list(read_labels_file(path)) == ["yes", "no"]
