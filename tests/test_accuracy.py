"""Evaluation metrics against hand-computed tables; few-shot prompts; contextual calibration,
priors and abstention, each agreeing with the gold loop."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer

from mlxbatch.api.evaluate import evaluate, expected_calibration_error, format_evaluation
from mlxbatch.cli import cli
from mlxbatch.engine.adjust import Adjustment, parse_prior

L = ("a", "b", "c")


def test_metrics_match_a_hand_computed_table():
    gold = ["a", "a", "a", "b", "b", "c", "zzz", "a"]
    pred = ["a", "b", "a", "b", "a", "a", "a", None]
    m = evaluate(pred, gold, L, [0.9, 0.6, 0.8, 0.7, 0.55, 0.4, 0.99, 0.3])
    assert m["items"] == 8 and m["evaluated"] == 7 and m["unknown_gold"] == {"zzz": 1}
    assert m["accuracy"] == pytest.approx(3 / 7)
    assert m["confusion"]["columns"] == ["a", "b", "c", "(abstained)"]
    assert m["confusion"]["matrix"] == [[2, 1, 0, 1], [1, 1, 0, 0], [1, 0, 0, 0]]
    a, b, c = (m["per_class"][x] for x in L)
    assert (a["precision"], a["recall"], a["support"]) == (pytest.approx(2 / 4), 2 / 4, 4)
    assert a["f1"] == pytest.approx(0.5)
    assert (b["precision"], b["recall"], b["f1"]) == (0.5, 0.5, pytest.approx(0.5))
    assert (c["precision"], c["recall"], c["f1"], c["predicted"]) == (
        0.0,
        0.0,
        0.0,
        0,
    )  # never predicted
    assert m["macro_f1"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert m["coverage"] == pytest.approx(6 / 7) and m["abstained"] == 1
    assert m["accuracy_answered"] == pytest.approx(3 / 6)
    above = m["above_threshold"]
    assert above["0.5"] == {"coverage": pytest.approx(5 / 7), "accuracy": pytest.approx(3 / 5)}
    assert above["0.7"] == {"coverage": pytest.approx(3 / 7), "accuracy": 1.0}
    assert above["0.9"] == {"coverage": pytest.approx(1 / 7), "accuracy": 1.0}


def test_nothing_evaluated_reports_no_figures_not_zero():
    """Every gold label unknown: accuracy is undefined, not 0%."""
    m = evaluate(["a", "b"], ["zzz", None], L, [0.9, 0.8])
    assert m["evaluated"] == 0 and m["missing_gold"] == 1 and m["unknown_gold"] == {"zzz": 1}
    assert m["accuracy"] is None and m["macro_f1"] is None and m["coverage"] is None
    assert "accuracy n/a, macro-F1 n/a" in format_evaluation(m)


def test_expected_calibration_error_by_hand():
    conf = np.array([0.95, 0.95, 0.65, 0.65, 0.15])
    correct = np.array([1, 0, 1, 1, 0], bool)
    # bins: [0.9,1.0]: acc 0.5 vs 0.95 -> 0.45 x 2/5; [0.6,0.7): 1.0 vs 0.65 -> 0.35 x 2/5;
    # [0.1,0.2): 0 vs 0.15 -> 0.15 x 1/5
    want = 0.45 * 0.4 + 0.35 * 0.4 + 0.15 * 0.2
    assert expected_calibration_error(conf, correct) == pytest.approx(want)


def test_priors_and_adjustment_math():
    assert parse_prior("a=0.5,b=0.3,c=0.2", L) == pytest.approx((0.5, 0.3, 0.2))
    assert parse_prior("a=2,b=1,c=1", L) == pytest.approx((0.5, 0.25, 0.25))
    assert parse_prior("a=0.5", L) == pytest.approx((0.5, 0.25, 0.25))
    for bad in ("x=1", "a", "a=-1", "a=nan", "a=1"):
        with pytest.raises(ValueError):
            parse_prior(bad, L)
    adj = Adjustment(p_cf=(0.5, 0.25, 0.25), prior=(0.2, 0.4, 0.4), min_confidence=0.5)
    p = np.array([[0.5, 0.25, 0.25]])
    np.testing.assert_allclose(adj.apply(p), [[0.2, 0.4, 0.4]], rtol=1e-6)
    assert adj.abstains(adj.apply(p)[0])


def test_few_shot_tokens_equal_a_reference_chatml_tokenization(tiny_model_dir):
    from mlxbatch.engine.prompt import few_shot_prompt
    from mlxbatch.model.tokenizer import PromptTokenizer

    system, examples = few_shot_prompt(("billing", "technical", "account"))
    text = "My card was charged but the app says unpaid."
    convo = f"<|im_start|>system\n{system}<|im_end|>\n"
    for t, lab in examples:
        convo += f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n{lab}<|im_end|>\n"
    convo += f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    ref = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    ours = PromptTokenizer(tiny_model_dir)
    assert ours.prompt(system, text, examples) == ref.encode(convo, add_special_tokens=False).ids
    shared = ours.shared_prefix(system, examples)
    assert 250 <= len(shared) <= 400  # "about 300 tokens of shared prefix"
    assert ours.prompt(system, text, examples)[: len(shared)] == shared


def test_prompts_of_several_system_prompts_and_their_memory(tiny_model_dir):
    """The prefix is encoded once per (system, examples), and every prompt refers to one int
    object per token id: a 100,000-row job holds 100,000 prompts at once."""
    from mlxbatch.engine.prompt import few_shot_prompt
    from mlxbatch.model.tokenizer import PromptTokenizer

    ref = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    ours = PromptTokenizer(tiny_model_dir)
    few = few_shot_prompt(("billing", "technical", "account"))
    cases = [("Sort these.", ()), (few[0], few[1]), ("Sort these.", ()), ("Other.", few[1])]
    for system, examples in cases * 3:  # cached prefixes are keyed by prompt and examples
        convo = f"<|im_start|>system\n{system}<|im_end|>\n"
        for t, lab in examples:
            convo += f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n{lab}<|im_end|>\n"
        convo += "<|im_start|>user\ncharged twice<|im_end|>\n<|im_start|>assistant\n"
        assert (
            ours.prompt(system, "charged twice", examples)
            == ref.encode(convo, add_special_tokens=False).ids
        )
    a, b = ours.prompt("Sort these.", "refund please"), ours.prompt("Sort these.", "refund now")
    big = [i for i, t in enumerate(a) if t > 256 and i < len(b) and b[i] == t]
    assert big and all(a[i] is b[i] for i in big)


@pytest.fixture(scope="module")
def examples_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("ex") / "ex.jsonl"
    rows = [
        {"text": "double charge", "label": "billing"},
        {"text": "crash", "label": "technical"},
        {"text": "locked out", "label": "account"},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_calibration_equals_a_direct_computation_from_the_gold_loop(tiny_model_dir, examples_file):
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.io.prompts import read_examples

    labels = ("billing", "technical", "account")
    ex = read_examples(str(examples_file), labels)
    raw = Classifier.load(tiny_model_dir, labels, examples=ex)
    cal = Classifier.load(tiny_model_dir, labels, examples=ex, calibrate=True)
    texts = ["I want my money back", "error 0x1f on start", "change my email", "hello"]
    p = np.stack([raw.engine.score_gold(raw.engine.prompt(t)) for t in texts])
    cf = np.stack([raw.engine.score_gold(raw.engine.prompt(t)) for t in ("N/A", "", "[MASK]")])
    want = (p / cf.mean(0)) / (p / cf.mean(0)).sum(1, keepdims=True)
    for mode in ("sorted", "naive", "sequential"):
        got = np.array([[x.scores[n] for n in labels] for x in cal.classify(texts, mode=mode)])
        np.testing.assert_allclose(got, want, atol=2e-6)


@pytest.mark.parametrize("mode", ["sorted", "naive", "sequential"])
def test_every_mode_verifies_with_examples_calibration_priors_and_abstention(
    tiny_model_dir, examples_file, tmp_path, mode
):
    from mlxbatch.bench.workload import generate, write_jsonl

    src, out = tmp_path / "t.jsonl", tmp_path / "o.jsonl"
    write_jsonl(generate(40, seed=1), src)
    labels_file = tmp_path / "labels.yaml"
    labels_file.write_text("billing: money\ntechnical: bugs\naccount: logins\n")
    r = CliRunner().invoke(
        cli,
        [
            "classify",
            str(src),
            "--model",
            str(tiny_model_dir),
            "-o",
            str(out),
            "--mode",
            mode,
            "--examples",
            str(examples_file),
            "--labels-file",
            str(labels_file),
            "--calibrate",
            "--prior",
            "billing=0.4,technical=0.3,account=0.3",
            "--min-confidence",
            "0.34",
            "--verify",
            "--gold-field",
            "intent",
            "--json",
            str(tmp_path / "ev.json"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "100.00% label agreement" in r.stderr and "p_cf billing=" in r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    ab = [x for x in rows if x.get("abstained")]
    assert all(x["label"] is None and max(x["scores"].values()) < 0.34 for x in ab)
    assert all(max(x["scores"].values()) >= 0.34 for x in rows if not x.get("abstained"))
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert ev["evaluated"] == 40 and ev["abstained"] == len(ab)


def test_bad_examples_are_refused_with_their_line(tiny_model_dir, tmp_path):
    ex = tmp_path / "ex.jsonl"
    ex.write_text('{"text": "a", "label": "billing"}\n{"text": "b", "label": "refunds"}\n')
    src = tmp_path / "in.txt"
    src.write_text("hello\n")
    r = CliRunner().invoke(
        cli, ["classify", str(src), "--model", str(tiny_model_dir), "--examples", str(ex)]
    )
    assert (
        r.exit_code == 2
        and "line 2" in r.stderr
        and "'refunds' is not in the label set" in r.stderr
    )


def test_eval_command_and_plot(tiny_model_dir, tmp_path):
    pytest.importorskip("matplotlib")
    from mlxbatch.bench.workload import generate, write_jsonl

    src, out = tmp_path / "t.jsonl", tmp_path / "o.jsonl"
    tickets = generate(30, seed=2)
    tickets[0]["intent"] = "refunds"  # a gold label outside the set: counted and named
    write_jsonl(tickets, src)
    r = CliRunner().invoke(
        cli, ["classify", str(src), "--model", str(tiny_model_dir), "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(
        cli,
        [
            "eval",
            str(src),
            str(out),
            "--gold-field",
            "intent",
            "--plot",
            str(tmp_path / "cm.png"),
            "--json",
            str(tmp_path / "m.json"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "'refunds' x1" in r.stdout and "macro-F1" in r.stdout and "confusion" in r.stdout
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["evaluated"] == 29 and m["unknown_gold"] == {"refunds": 1}
    assert (tmp_path / "cm.png").stat().st_size > 1000


def test_plot_without_a_path_lands_beside_the_output(tiny_model_dir, tmp_path):
    pytest.importorskip("matplotlib")
    from mlxbatch.bench.workload import generate, write_jsonl

    src, out = tmp_path / "t.jsonl", tmp_path / "o.jsonl"
    write_jsonl(generate(12, seed=4), src)
    r = CliRunner().invoke(
        cli,
        [
            "classify",
            str(src),
            "--model",
            str(tiny_model_dir),
            "-o",
            str(out),
            "--gold-field",
            "intent",
            "--plot",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "o.confusion.png").stat().st_size > 1000
    # beside a device output there is no file to sit next to: the working directory
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        r = CliRunner().invoke(
            cli,
            [
                "classify",
                str(src),
                "--model",
                str(tiny_model_dir),
                "-o",
                "/dev/null",
                "--gold-field",
                "intent",
                "--plot",
            ],
        )
    finally:
        os.chdir(cwd)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "confusion.png").stat().st_size > 1000


def test_python_api_options(tiny_model_dir):
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.api.evaluate import evaluate

    clf = Classifier.load(
        tiny_model_dir,
        examples=[("refund please", "billing")],
        calibrate=True,
        min_confidence=0.99,
        prior={"billing": 1, "technical": 1, "account": 1},
    )
    preds = clf.classify(["charged twice", "crash"])
    assert all(p.abstained and p.label is None for p in preds)
    m = evaluate([p.label for p in preds], ["billing", "technical"], clf.labels.names)
    assert m["coverage"] == 0.0
