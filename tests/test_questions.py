"""Several questions a text: each question's scores are those of its whole (text, question)
prompt, as transformers computes them; the output's bytes do not depend on the batches,
windows or an interruption; every path agrees with the gold loop."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_run import invoke
from fast_path import score_batch

from mlxbatch.api.classifier import Classifier

QUESTIONS = {
    "system": "You triage support tickets.",
    "questions": [
        {
            "name": "intent",
            "ask": "Which team should handle this message? Answer with one of: "
            "billing, technical, account.",
            "labels": ["billing", "technical", "account"],
        },
        {
            "name": "urgency",
            "ask": "How urgent is this message? Answer low or high.",
            "labels": ["low", "high"],
        },
        {"name": "tags", "multi_label": {"refund": "money back", "login": ""}},
        {
            "name": "product",
            "ask": "Which product is it about?",
            "labels": ["mobile app", "web dashboard", "API"],
        },  # several tokens a label
    ],
}
# ends that BPE may merge with the question's "\n\n": the shared part is never guessed
TEXTS = [
    "I was charged twice.",
    "Why can't I log in?",
    "The app crashed!",
    "refund me   ",
    "line one\n",
    "help\n\n",
    "ok",
    "Multi\n\nparagraph text: 数据 sync",
]


def hf_scores(hf, tok, system: str, text: str, ask: str, labels: list[list[int]]) -> np.ndarray:
    """The label probabilities of one whole (text, question) prompt, by transformers: the
    ChatML prompt written out, tokenized whole, each label's tokens scored behind it."""
    import torch

    whole = (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{text}\n\n{ask}"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    p = tok.encode(whole, add_special_tokens=False).ids
    sums = []
    for label in labels:
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([p + label[:-1]])).logits[0, len(p) - 1 :]
        logp = torch.log_softmax(logits.double(), -1)
        sums.append(sum(float(logp[j, t]) for j, t in enumerate(label)))
    return torch.softmax(torch.tensor(sums), 0).numpy()


def test_each_questions_scores_are_its_whole_prompts_by_transformers(tied_pair):
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    hf_dir, mlx_dir = tied_pair
    clf = Classifier.load(mlx_dir, questions=QUESTIONS)
    got = clf.classify(TEXTS, batch_tokens=300)
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    system = QUESTIONS["system"]
    for text, said in zip(TEXTS, got):
        for asked in clf.asked:
            labels = [clf.lm.tokenizer.label(x) for x in asked.labels]
            want = hf_scores(hf, tok, system, text, asked.ask, labels)
            answer = said.answers[asked.question]
            if asked.tag is None:
                ours = [answer["scores"][x] for x in asked.labels]
                np.testing.assert_allclose(ours, want, atol=1e-5)
                assert answer["label"] == asked.labels[int(np.argmax(want))]
            else:
                np.testing.assert_allclose(answer["scores"][asked.tag], want[0], atol=1e-5)
                assert (asked.tag in answer["labels"]) == (answer["scores"][asked.tag] >= 0.5)


def test_the_fast_path_equals_the_gold_loop_and_single_question_runs(tiny_model_dir):
    clf = Classifier.load(tiny_model_dir, questions=QUESTIONS)
    e = clf.engine
    prompts = e.prompts(TEXTS)
    fast = score_batch(e, prompts)
    gold = np.stack([e.score_gold(p) for p in prompts])
    np.testing.assert_allclose(fast, gold, atol=1e-6)
    alone = np.stack([score_batch(e, [p])[0] for p in prompts])
    assert np.array_equal(fast, alone)  # a text's scores do not depend on its company
    for asked, (a, b) in zip(clf.asked, e.spans()):
        single = Classifier.load(tiny_model_dir, list(asked.labels), QUESTIONS["system"])
        one = score_batch(single.engine, single.engine.prompts([asked.user_text(t) for t in TEXTS]))
        np.testing.assert_allclose(one, fast[:, a:b], atol=1e-6)  # within the last bits


