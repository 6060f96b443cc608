"""A checkpoint's chat template that changes the text it is given: every prompt equals
transformers' `apply_chat_template`, or the template is refused at load, by name (chat.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mlxbatch.engine.prompt import default_system_prompt
from mlxbatch.errors import ModelError
from mlxbatch.model.convert import qwen_tokenizer_dir
from mlxbatch.model.tokenizer import PromptTokenizer

TURN = "{{ '<|im_start|>' + message['role'] + '\\n' + CONTENT + '<|im_end|>\\n' }}"
GEN = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"


def chatml(content: str) -> str:
    return "{% for message in messages %}" + TURN.replace("CONTENT", content) + "{% endfor %}" + GEN


LEN_COND = (
    "{% for message in messages %}{% if message['content'] | length > 40 %}"
    "{{ '<|im_start|>' + message['role'] + ' long\\n' }}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>\\n' }}{% endfor %}" + GEN
)
# Qwen 3's assistant turn: reasoning cut off a label only when it holds `</think>`.
QWEN3_LIKE = (
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    + TURN.replace("CONTENT", "content")
    + "{% endfor %}"
    + GEN
)
MISTRAL_V3 = (
    '{%- if messages[0]["role"] == "system" %}{%- set system_message = messages[0]["content"] %}'
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}"
    "{%- endif %}{{- bos_token }}{%- for message in loop_messages %}"
    '{%- if message["role"] == "user" %}{%- if loop.last and system_message is defined %}'
    '{{- "<|im_start|>" + system_message + "\\n\\n" + message["content"] + "<|im_end|>" }}'
    '{%- else %}{{- "<|im_start|>" + message["content"] + "<|im_end|>" }}{%- endif %}'
    '{%- elif message["role"] == "assistant" %}{{- " " + message["content"]|trim + eos_token}}'
    "{%- endif %}{%- endfor %}"
)
KEPT = {  # templates that put the text in as given, or trimmed: prompts as before
    "plain": chatml("message['content']"),
    "trim": chatml("message['content'] | trim"),
    "strip_method": chatml("message['content'].strip()"),
    "qwen3_like": QWEN3_LIKE,
    "mistral_v3": MISTRAL_V3,
}
CHANGED = {  # name: (template, what the refusal says the template does)
    "lstrip_newlines": (chatml("message['content'].lstrip('\\n')"), ".lstrip('\\n')"),
    "length_branch": (LEN_COND, "depends on the text's length"),
    "replace_newlines": (chatml("message['content'] | replace('\\n', ' ')"), "| replace"),
}
LABELS = ["billing", "technical", "account"]
EXAMPLES = (("I was charged twice.", "billing"), ("  The app crashes\n", "technical"))
TEXTS = [
    "I was charged twice this month",
    "\n\nstarts with blank lines",
    "  padded both sides  ",
    "line one\nline two",
    "ends with newline\n",
    "x",
    "the app crashes on login " * 8,
    " \n mixed \t whitespace\n\n",
    "<b>Tom & 'Jo'</b> 数据 🙂",
]


def with_template(dst: Path, template: str, jinja_file: bool = False) -> Path:
    shutil.copytree(qwen_tokenizer_dir(), dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    if jinja_file:
        cfg.pop("chat_template", None)
        (dst / "chat_template.jinja").write_text(template)
    else:
        cfg["chat_template"] = template
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


def transformers_prompt(ref, system: str, text: str, examples) -> list[int]:
    msgs = [{"role": "system", "content": system}]
    for t, label in examples:
        msgs += [{"role": "user", "content": t}, {"role": "assistant", "content": label}]
    msgs.append({"role": "user", "content": text})
    want = ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    return list(want["input_ids"] if hasattr(want, "keys") else want)


@pytest.mark.parametrize("name", [*KEPT, *CHANGED])
def test_every_prompt_is_transformers_or_the_template_is_refused_by_name(name, tmp_path):
    """The three changing templates gave 2/12 and 12/12 prompts silently unlike transformers',
    or a refusal blaming tokenizer.json; the others must stay exactly transformers'."""
    from transformers import AutoTokenizer

    template, what = CHANGED[name] if name in CHANGED else (KEPT[name], None)
    path = with_template(tmp_path / name, template)
    try:
        ours = PromptTokenizer(path)
    except ModelError as e:
        message = str(e)
        assert what is not None, message
        assert message.startswith(
            f"{path / 'tokenizer_config.json'} (chat_template): the chat "
            "template changes the text it is given"
        ), message
        assert what in message and "\n" not in message and "tokenizer.json" not in message
        return
    assert what is None, f"{name}: not refused"
    ref = AutoTokenizer.from_pretrained(path)
    system = default_system_prompt(LABELS)
    for examples in ((), EXAMPLES):
        for text in TEXTS:
            want = transformers_prompt(ref, system, text, examples)
            assert ours.prompt(system, text, examples) == want, (name, examples, text)
        assert ours.prompts(system, TEXTS, examples) == [
            ours.prompt(system, t, examples) for t in TEXTS
        ]


def test_a_chat_template_file_is_named_when_refused(tmp_path):
    path = with_template(tmp_path / "m", CHANGED["lstrip_newlines"][0], jinja_file=True)
    with pytest.raises(ModelError, match="chat template changes the text") as e:
        PromptTokenizer(path)
    assert str(e.value).startswith(f"{path / 'chat_template.jinja'}: ")


def test_a_template_changing_only_labels_is_refused_when_examples_are_used(tmp_path):
    """The examples' contents are probed too: the split with examples is checked when made."""
    from transformers import AutoTokenizer

    template = (
        "{% for message in messages %}{% set c = message['content'] %}"
        "{% if message['role'] == 'assistant' %}{% set c = c | upper %}{% endif %}"
        + TURN.replace("CONTENT", "c")
        + "{% endfor %}"
        + GEN
    )
    path = with_template(tmp_path / "m", template)
    ours, ref = PromptTokenizer(path), AutoTokenizer.from_pretrained(path)
    system = default_system_prompt(LABELS)
    for text in TEXTS:  # no example, no assistant turn: every prompt is transformers'
        assert ours.prompt(system, text) == transformers_prompt(ref, system, text, ())
    with pytest.raises(ModelError, match="chat template changes the text it is given") as e:
        ours.prompt(system, TEXTS[0], EXAMPLES)
    # where, not only which probe (a review: "a text starting with a newline" misled)
    assert "(it renders an example's label otherwise than given)" in str(e.value)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{not json", "cannot be read as JSON"),
        ("[1]", "not a JSON object"),
        ('{"chat_template": 5}', "chat_template is neither a template"),
    ],
)
def test_an_unreadable_tokenizer_config_is_refused_not_passed_over(tmp_path, config, message):
    """A corrupt tokenizer_config.json (or a chat_template of 5) is refused, not read as absent
    (which would build the prompt from another template, silently)."""
    path = tmp_path / "m"
    shutil.copytree(qwen_tokenizer_dir(), path)
    (path / "tokenizer_config.json").write_text(config)
    with pytest.raises(ModelError, match=message) as e:
        PromptTokenizer(path)
    assert str(e.value).startswith(str(path / "tokenizer_config.json"))
