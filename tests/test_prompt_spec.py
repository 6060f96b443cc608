"""One prompt spec for every entry, checked once when built and worded at the boundary, and one
word per mode (the other words read as it): no model is needed for what these refuse."""

from __future__ import annotations

import json

import pytest
from cli_run import invoke, one_line_error

from mlxbatch import Classifier, PromptSpec
from mlxbatch.api.spec import RunSpec
from mlxbatch.bench.suite import bench_modes
from mlxbatch.engine import promptspec
from mlxbatch.engine.scheduler import BatchPolicy
from mlxbatch.errors import LabelError, UsageError, flag, keyword, worded

LABELS = ("billing", "bug")
GOOD = '{"id": "a", "text": "I was charged twice"}\n{"id": "b", "text": "the app crashes"}\n'


def test_a_spec_checks_its_settings_against_one_another_when_built():
    spec = PromptSpec(LABELS, examples=[("charged twice", "billing")], prior="billing=3,bug=1")
    assert spec.weights == pytest.approx((0.75, 0.25))
    assert spec.examples == (("charged twice", "billing"),) and spec.labels == LABELS
    assert PromptSpec().labels == ("billing", "technical", "account")
    with pytest.raises(LabelError, match=r"^example label\(s\) \['login'\] are not in"):
        PromptSpec(LABELS, examples=[("cannot log in", "login")])
    with pytest.raises(UsageError, match="^min_confidence 2 is not between 0 and 1"):
        PromptSpec(LABELS, min_confidence=2)
    with pytest.raises(UsageError, match="^calibrate: expected True or False, got str"):
        PromptSpec(LABELS, calibrate="no")
    with pytest.raises(UsageError, match="^tag_threshold applies to multi-label questions"):
        PromptSpec(LABELS, tag_threshold=0.7)


def test_a_refusal_names_the_setting_as_each_reader_types_it():
    with pytest.raises(LabelError) as e:
        PromptSpec(LABELS, prior="login=1")
    assert str(e.value).startswith("prior 'login=1': expected LABEL=WEIGHT"), e.value
    worded = e.value.worded(flag)
    assert isinstance(worded, LabelError)
    assert str(worded).startswith("--prior 'login=1': expected LABEL=WEIGHT"), worded
    with pytest.raises(UsageError) as e:
        PromptSpec(LABELS, tag_threshold=0.7)
    assert str(e.value.worded(flag)) == (
        "--tag-threshold applies to multi-label questions: give --questions"
    )
    with pytest.raises(UsageError) as e:
        RunSpec(max_batch=0)
    assert str(e.value).startswith("max_batch must be")
    assert str(e.value.worded(flag)).startswith("--max-batch must be")


def test_a_marked_setting_is_worded_with_its_value_for_each_reader():
    text = "set by `max_tokens=7` (see `max_tokens`, `too_long`); lower `max_batch=64`"
    named = ("max_tokens", "too_long", "max_batch")
    assert worded(text, keyword, named) == (
        "set by max_tokens=7 (see max_tokens, truncate); lower max_batch=64"
    )
    assert worded(text, flag, named) == (
        "set by --max-tokens 7 (see --max-tokens, --too-long); lower --max-batch 64"
    )
    assert worded("`too_long=truncate`", keyword, named) == "truncate=True"
    assert worded("`too_long=truncate`", flag, named) == "--too-long truncate"
    # only the settings named: other backticks are the message's own
    assert worded("`max_tokens=7` `x`", flag, ("max_tokens",)) == "--max-tokens 7 `x`"
    e = UsageError("lower `batch_tokens=9`", ("batch_tokens",))
    assert str(e) == "lower batch_tokens=9" and str(e.worded(flag)) == "lower --batch-tokens 9"


def test_the_prior_is_parsed_once_per_spec(tiny_model_dir, monkeypatch):
    calls = []
    real = promptspec.parse_prior

    def counted(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(promptspec, "parse_prior", counted)
    spec = PromptSpec(LABELS, prior={"billing": 1, "bug": 3})
    clf = Classifier.load(tiny_model_dir, prompt=spec)
    assert len(calls) == 1 and clf.adjust.prior == pytest.approx((0.25, 0.75))


def test_the_keywords_build_the_spec_that_prompt_takes(tiny_model_dir):
    texts = ["I was charged twice", "the app crashes on start"]
    by_keywords = Classifier.load(
        tiny_model_dir, labels=list(LABELS), calibrate=True, prior="billing=0.6", min_confidence=0.1
    )
    spec = PromptSpec(LABELS, calibrate=True, prior="billing=0.6", min_confidence=0.1)
    by_spec = Classifier.load(tiny_model_dir, prompt=spec)
    assert by_keywords.system_prompt == by_spec.system_prompt
    assert by_keywords.classify(texts) == by_spec.classify(texts)
    with pytest.raises(UsageError, match="^prompt and labels: give the prompt's settings in one"):
        Classifier.load(tiny_model_dir, labels=["a", "b"], prompt=spec)
    with pytest.raises(UsageError, match="^prompt: expected a PromptSpec, got dict"):
        Classifier.load(tiny_model_dir, prompt={"labels": LABELS})


def test_one_word_a_mode_and_the_other_words_read_as_it(tiny_model_dir):
    assert RunSpec(mode="gold").mode == "sequential"
    assert RunSpec(mode="prefix").mode == "sequential-prefix"
    assert BatchPolicy.step("gold") == BatchPolicy.step("sequential") == ("sequential", "gold")
    assert BatchPolicy.step("sorted", "greedy") == ("greedy", "fast")
    assert bench_modes(("gold", "prefix", "sorted")) == (
        "sequential",
        "sequential-prefix",
        "sorted",
    )
    with pytest.raises(UsageError, match="^mode 'golden' is not one of sorted, naive, sequential"):
        RunSpec(mode="golden")
    clf = Classifier.load(tiny_model_dir, labels=list(LABELS))
    # a journal records the mode's one word, as one written before the aliases did
    assert clf.settings(RunSpec(mode="gold")).record()["mode"] == "sequential"
    texts = ["I was charged twice", "the app crashes"]
    assert clf.classify(texts, mode="gold") == clf.classify(texts, mode="sequential")


def test_classify_takes_either_word_for_a_mode_with_the_same_bytes(tiny_model_dir, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(GOOD)
    outs = []
    for word in ("sequential", "gold", "sequential-prefix", "prefix"):
        out = tmp_path / f"{word}.jsonl"
        r = invoke(["classify", src, "--model", tiny_model_dir, "-o", out, "--mode", word])
        assert r.exit_code == 0, r.output
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] and outs[2] == outs[3] and outs[0]


def test_the_cli_words_a_questions_runs_refusals_by_flag(tiny_model_dir, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(GOOD)
    questions = tmp_path / "q.json"
    questions.write_text(
        json.dumps([{"name": "topic", "ask": "What is it about?", "labels": ["billing", "bug"]}])
    )
    base = ["classify", src, "--model", tiny_model_dir, "-o", tmp_path / "o.jsonl"]
    r = invoke([*base, "--questions", questions, "--prior", "billing=1"], tmp_path)
    one_line_error(r, "--prior and --questions: a prior weighs one label set", "`prior:` key")
    r = invoke([*base, "--tag-threshold", "0.6"], tmp_path)
    one_line_error(r, "--tag-threshold applies to multi-label questions: give --questions")
    assert not (tmp_path / "o.jsonl").exists()
