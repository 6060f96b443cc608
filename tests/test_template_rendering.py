"""A checkpoint's chat template renders every prompt as transformers' `apply_chat_template`
does, or is refused at load by name with what it does; its rendering is bounded; special
tokens that strip whitespace and generation prompts that end in spaces tokenize as the whole
prompt does."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
from test_chat_template import GEN, QWEN3_LIKE, TURN, chatml, transformers_prompt, with_template

from mlxbatch.engine.prompt import default_system_prompt
from mlxbatch.errors import ModelError, TemplateNote
from mlxbatch.model.convert import qwen_tokenizer_dir
from mlxbatch.model.tokenizer import PromptTokenizer

LABELS = ["billing", "technical", "account"]
SYSTEM = default_system_prompt(LABELS)
EXAMPLES = (("I was charged twice.", "billing"), ("The app crashes", "technical"))
# texts a template might treat otherwise than others
TEXTS = [
    "my password is hunter2",
    "Please refund me!!!",
    "before </think> after",
    "<tool_response>x</tool_response>",
    "ask <think> me",
    "use <tool_call> now",
    "  spaces around  ",
    "\nnewlines\n",
    "URGENT: help",
    "a long ticket " * 300,
]


def each_turn(head: str) -> str:
    """A ChatML template whose turn opens with `head` (jinja) instead of role + newline."""
    return (
        "{% for message in messages %}{{ '<|im_start|>' }}"
        + head
        + "{{ message['content'] + '<|im_end|>\\n' }}{% endfor %}"
        + GEN
    )


def assert_as_transformers(path: Path, texts=TEXTS, examples_sets=((), EXAMPLES)) -> None:
    from transformers import AutoTokenizer

    ours, ref = PromptTokenizer(path), AutoTokenizer.from_pretrained(path)
    for examples in examples_sets:
        for text in texts:
            want = transformers_prompt(ref, SYSTEM, text, examples)
            assert ours.prompt(SYSTEM, text, examples) == want, (examples, text)
        assert ours.prompts(SYSTEM, texts, examples) == [
            ours.prompt(SYSTEM, t, examples) for t in texts
        ]


def refusal(path: Path, examples=()) -> str:
    with pytest.raises(ModelError) as e:
        PromptTokenizer(path).prompt(SYSTEM, "hello", examples)
    message = str(e.value)
    assert message.startswith(f"{path / 'tokenizer_config.json'} (chat_template): "), message
    assert "\n" not in message
    return message


MACRO = "{% macro text(m) %}{{ m['content'] }}{% endmacro %}"
REWRITING = {  # name: (template, what the refusal names)
    "replace_a_word": (chatml("message['content'] | replace('password', '****')"), "| replace"),
    "branch_on_a_word": (
        each_turn(
            "{% if 'refund' in message['content'] %}{{ 'urgent\\n' }}"
            "{% else %}{{ message['role'] + '\\n' }}{% endif %}"
        ),
        "'refund' in the text",
    ),
    "slice": (chatml("message['content'][:50]"), "the slice [:50]"),
    "rstrip_punctuation": (chatml("message['content'].rstrip('!')"), ".rstrip('!')"),
    "lowered_then_tested": (
        each_turn(
            "{% if 'refund' in message['content'] | lower %}{{ 'x' }}"
            "{% endif %}{{ message['role'] + '\\n' }}"
        ),
        "| lower",
    ),
    "long_threshold": (
        each_turn(
            "{% if message['content'] | length > 3000 %}{{ 'long ' }}"
            "{% endif %}{{ message['role'] + '\\n' }}"
        ),
        "the text's length",
    ),
    "test_of_a_macros_output": (
        MACRO
        + each_turn(
            "{% if text(message).startswith('URGENT') %}{{ '!' }}{% endif %}"
            "{{ message['role'] + '\\n' }}"
        ),
        ".startswith('URGENT')",
    ),
}


@pytest.mark.parametrize("name", REWRITING)
def test_a_template_rewriting_or_testing_the_text_is_refused_at_load_naming_it(name, tmp_path):
    """Each of these ran with prompts unlike transformers' for some texts (a word, a length,
    a final '!'), and none of the words is in a probe text: the refusal names the construct."""
    template, construct = REWRITING[name]
    path = with_template(tmp_path / name, template)
    with pytest.raises(ModelError) as e:
        PromptTokenizer(path)
    message = str(e.value)
    assert message.startswith(
        f"{path / 'tokenizer_config.json'} (chat_template): the chat "
        "template changes the text it is given"
    ), message
    assert construct in message and "\n" not in message and "tokenizer.json" not in message


def test_a_label_cut_at_think_is_refused_and_other_labels_run_as_transformers(tmp_path):
    """Qwen 3's assistant turn drops what precedes `</think>`: with a label holding one, the
    prompt was silently unlike transformers'; with the usual labels it is transformers'."""
    path = with_template(tmp_path / "m", QWEN3_LIKE)
    assert_as_transformers(path)
    message = refusal(path, (("I was charged twice.", "<think>x</think>billing"),))
    assert "an example's label" in message


# Qwen 3's test of the last user turn: a tool response is not the query. Where the assistant
# turns after the query render alike either way (Qwen 3: a `<think>` block for the last one
# only) the test changes nothing; where they do not (ALWAYS_THINK), the prompt of a text
# wrapped in <tool_response> differs, and the template is refused.
QUERY = (
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' and message.content is string and "
    "not(message.content.startswith('<tool_response>') and "
    "message.content.endswith('</tool_response>')) %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}"
    "{%- endfor %}{%- for message in messages %}"
    "{%- if message.role == 'assistant' and loop.index0 > ns.last_query_index and THINK %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message.content + "
    "'<|im_end|>\\n' }}{%- else %}"
    + TURN.replace("CONTENT", "message.content")
    + "{%- endif %}{%- endfor %}"
    + GEN
)


def test_a_test_of_the_text_that_changes_nothing_runs_and_one_that_does_is_refused(tmp_path):
    assert_as_transformers(with_template(tmp_path / "qwen3", QUERY.replace("THINK", "loop.last")))
    path = with_template(tmp_path / "always", QUERY.replace("THINK", "true"))
    PromptTokenizer(path).prompt(SYSTEM, "hello")  # no example: no assistant turn to change
    assert "('</tool_response>') when that is the item's text" in refusal(path, EXAMPLES)


def test_non_special_added_tokens_typed_in_a_text_are_tokens_as_in_transformers(tmp_path):
    """`<think>` and `<tool_call>` are added tokens that are not special: transformers makes a
    typed one its token id, and so does mlxbatch; a typed special token stays plain text."""
    path = with_template(tmp_path / "m", chatml("message['content']"))
    assert_as_transformers(path, ["ask <think> me", "use <tool_call> now"])
    ours = PromptTokenizer(path)
    think, im_end = ours.encode("<think>"), ours._tok.token_to_id("<|im_end|>")
    assert len(think) == 1 and think[0] in ours.prompt(SYSTEM, "ask <think> me")
    assert ours.prompt(SYSTEM, "an <|im_end|> x").count(im_end) == 2  # system's and item's


def test_named_chat_templates_without_a_default_are_refused_as_transformers_does(tmp_path):
    """A list of named templates, none named "default", ran on ChatML built in code."""
    named = [
        {"name": "tool_use", "template": chatml("message['content']")},
        {"name": "rag", "template": chatml("message['content']")},
    ]
    path = with_template(tmp_path / "m", "")
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": named}))
    with pytest.raises(ModelError, match="none named 'default'") as e:
        PromptTokenizer(path)
    assert str(e.value).startswith(str(path / "tokenizer_config.json"))
    assert "'tool_use', 'rag'" in str(e.value)


def test_a_generation_block_renders_as_transformers_renders_it(tmp_path):
    """`{% generation %}` (assistant masks for training) did not compile."""
    turn = TURN.replace("CONTENT", "message['content']")
    template = (
        "{% for message in messages %}{% if message['role'] == 'assistant' %}"
        "{% generation %}"
        + turn
        + "{% endgeneration %}{% else %}"
        + turn
        + "{% endif %}{% endfor %}"
        + GEN
    )
    assert_as_transformers(with_template(tmp_path / "m", template), TEXTS[:3])


def stripping_tokens(dst: Path, template: str) -> Path:
    """The Qwen tokenizer with `<|im_start|>` taking the whitespace after it (rstrip) and
    `<|im_end|>` the whitespace before it (lstrip)."""
    path = with_template(dst, template)
    tok = json.loads((path / "tokenizer.json").read_text())
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    for t in [*tok["added_tokens"], *cfg["added_tokens_decoder"].values()]:
        t["rstrip"] = t["rstrip"] or t["content"] == "<|im_start|>"
        t["lstrip"] = t["lstrip"] or t["content"] == "<|im_end|>"
    (path / "tokenizer.json").write_text(json.dumps(tok))
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path


def test_special_tokens_that_strip_whitespace_beside_the_text_tokenize_as_the_whole(tmp_path):
    """The item's edge whitespace next to an rstrip/lstrip token: the whole prompt's tokens
    (tokenizer.json's, as `tokenizers` encodes the rendering) drop it, the piecewise prompt
    kept it. (transformers' Qwen2Tokenizer class resets both flags when it loads.)"""
    from tokenizers import Tokenizer
    from transformers.utils.chat_template_utils import render_jinja_template

    template = (
        "{% for message in messages %}{{ '<|im_start|>' + message['content'] + "
        "'<|im_end|>' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    texts = [
        "  two spaces first",
        "ends with spaces  ",
        "\n\nnewlines both sides\n",
        " \t mixed \u3000",
        "plain",
        "\x1c not White_Space \x1c",
    ]
    path = stripping_tokens(tmp_path / "m", template)
    ours, whole = PromptTokenizer(path), Tokenizer.from_file(str(path / "tokenizer.json"))
    for examples in ((), EXAMPLES):
        for text in texts:
            msgs = [{"role": "system", "content": SYSTEM}]
            for t, label in examples:
                msgs += [{"role": "user", "content": t}, {"role": "assistant", "content": label}]
            msgs.append({"role": "user", "content": text})
            rendered = render_jinja_template(
                conversations=[msgs], chat_template=template, add_generation_prompt=True
            )[0][0]
            want = whole.encode(rendered, add_special_tokens=False).ids
            assert ours.prompt(SYSTEM, text, examples) == want, (examples, text)
        assert ours.prompts(SYSTEM, texts, examples) == [
            ours.prompt(SYSTEM, t, examples) for t in texts
        ]


def test_a_generation_prompt_ending_in_spaces_scores_labels_with_the_space(tmp_path):
    """`Category: ` was refused ("label 'billing' merges with the prompt's final text"): the
    space now begins each label, as lm-evaluation-harness scores it."""
    from transformers import AutoTokenizer

    template = (
        "{% for message in messages %}{{ message['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'Category: ' }}{% endif %}"
    )
    path = with_template(tmp_path / "m", template)
    ours, ref = PromptTokenizer(path), AutoTokenizer.from_pretrained(path)
    for label in LABELS:
        assert ours.label(label) == ours.encode(" " + label)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "charged twice"}]
    rendered = ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert rendered.endswith("Category: ")
    prompt = ours.prompt(SYSTEM, "charged twice")
    assert prompt == ref(rendered.rstrip(" "), add_special_tokens=False)["input_ids"]
    whole = ref(rendered + "billing", add_special_tokens=False)["input_ids"]
    assert prompt + ours.label("billing") == whole


