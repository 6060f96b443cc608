"""A questions file refused before anything loads: one line naming the question and the
field, exit 2; the prompts each question puts to a text."""

from __future__ import annotations

import json

import pytest
from cli_run import invoke, one_line_error

from mlxbatch.engine.questions import questions_from
from mlxbatch.errors import InputError
from mlxbatch.io.questions import read_questions

GOOD = {
    "system": "You triage tickets.",
    "questions": [
        {"name": "intent", "ask": "Which team?", "labels": ["billing", "technical"]},
        {"name": "tags", "multi_label": {"refund": "money back", "login": ""}},
    ],
}


def with_question(**fields) -> dict:
    return {"questions": [{"name": "q", "ask": "Which?", "labels": ["a", "b"], **fields}]}


def test_a_file_gives_one_prompt_per_question_and_per_tag(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text(
        "system: You triage tickets.\nquestions:\n"
        "  - {name: intent, ask: 'Which team?', labels: [billing, technical]}\n"
        "  - name: tags\n    multi_label: {refund: money back, login: ''}\n"
    )
    qs = read_questions(path)
    assert qs == questions_from(GOOD, str(path))
    asked = qs.asked()
    assert [a.ask for a in asked] == [
        "Which team?",
        "Does this message concern refund (money back)? Answer yes or no.",
        "Does this message concern login? Answer yes or no.",
    ]
    assert [a.labels for a in asked] == [("billing", "technical"), ("yes", "no"), ("yes", "no")]
    assert asked[0].user_text("Hi.") == "Hi.\n\nWhich team?"


def test_a_multi_label_template_names_each_tag():
    data = {"questions": [{"name": "t", "multi_label": ["x", "y"], "ask": "About {label}?"}]}
    assert [a.ask for a in questions_from(data).asked()] == ["About x?", "About y?"]


@pytest.mark.parametrize(
    "data, words",
    [
        ({"questions": [GOOD["questions"][0]] * 2}, ["'intent'", "'name'", "twice"]),
        (with_question(name="no spaces"), ["'name'", "not a name"]),
        (with_question(name="id"), ["'name'", "output uses"]),
        (with_question(ask="  "), ["'q'", "'ask'", "empty"]),
        (with_question(labels=[]), ["'q'", "'labels'", "no labels"]),
        (with_question(labels=["a", "a"]), ["'q'", "'labels'", "duplicate"]),
        (with_question(labels=["a", True]), ["'q'", "'labels'", "quote"]),
        (with_question(labels=[False, True]), ["'q'", "'labels'", "label False", "quote"]),
        (with_question(labels=[0, 1]), ["'q'", "'labels'", "label 0"]),
        (with_question(labels=[None, "b"]), ["'q'", "'labels'", "label None"]),
        (with_question(name="text"), ["'name'", "text field"]),
        (with_question(ask=5), ["'q'", "'ask'", "expected a string"]),
        (
            {"questions": [{"name": "t", "multi_label": ["x"], "ask": "Is it?"}]},
            ["'t'", "'ask'", "does not name {label}"],
        ),
        (with_question(multi_label=["x"]), ["'q'", "'labels'", "'multi_label'"]),
        (with_question(choices=["x"]), ["'q'", "unknown field", "choices"]),
        ({"questions": [], "x": 1}, ["unknown key", "x"]),
        ({"questions": []}, ["'questions'", "non-empty"]),
    ],
    ids=[
        "duplicate",
        "invalid",
        "reserved",
        "empty-ask",
        "no-labels",
        "same-labels",
        "boolean-label",
        "false-first",
        "zero-first",
        "null-first",
        "text-reserved",
        "ask-not-a-string",
        "template-without-label",
        "both",
        "unknown-field",
        "unknown-key",
        "none",
    ],
)
def test_bad_questions_are_refused_by_question_and_field(data, words):
    with pytest.raises(InputError) as e:
        questions_from(data, "q.json")
    assert all(w in str(e.value) for w in words), str(e.value)


def test_the_cli_refuses_a_bad_file_in_one_line_before_loading(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps(with_question(ask="")))
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    r = invoke(["classify", src, "--model", tmp_path / "no-model", "--questions", path])
    one_line_error(r, "question 'q'", "'ask'")
    r = invoke(["classify", src, "--questions", path.with_name("x.json"), "--labels", "a,b"])
    one_line_error(r, "questions")


def test_labels_beside_questions_are_refused(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps(GOOD))
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    r = invoke(["classify", src, "--questions", path, "--labels", "a,b"])
    one_line_error(r, "--labels", "--questions")
    r = invoke(["classify", src, "--questions", path, "--system-prompt", "Be brief."])
    one_line_error(r, "system")


@pytest.mark.parametrize(
    "questions, words",
    [
        (
            [
                {"name": "q", "ask": "x", "labels": ["c", "d"]},
                {"name": "q_c", "ask": "y", "labels": ["e", "f"]},
            ],
            ["'q_c'", "CSV column"],
        ),
        (
            [
                {"name": "a_b", "ask": "x", "labels": ["c", "d"]},
                {"name": "a", "ask": "y", "labels": ["b_c", "e"]},
            ],
            ["'a_b_c'", "CSV column"],
        ),
        ([{"name": "t", "multi_label": ["a;b", "c"]}], ["'a;b'", "multi_label"]),
        ([{"name": "t", "multi_label": ["a,b", "c"]}], ["'a,b'", "multi_label"]),
        ([{"name": "t", "multi_label": ["a", "c"], "ask": "Is it {label} {foo}?"}], ["{foo}"]),
    ],
)
def test_questions_whose_table_cannot_be_read_back_are_refused(questions, words):
    """Two CSV columns of one name, a tag holding the separator that joins tags, a template
    placeholder the file cannot mean: refused before anything loads."""
    from mlxbatch.engine.questions import questions_from
    from mlxbatch.errors import InputError

    with pytest.raises(InputError) as e:
        questions_from({"questions": questions})
    assert all(w in str(e.value) for w in words), str(e.value)


def test_labels_may_be_a_tuple():
    data = {"questions": [{"name": "q", "ask": "Which?", "labels": ("a", "b")}]}
    assert questions_from(data).questions[0].labels == ("a", "b")


@pytest.mark.parametrize(
    "text, words",
    [
        (
            '{"questions": [{"name": "a", "name": "b", "ask": "x", "labels": ["c", "d"]}]}',
            ["'name'"],
        ),
        (
            '{"questions": [{"name": "a", "ask": "x", "labels": {"c": "", "c": "", "d": ""}}]}',
            ["'c'"],
        ),
    ],
    ids=["field", "label"],
)
def test_a_key_given_twice_in_json_is_refused_as_in_yaml(tmp_path, text, words):
    """json.loads keeps the last of two equal keys: the file would mean something else."""
    path = tmp_path / "q.json"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        read_questions(path)
    assert all(w in str(e.value) for w in [str(path), "given twice", *words]), str(e.value)
    yaml_path = tmp_path / "q.yaml"
    yaml_path.write_text(text)  # JSON is YAML: the same refusal
    with pytest.raises(InputError, match="given twice"):
        read_questions(yaml_path)


def test_a_question_named_as_the_text_field_is_refused(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps(with_question(name="body")))
    src = tmp_path / "in.jsonl"
    src.write_text('{"body": "hello"}\n')
    args = ["--questions", path, "--text-field", "body"]
    r = invoke(["classify", src, "--model", tmp_path / "no-model", *args])
    one_line_error(r, "question 'body'", "'name'", "--text-field")
    r = invoke(["eval", src, src, *args])
    one_line_error(r, "question 'body'", "--text-field")
