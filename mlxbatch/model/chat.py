"""The checkpoint's own chat template, rendered as transformers renders it, split around the item.

The template (`chat_template.jinja`, else `chat_template` in `tokenizer_config.json`) is
rendered by jinja2's sandbox with transformers' settings (`trim_blocks`, `lstrip_blocks`,
`loopcontrols`, `tojson`, `raise_exception`, `strftime_now`, the tokenizer's special tokens
as variables, `add_generation_prompt=True`) over the conversation: the system prompt, each
few-shot example as a user and an assistant turn, the item as the last user turn.

Every message content is rendered as a marker, so the result is template text with holes:
the part before the item's hole is the same for every item (the shared prefix), the part
after it is the suffix. A marker is rendered padded with whitespace, which shows whether the
template trims that content (Llama 3 and Gemma do: `| trim`); the real content is put in
trimmed the same way. Template text is encoded with its special tokens recognised, contents
as plain text (a user typing `<|im_end|>` gets plain-text tokens, as before).

A template that folds the system prompt into the first user turn (Gemma 3: `system + "\\n\\n"`
in front of the first user content) needs nothing of its own: without examples the first
user turn is the item's, and the system text lands in front of the item's hole, so it is part
of every item's prefix; with examples it lands in the first example's turn. A template that
refuses a system role (it raises) gets the system prompt folded the same way by us: the
first user content becomes `system + "\\n\\n" + content`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..errors import ModelError

PAD = " \n"  # around each marker, to see whether the template trims the content
SPECIAL_VARS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


def marker(i: int) -> str:
    return f"\ue000mlxbatch{i}\ue001"  # private-use characters: in no template, not whitespace


def read_template(model_dir: Path) -> tuple[str | None, dict[str, str]]:
    """(the template source or None, the special-token variables), from the model directory."""
    try:
        cfg = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    variables = {}
    for key in SPECIAL_VARS:
        v = cfg.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            variables[key] = v
    file = model_dir / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8"), variables
    source = cfg.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((t.get("template") for t in source if isinstance(t, dict)
                       and t.get("name") == "default"), None)  # fmt: skip
    return (source if isinstance(source, str) and source.strip() else None), variables


def compile_template(source: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)  # fmt: skip

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])  # fmt: skip
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateError as e:
        raise ModelError(f"the chat template does not compile ({e})") from None


@dataclass(frozen=True)
class Split:
    """A rendered conversation: template text and content holes, in order.

    `parts`: str (template text) or int (content i: 0 the system prompt, 1.. the examples'
    texts and labels in turn, the last the item); `trim[i]`: (left, right) stripped."""

    parts: tuple[str | int, ...]
    trim: dict[int, tuple[bool, bool]]
    item: int

    def fill(self, contents: list[str]) -> list[tuple[str, bool]]:
        """(text, is template text) pieces with the contents put in, trimmed as rendered."""
        out = []
        for p in self.parts:
            if isinstance(p, str):
                out.append((p, True))
            else:
                out.append((self.content(p, contents[p]), False))
        return out

    def content(self, i: int, text: str) -> str:
        left, right = self.trim[i]
        text = text.lstrip() if left else text
        return text.rstrip() if right else text


class ChatTemplate:
    def __init__(self, source: str, variables: dict[str, str]):
        self.template, self.variables = compile_template(source), variables

    def render(self, messages: list[dict]) -> str:
        return self.template.render(messages=messages, add_generation_prompt=True,
                                    **self.variables)  # fmt: skip

    def split(self, n_examples: int) -> Split:
        """Render the conversation (system, n examples, the item) with markers, and find them."""
        import jinja2

        n = 2 + 2 * n_examples  # system, example texts and labels, the item
        m = [PAD + marker(i) + PAD for i in range(n)]
        turns = [{"role": "user", "content": m[1 + 2 * k]} for k in range(n_examples)]
        turns = [x for k, t in enumerate(turns)
                 for x in (t, {"role": "assistant", "content": m[2 + 2 * k]})]  # fmt: skip
        turns.append({"role": "user", "content": m[n - 1]})
        try:
            text = self.render([{"role": "system", "content": m[0]}, *turns])
        except jinja2.exceptions.TemplateError:  # no system role: fold it in ourselves
            first = dict(turns[0], content=m[0] + "\n\n" + turns[0]["content"])
            try:
                text = self.render([first, *turns[1:]])
            except jinja2.exceptions.TemplateError as e:
                raise ModelError(f"the chat template refuses the conversation ({e})") from None
        except Exception as e:  # jinja2's sandbox and the template's own errors
            raise ModelError(f"the chat template cannot be rendered ({e})") from None
        return _find(text, n)


def _find(text: str, n: int) -> Split:
    pieces = re.split("(\ue000mlxbatch\\d+\ue001)", text)
    parts: list[str | int] = []
    trim: dict[int, tuple[bool, bool]] = {}
    for k, piece in enumerate(pieces):
        if k % 2 == 0:
            parts.append(piece)
            continue
        i = int(piece[len("\ue000mlxbatch") : -1])
        if i in trim or i >= n:
            raise ModelError("the chat template renders a message twice: mlxbatch cannot "
                             "find one shared prefix before the item")  # fmt: skip
        before, after = parts[-1], pieces[k + 1]
        left, right = not before.endswith(PAD), not after.startswith(PAD)
        if not left:
            parts[-1] = before[: -len(PAD)]
        if not right:
            pieces[k + 1] = after[len(PAD) :]
        trim[i] = (left, right)
        parts.append(i)
    missing = [i for i in range(n) if i not in trim]
    if missing and n - 1 in missing:
        raise ModelError("the chat template does not render the item's text")
    for i in missing:  # a template that drops a content (the system prompt) renders without it
        trim[i] = (False, False)
    return Split(tuple(p for p in parts if p != ""), trim, n - 1)