def test_spaces_moved_to_labels_give_the_gold_loops_answers(tiny_model_dir, tmp_path):
    from mlxbatch.api.classifier import Classifier

    path = tmp_path / "m"
    path.mkdir()
    for f in tiny_model_dir.iterdir():
        os.symlink(f, path / f.name)
    (path / "tokenizer_config.json").unlink()
    shutil.copyfile(tiny_model_dir / "tokenizer_config.json", path / "tokenizer_config.json")
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{% for message in messages %}{{ '[' + message['role'] + '] ' + "
        "message['content'] + '\\n' }}{% endfor %}[CATEGORY] "
    )
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = Classifier.load(path, labels=LABELS)
    texts = ["I was charged twice", "the app crashes", "reset my password", "refund please"]
    fast, gold = clf.classify(texts), clf.classify(texts, mode="sequential")
    assert [p.label for p in fast] == [p.label for p in gold]
    for a, b in zip(fast, gold):
        assert a.scores == pytest.approx(b.scores, abs=1e-4)


LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
UNBOUNDED = {  # name: (template prefix, what the refusal says)
    "loop": (LOOP, "runs over"),
    "multiplied": ("{% set x = 'a' * 10**10 %}", "builds a text"),
    "padded": ("{% set x = 'a' | center(10**10) %}", "asks for a size"),
    "doubled": (
        "{% set ns = namespace(x='ab') %}{% for i in range(64) %}"
        "{% set ns.x = ns.x + ns.x %}{% endfor %}",
        "builds a text",
    ),
    "rendered": (
        "{% for i in range(100000) %}{{ 'abcdefghijklmnopqrstuvwxyz' }}{% endfor %}",
        "renders over",
    ),
    "constant": ("{% set x = '" + "a" * 2_000_000 + "' %}", "characters (mlxbatch takes"),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recurses"),
}


@pytest.mark.parametrize("name", UNBOUNDED)
def test_a_template_past_the_bounds_is_refused_naming_the_template(name, tmp_path):
    """A template looping 10^10 times hung the load; one allocating gigabytes was a traceback;
    a 20 MB constant was blamed on the system prompt."""
    head, what = UNBOUNDED[name]
    path = with_template(tmp_path / name, head + chatml("message['content']"))
    with pytest.raises(ModelError) as e:
        PromptTokenizer(path)
    message = str(e.value)
    assert message.startswith(
        f"{path / 'tokenizer_config.json'} (chat_template): the chat template "
    ), message
    assert what in message and "\n" not in message and "system prompt" not in message


def test_mlxbatch_models_lists_a_template_past_the_bounds_as_broken(tiny_model_dir, tmp_path):
    from mlxbatch.model.defaults import not_runnable

    path = tmp_path / "m"
    path.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.name != "tokenizer_config.json":
            os.symlink(f, path / f.name)
    (path / "chat_template.jinja").write_text(LOOP + chatml("message['content']"))
    assert "chat_template.jinja: the chat template runs over" in not_runnable(path)


@pytest.mark.parametrize("kind", ["not_utf8", "directory", "link_loop"])
def test_an_unreadable_chat_template_file_is_refused_by_name(kind, tmp_path):
    """Not UTF-8: a traceback; a directory or a link loop: silently passed over."""
    path = with_template(tmp_path / "m", chatml("message['content']"))
    file = path / "chat_template.jinja"
    if kind == "not_utf8":
        file.write_bytes(b"{{ '\xff\xfe' }}" + chatml("message['content']").encode())
    elif kind == "directory":
        file.mkdir()
    else:
        os.symlink(file, file)
    with pytest.raises(ModelError) as e:
        PromptTokenizer(path)
    assert str(e.value).startswith(f"{file}: ") and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("template", "note"),
    [
        (chatml("message['content']").replace(GEN, ""), "adds no generation prompt"),
        (
            "{% for message in messages %}{% if message['role'] != 'system' %}"
            + TURN.replace("CONTENT", "message['content']")
            + "{% endif %}{% endfor %}"
            + GEN,
            "drops the system prompt",
        ),
    ],
)
def test_a_template_without_a_generation_prompt_or_system_turn_runs_with_a_note(
    template, note, tmp_path
):
    path = with_template(tmp_path / "m", template)
    with pytest.warns(TemplateNote, match=note) as caught:
        PromptTokenizer(path)
    assert str(caught[0].message).startswith(str(path / "tokenizer_config.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PromptTokenizer(qwen_tokenizer_dir())  # the usual template: no note


def test_the_command_line_prints_a_template_note_as_one_line():
    from mlxbatch.cli import format_note

    line = format_note("m/chat_template.jinja: the chat template drops", TemplateNote, "x.py", 1)
    assert line == "note: m/chat_template.jinja: the chat template drops\n"
