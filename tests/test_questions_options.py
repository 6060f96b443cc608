"""Options of a single-question run that apply with several questions: each question's prior,
calibration and abstention as a single-question run applies them to its own scores; few-shot
examples, each question's prompt exactly the single-question prompt given the same examples;
bad examples and a prior beside questions refused in one line."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from cli_run import invoke, one_line_error
from fast_path import score_batch

from mlxbatch.api.classifier import Classifier
from mlxbatch.engine.adjust import Adjustment
from mlxbatch.engine.question_engine import unpack
from mlxbatch.engine.questions import JOIN, YES_NO, questions_from
from mlxbatch.errors import InputError, UsageError

SYSTEM = "You triage support tickets."
QUESTIONS = {
    "system": SYSTEM,
    "questions": [
        {
            "name": "intent",
            "ask": "Which team should handle this message?",
            "labels": ["billing", "technical", "account"],
        },
        {"name": "urgency", "ask": "How urgent is it?", "labels": ["low", "high"]},
        {"name": "tags", "multi_label": {"refund": "money back", "login": ""}},
    ],
}
TEXTS = ["I was charged twice.", "Why can't I log in?", "The app crashed!", "ok"]
SHOTS = [
    {"text": "Refund my last invoice", "intent": "billing", "tags": ["refund"]},
    {"text": "Password reset fails", "intent": "account", "urgency": "high", "tags": []},
    {"text": "Crash on start", "urgency": "low"},
]


def with_entries(**fields) -> dict:
    """QUESTIONS with `fields[name]` added to the entry of that name."""
    out = copy.deepcopy(QUESTIONS)
    for entry in out["questions"]:
        entry.update(fields.get(entry["name"], {}))
    return out


def test_a_questions_prior_weighs_its_scores_as_the_prior_option_does(tiny_model_dir):
    prior = {"billing": 0.6, "technical": 0.3}
    plain = Classifier.load(tiny_model_dir, questions=QUESTIONS)
    weighed = Classifier.load(tiny_model_dir, questions=with_entries(intent={"prior": prior}))
    raw = plain.engine.score_gold(plain.engine.prompt(TEXTS[0]))[None]
    (a, b), rest = plain.engine.spans()[0], plain.engine.spans()[1]
    single = Classifier.load(
        tiny_model_dir, ["billing", "technical", "account"], SYSTEM, prior=prior
    )
    want = single.predictions(raw[:, a:b])[0]
    got = weighed.predictions(raw)[0].answers
    assert got["intent"]["scores"] == want.scores and got["intent"]["label"] == want.label
    assert want.scores != plain.predictions(raw)[0].answers["intent"]["scores"]
    assert got["urgency"] == plain.predictions(raw)[0].answers["urgency"]  # others untouched
    assert list(got["urgency"]["scores"].values()) == list(map(float, raw[0, rest[0] : rest[1]]))


def test_calibration_and_abstention_apply_per_question(tiny_model_dir):
    clf = Classifier.load(tiny_model_dir, questions=QUESTIONS, calibrate=True, min_confidence=0.9)
    e = clf.engine
    raw = e.score_gold(e.prompt(TEXTS[1]))[None]
    answers = clf.predictions(raw)[0].answers
    for asked, (a, b) in zip(clf.asked, e.spans()):
        p_cf = np.mean([e.score_gold(e.prompt(t))[a:b] for t in ("N/A", "", "[MASK]")], axis=0)
        adjusted = Adjustment(tuple(map(float, p_cf))).apply(raw[:, a:b])[0]
        answer = answers[asked.question]
        if asked.tag is not None:
            assert answer["scores"][asked.tag] == float(adjusted[0])
            continue
        assert list(answer["scores"].values()) == list(map(float, adjusted))
        assert answer["label"] is None and answer["abstained"]  # nothing reaches 0.9 here
    low = Classifier.load(tiny_model_dir, questions=QUESTIONS, min_confidence=0.01)
    said = low.predictions(raw)[0].answers
    assert said["intent"]["label"] is not None and "abstained" not in said["intent"]


def test_each_questions_prompt_is_the_single_question_prompt_with_its_examples(tiny_model_dir):
    clf = Classifier.load(tiny_model_dir, questions=QUESTIONS, examples=SHOTS)
    e = clf.engine
    packed = e.prompts(TEXTS)
    fast = score_batch(e, packed)
    for k, (asked, (a, b), shots) in enumerate(zip(clf.asked, e.spans(), e.shots)):
        if asked.tag is None:
            rows = [
                (s["text"] + JOIN + asked.ask, s[asked.question])
                for s in SHOTS
                if asked.question in s
            ]
        else:
            rows = [
                (s["text"] + JOIN + asked.ask, YES_NO[asked.tag not in s["tags"]])
                for s in SHOTS
                if "tags" in s
            ]
        assert shots == tuple(rows) and rows
        single = Classifier.load(tiny_model_dir, list(asked.labels), SYSTEM, examples=rows)
        prompts = single.engine.prompts([asked.user_text(t) for t in TEXTS])
        assert [unpack(p)[k] for p in packed] == prompts  # the same tokens, not just scores
        np.testing.assert_allclose(score_batch(single.engine, prompts), fast[:, a:b], atol=1e-6)
    gold = np.stack([e.score_gold(p) for p in packed])
    np.testing.assert_allclose(fast, gold, atol=1e-6)


def test_a_files_own_examples_equal_the_same_rows_given_apart(tiny_model_dir):
    own = with_entries(
        intent={"examples": [{"text": "Refund my last invoice", "label": "billing"}]},
        tags={"examples": [{"text": "Refund my last invoice", "tags": ["refund"]}]},
    )
    rows = [{"text": "Refund my last invoice", "intent": "billing", "tags": "refund"}]
    a = Classifier.load(tiny_model_dir, questions=own)
    b = Classifier.load(tiny_model_dir, questions=QUESTIONS, examples=rows)
    assert a.engine.prompts(TEXTS) == b.engine.prompts(TEXTS)
    assert a.engine.prompts(TEXTS) != Classifier.load(
        tiny_model_dir, questions=QUESTIONS
    ).engine.prompts(TEXTS)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"intent": {"prior": {"nope": 1}}}, ["'intent'", "'prior'", "nope"]),
        ({"intent": {"prior": {"billing": -1}}}, ["'intent'", "positive"]),
        ({"intent": {"prior": [1, 2]}}, ["'intent'", "'prior'", "mapping"]),
        ({"tags": {"prior": {"refund": 0.5}}}, ["'tags'", "'prior'", "--tag-threshold"]),
        (
            {"intent": {"examples": [{"text": "x", "label": "nope"}]}},
            ["'intent'", "example 1", "'nope'", "labels"],
        ),
        (
            {"tags": {"examples": [{"text": "x", "tags": ["crash"]}]}},
            ["'tags'", "example 1", "'crash'", "tags"],
        ),
        ({"tags": {"examples": [{"text": "x", "label": "a"}]}}, ["'tags'", "text and tags"]),
    ],
)
def test_a_bad_prior_or_example_in_the_file_is_refused_by_question(fields, words):
    with pytest.raises(InputError) as e:
        questions_from(with_entries(**fields), "q.yaml")
    message = str(e.value)
    assert "\n" not in message and message.startswith("q.yaml: question")
    assert all(w in message for w in words), message


def test_the_api_refuses_a_prior_and_bad_example_rows(tiny_model_dir):
    with pytest.raises(UsageError, match="`prior:` key"):
        Classifier.load(tiny_model_dir, questions=QUESTIONS, prior={"billing": 1})
    with pytest.raises(InputError, match=r"examples\[1\]: question 'urgency': 'soon'"):
        Classifier.load(
            tiny_model_dir,
            questions=QUESTIONS,
            examples=[{"text": "a", "urgency": "low"}, {"text": "b", "urgency": "soon"}],
        )
    with pytest.raises(InputError, match="'colour' is no question"):
        Classifier.load(tiny_model_dir, questions=QUESTIONS, examples=[{"text": "a", "colour": 1}])


@pytest.fixture
def files(tmp_path):
    q = tmp_path / "q.json"
    q.write_text(json.dumps(QUESTIONS))
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    return q, src


def test_the_cli_takes_examples_with_questions_in_jsonl_and_csv(tiny_model_dir, tmp_path, files):
    q, src = files
    jsonl = tmp_path / "shots.jsonl"
    jsonl.write_text("".join(json.dumps(s) + "\n" for s in SHOTS))
    csv = tmp_path / "shots.csv"
    csv.write_text(
        "text,intent,urgency,tags\n"
        "Refund my last invoice,billing,,refund\n"
        "Password reset fails,account,high,\n"
        "Crash on start,,low,\n"
    )
    outs = []
    for shots in (jsonl, csv):
        out = tmp_path / f"{shots.suffix[1:]}.out.jsonl"
        args = ["classify", src, "--model", tiny_model_dir, "--questions", q, "-o", out]
        r = invoke([*args, "--examples", shots, "--verify"])
        assert r.exit_code == 0, r.output
        outs.append(out.read_bytes())
    api = Classifier.load(tiny_model_dir, questions=QUESTIONS, examples=SHOTS).classify(TEXTS)
    rows = [json.loads(x) for x in outs[0].splitlines()]
    assert [r["answers"] for r in rows] == [p.answers for p in api]
    # the CSV's empty tags cell answers nothing: the second row is no tags example there
    csv_clf = Classifier.load(
        tiny_model_dir,
        questions=QUESTIONS,
        examples=SHOTS[:1] + [{k: v for k, v in SHOTS[1].items() if k != "tags"}, SHOTS[2]],
    )
    assert [json.loads(x)["answers"] for x in outs[1].splitlines()] == [
        p.answers for p in csv_clf.classify(TEXTS)
    ]


def test_the_cli_refuses_a_bad_example_and_a_prior_in_one_line(tiny_model_dir, tmp_path, files):
    q, src = files
    bad = tmp_path / "shots.csv"
    bad.write_text("text,intent\nfine,billing\nodd,shipping\n")
    args = ["classify", src, "--model", tiny_model_dir, "--questions", q]
    r = invoke([*args, "--examples", bad])
    one_line_error(r, str(bad), "row 2", "question 'intent'", "'shipping'")
    none = tmp_path / "none.jsonl"
    none.write_text('{"text": "lonely"}\n')
    one_line_error(
        invoke([*args, "--examples", none]), str(none), "line 1", "none of the questions"
    )
    one_line_error(
        invoke([*args, "--prior", "billing=0.5"]), "--prior and --questions", "`prior:` key"
    )
    misspelt = tmp_path / "misspelt.csv"  # its answers would be lost without a word
    misspelt.write_text("text,intnet\nfine,billing\n")
    r = invoke([*args, "--examples", misspelt])
    one_line_error(r, str(misspelt), "row 1", "'intnet' is no question's name")
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "misspelt.parquet"  # its rows hold only the columns asked for
    pq.write_table(
        pa.table({"text": ["fine"], "intnet": ["billing"], "intent": ["billing"]}), parquet
    )
    r = invoke([*args, "--examples", parquet])
    one_line_error(r, str(parquet), "row 1", "'intnet' is no question's name")


def test_labels_that_tokenize_as_a_prefix_are_refused_naming_the_file(tiny_model_dir, tmp_path):
    q = tmp_path / "q.json"
    q.write_text(json.dumps([{"name": "city", "ask": "Where?", "labels": ["new", "new york"]}]))
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    out = tmp_path / "out.jsonl"
    r = invoke(["classify", src, "--model", tiny_model_dir, "--questions", q, "-o", out])
    one_line_error(r, str(q), "question 'city'", "'labels'", "token prefix")
    assert not out.exists()


def test_the_api_refuses_a_tag_threshold_without_questions(tiny_model_dir):
    with pytest.raises(UsageError, match="tag_threshold applies to multi-label questions"):
        Classifier.load(tiny_model_dir, tag_threshold=0.3)
    clf = Classifier.load(tiny_model_dir, questions=QUESTIONS, tag_threshold=0.3)
    assert clf.tag_threshold == 0.3
    assert Classifier.load(tiny_model_dir, questions=QUESTIONS).tag_threshold == 0.5


def test_a_server_takes_examples_and_priors_with_questions(tiny_model_dir, tmp_path):
    """Each text answered as the Python API answers it with the same examples and priors."""
    import httpx
    from test_serve import running

    questions = with_entries(urgency={"prior": {"low": 0.2, "high": 0.8}})
    q, shots = tmp_path / "q.json", tmp_path / "shots.jsonl"
    q.write_text(json.dumps(questions))
    shots.write_text("".join(json.dumps(s) + "\n" for s in SHOTS))
    want = Classifier.load(tiny_model_dir, questions=questions, examples=SHOTS).classify(TEXTS)
    args = ("--questions", str(q), "--examples", str(shots), "--verify-sample", "1")
    with running(tiny_model_dir, *args, tmp=tmp_path) as s:
        r = httpx.post(s.url + "/v1/classify", json={"input": TEXTS}, timeout=60)
        assert r.status_code == 200, r.text
    got = [row["answers"] for row in r.json()["data"]]
    for mine, said in zip(got, want):
        for name, answer in mine.items():
            assert answer.get("label", answer.get("labels")) == said.answers[name].get(
                "label", said.answers[name].get("labels")
            )
            for label, p in answer["scores"].items():
                assert abs(p - said.answers[name]["scores"][label]) < 1e-6


def test_the_questions_bench_asks_each_prompt_alone_with_its_examples_and_prior(tiny_model_dir):
    from mlxbatch.bench.questions import bench_questions, singles

    questions = questions_from(with_entries(intent={"prior": {"account": 0.9}}))
    questions = questions.with_examples([(s["text"], {"urgency": s["urgency"]}) for s in SHOTS[1:]])
    clf = Classifier.load(tiny_model_dir, questions=questions)
    alone = singles(clf)
    assert [one.examples for one in alone] == [a.examples for a in clf.asked]
    assert alone[0].adjust.prior == clf.asked[0].prior and alone[1].examples
    r = bench_questions(tiny_model_dir, questions, TEXTS, None, False, lambda _: None)
    assert r["agreement_single"] == 1.0
