"""The Python API's arguments, each refused with the API's own name for it (or taken, for
NumPy's scalars) as its CLI twin is: booleans, the prior, min_confidence, the system prompt,
labels that show nothing. Each case is one the API took or misnamed before."""

from __future__ import annotations

import numpy as np
import pytest
from cli_run import invoke, one_line_error

from mlxbatch import Classifier
from mlxbatch.errors import LabelError, UsageError

LABELS = ["billing", "bug"]
GOOD = '{"id": "a", "text": "I was charged twice"}\n{"id": "b", "text": "the app crashes"}\n'


@pytest.mark.parametrize("name", ["prefix_cache", "check_finite"])
def test_every_boolean_of_load_takes_true_or_false_only(tiny_model_dir, name):
    # prefix_cache="no" and check_finite="no" were truthy: the cache on, the weights checked
    with pytest.raises(UsageError, match=f"^{name}: expected True or False, got str 'no'$"):
        Classifier.load(tiny_model_dir, LABELS, **{name: "no"})


def test_booleans_are_refused_before_the_weights_load(tiny_model_dir, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the weights loaded before the arguments were checked")

    monkeypatch.setattr("mlxbatch.api.classifier.load_model", no_load)
    for name in ("prefix_cache", "check_finite", "calibrate"):
        with pytest.raises(UsageError, match=f"^{name}: expected True or False"):
            Classifier.load(tiny_model_dir, LABELS, **{name: 1})


@pytest.mark.parametrize("prior", [{}, "", " , "])
def test_an_empty_prior_is_refused_and_none_means_none(tiny_model_dir, prior):
    # {} and "" passed as no prior, while " , " said "--prior names no label"
    with pytest.raises(LabelError, match="^prior names no label"):
        Classifier.load(tiny_model_dir, LABELS, prior=prior)


@pytest.mark.parametrize(
    ("prior", "message"),
    [
        ("x=1", "prior 'x=1': expected LABEL=WEIGHT with a label of billing, bug"),
        ("billing=y", "prior 'billing=y': 'y' is not a number"),
        ("billing=0.2,billing=0.5", "prior names 'billing' twice"),
        ("billing=1e308,bug=1e308", "prior: the weights sum beyond"),
    ],
)
def test_the_prior_is_named_as_the_api_spells_it(tiny_model_dir, prior, message):
    with pytest.raises(UsageError) as e:
        Classifier.load(tiny_model_dir, LABELS, prior=prior)
    assert str(e.value).startswith(message) and "--prior" not in str(e.value), e.value


def test_the_cli_still_names_its_option_and_refuses_an_empty_prior(tiny_model_dir, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(GOOD)
    for prior, words in (
        ("billing=0.2,billing=0.5", "--prior names 'billing' twice"),
        ("", "--prior names no label"),
    ):
        r = invoke(
            [
                "classify",
                src,
                "--model",
                tiny_model_dir,
                "-o",
                tmp_path / "o.jsonl",
                "--prior",
                prior,
            ],
            tmp_path,
        )
        one_line_error(r, words)


def test_numpy_floats_are_taken_as_min_confidence(tiny_model_dir):
    # np.float32(0.5) was "min_confidence: expected a number, got float32"
    for value in (np.float64(1.0), np.int64(1), np.float16(0.5), np.float32(0.5)):
        got = Classifier.load(tiny_model_dir, LABELS, min_confidence=value)
        assert got.adjust.min_confidence == float(value)
        assert not isinstance(got.adjust.min_confidence, np.generic)  # a journal digests it
    half = Classifier.load(tiny_model_dir, LABELS, min_confidence=0.5)
    assert got.classify(["hi there", "a bug"]) == half.classify(["hi there", "a bug"])
    for value, error, words in (
        (np.True_, UsageError, "expected a number, got bool"),
        (True, UsageError, "expected a number, got bool"),
        (np.float32("nan"), LabelError, "is not between 0 and 1"),
        (np.float64(1.5), LabelError, "is not between 0 and 1"),
    ):
        with pytest.raises(error, match=f"^min_confidence:? .*{words}"):
            Classifier.load(tiny_model_dir, LABELS, min_confidence=value)


def test_a_system_prompt_with_a_lone_surrogate_is_refused_before_loading(
    tiny_model_dir, monkeypatch
):
    # it was refused by the tokenizer, after the weights loaded, as "cannot tokenize text"
    def no_load(*args, **kwargs):
        raise AssertionError("the weights loaded before the system prompt was checked")

    monkeypatch.setattr("mlxbatch.api.classifier.load_model", no_load)
    with pytest.raises(
        UsageError,
        match=r"^system_prompt holds a lone surrogate '\\ud800' at "
        "character 7",
    ):
        Classifier.load(tiny_model_dir, LABELS, system_prompt="Label \ud800 this")


def test_a_label_that_shows_nothing_is_refused_as_an_empty_one(tiny_model_dir):
    # a zero-width space was a label of its own, printed as nothing in every table
    for label in ("\u200b", "\u200b \u2060\ufeff", "\u200d\x07"):
        with pytest.raises(LabelError, match="empty label") as e:
            Classifier.load(tiny_model_dir, ["billing", label])
        assert repr(label) in str(e.value), e.value
    # only a label with nothing visible is: a joiner inside a word is text
    clf = Classifier.load(tiny_model_dir, ["billing", "bug\u200dfix"])
    assert clf.labels.names == ("billing", "bug\u200dfix")


def test_the_cli_refuses_a_label_that_shows_nothing(tiny_model_dir, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(GOOD)
    r = invoke(
        [
            "classify",
            src,
            "--model",
            tiny_model_dir,
            "-o",
            tmp_path / "o.jsonl",
            "--labels",
            "billing,\u200b",
        ],
        tmp_path,
    )
    one_line_error(r, "empty label", repr("\u200b"))
    assert not (tmp_path / "o.jsonl").exists()