@pytest.fixture
def job(tiny_model_dir, tmp_path):
    q = tmp_path / "q.json"
    q.write_text(json.dumps(QUESTIONS))
    src = tmp_path / "in.jsonl"
    rows = [{"id": i, "text": TEXTS[i % len(TEXTS)] + " x" * (i % 7)} for i in range(30)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def run(name: str, *args):
        out = tmp_path / name
        r = invoke(["classify", src, "--model", tiny_model_dir, "--questions", q, "-o", out, *args])
        assert r.exit_code == 0, r.output
        return out, r

    return run


def test_the_bytes_do_not_depend_on_budget_windows_or_mode(job):
    ref, r = job("ref.jsonl", "--verify")
    assert "100.00% label agreement" in r.output
    row = json.loads(ref.read_text().splitlines()[0])
    assert set(row) == {"id", "answers"}
    assert list(row["answers"]) == ["intent", "urgency", "tags", "product"]
    assert set(row["answers"]["tags"]) == {"labels", "scores"}
    for name, args in [
        ("small.jsonl", ["--batch-tokens", "200", "--max-batch", "3"]),
        ("windows.jsonl", ["--window-rows", "7"]),
        ("naive.jsonl", ["--mode", "naive"]),
    ]:
        out, _ = job(name, *args)
        assert out.read_bytes() == ref.read_bytes(), name


def test_a_table_has_a_column_per_question_and_per_score(job):
    out, _ = job("out.csv")
    lines = out.read_text().splitlines()
    assert lines[0] == (
        "id,intent,urgency,tags,product,intent_billing,intent_technical,"
        "intent_account,urgency_low,urgency_high,tags_refund,tags_login,"
        "product_mobile app,product_web dashboard,product_API,error"
    )
    assert len(lines) == 31


def test_an_interrupted_job_resumes_to_the_same_bytes(tiny_model_dir, tmp_path, monkeypatch):
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.jobs.job import run_job
    from mlxbatch.runtime import testhold

    src, ref, out = tmp_path / "t.jsonl", tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    src.write_text(
        "".join(json.dumps({"text": t + " y" * i}) + "\n" for i, t in enumerate(TEXTS * 2))
    )
    clf = Classifier.load(tiny_model_dir, questions=QUESTIONS)
    rows, _ = read_rows(str(src))
    spec = RunSpec(max_batch=2)
    run_job(clf, rows, spec, ref, keep_results=False)

    def stop(n: int) -> None:
        if n == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(testhold, "after_batch", stop)
    with pytest.raises(KeyboardInterrupt):
        run_job(clf, rows, spec, out, keep_results=False)
    monkeypatch.undo()
    result = run_job(clf, rows, spec, out, resume=True, verify=True)
    assert out.read_bytes() == ref.read_bytes()
    assert result.resumed > 0 and result.verify["passed"]


def test_a_text_is_fed_once_and_each_question_only_what_it_adds(tiny_model_dir):
    """The tokens an item feeds: its text's common part once, then its tails, a part that
    tails begin with fed once; every tail begins where the whole prompts part (a merged "."
    stays in each tail)."""
    from mlxbatch.engine.layout import split
    from mlxbatch.engine.question_engine import unpack
    from mlxbatch.engine.question_layout import common_part, fed_tails, text_and_tails

    clf = Classifier.load(tiny_model_dir, questions=QUESTIONS)
    e = clf.engine
    for packed in e.prompts(TEXTS):
        parts = unpack(packed)
        common, tails = text_and_tails(parts)
        assert all(common + tail == part for tail, part in zip(tails, parts))
        assert all(tail for tail in tails)
        assert len({tail[0] for tail in tails}) > 1 or len(common) == min(map(len, parts)) - 1
        whole = sum(len(split(p, e.prefix)[1]) for p in parts)
        once = whole - (len(parts) - 1) * len(split(common, e.prefix)[1])
        # "Which ..." twice and "Does this message concern ..." twice: those parts fed once
        shared = sum(
            common_part([t for t in tails if t[0] == first]) for first in {tails[0][0], tails[2][0]}
        )
        assert e.fed(packed) == split(common, e.prefix)[1] + fed_tails(tails)
        assert len(e.fed(packed)) == once - shared and shared >= 5


def test_a_server_with_questions_answers_every_question(tiny_model_dir, tmp_path):
    """Each text answered with every question, as the Python API answers it; /v1/models
    lists the questions."""
    import httpx
    from test_serve import running

    q = tmp_path / "q.json"
    q.write_text(json.dumps(QUESTIONS))
    want = Classifier.load(tiny_model_dir, questions=QUESTIONS).classify(TEXTS[:3])
    with running(tiny_model_dir, "--questions", str(q), "--verify-sample", "1", tmp=tmp_path) as s:
        r = httpx.post(s.url + "/v1/classify", json={"input": TEXTS[:3]}, timeout=60)
        assert r.status_code == 200, r.text
        got = [row["answers"] for row in r.json()["data"]]
        card = httpx.get(s.url + "/v1/models", timeout=60).json()["data"][0]
    for mine, said in zip(got, want):
        assert [a.get("label", a.get("labels")) for a in mine.values()] == [
            a.get("label", a.get("labels")) for a in said.answers.values()
        ]
        for name, answer in mine.items():
            for label, p in answer["scores"].items():
                assert abs(p - said.answers[name]["scores"][label]) < 1e-6
    assert [x["name"] for x in card["questions"]] == ["intent", "urgency", "tags", "product"]
    assert card["questions"][2] == {"name": "tags", "multi_label": ["refund", "login"]}


def test_eval_reports_each_question_with_a_gold_field(job, tmp_path):
    out, _ = job("out.jsonl")
    src, q = tmp_path / "in.jsonl", tmp_path / "q.json"
    rows = [json.loads(x) for x in src.read_text().splitlines()]
    said = [json.loads(x)["answers"] for x in out.read_text().splitlines()]
    gold = tmp_path / "gold.jsonl"
    gold.write_text(
        "".join(
            json.dumps(r | {"intent": a["intent"]["label"], "tags": ["login"]}) + "\n"
            for r, a in zip(rows, said)
        )
    )
    report = tmp_path / "m.json"
    r = invoke(["eval", gold, out, "--questions", q, "--json", report])
    assert r.exit_code == 0, r.output
    m = json.loads(report.read_text())
    assert m["intent"]["accuracy"] == 1.0 and set(m) == {"intent", "tags"}
    on = [a["tags"]["labels"] for a in said]
    tp = sum("login" in x for x in on)
    assert m["tags"]["per_tag"]["login"]["recall"] == tp / len(on)
    wrong = sum(len(x) - ("login" in x) + ("login" not in x) for x in on)
    assert m["tags"]["hamming_loss"] == pytest.approx(wrong / (2 * len(on)))
    assert "urgency: no row has a field 'urgency'" in r.output


def test_multi_label_metrics_by_hand():
    from mlxbatch.api.evaluate_answers import gold_tags, multi_label

    m = multi_label([{"a"}, {"a", "b"}, set()], [{"a"}, {"b"}, {"b"}], ("a", "b"))
    assert m["per_tag"]["a"] == {"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1}
    assert m["per_tag"]["b"]["recall"] == 0.5 and m["micro_f1"] == 4 / 6
    assert m["hamming_loss"] == 2 / 6 and m["exact_match"] == 1 / 3
    assert gold_tags("a; b") == {"a", "b"} and gold_tags("") == set() and gold_tags(None) is None


def test_the_python_api_takes_a_questions_file(tiny_model_dir, tmp_path):
    from mlxbatch.errors import InputError

    path = tmp_path / "q.yaml"
    path.write_text("questions:\n  - {name: mood, ask: 'Calm or upset?', labels: [calm, upset]}\n")
    said = Classifier.load(tiny_model_dir, questions=str(path)).classify(["hi"])[0]
    assert said.label is None and said.answers["mood"]["label"] in ("calm", "upset")
    with pytest.raises(InputError, match="question 'mood': field 'ask'"):
        Classifier.load(tiny_model_dir, questions=[{"name": "mood", "labels": ["a", "b"]}])
