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

That split is exact only for a template that puts each content in as it is given, or trimmed
(`| trim`, `.strip()`). One that changes it otherwise (`.lstrip('\\n')`, `| replace('\\n', ' ')`)
or branches on it (`{% if message['content'] | length > 40 %}`) would render the marker, not
the text, and every prompt would differ silently from transformers'. So each split is checked
when it is made: the conversation is rendered again with every content set to each of a few
probe texts (`PROBES`: leading and trailing newlines and spaces, inner newlines, one
character, a long text, characters a template might escape, non-ASCII), and the rendering
must equal the split filled with those texts. A template that fails is refused, by name,
with what it does to the text (a `ModelError` at load; for a split with examples, when the
job is set up). Rendering the whole template per item instead was not taken: once a template
has changed a text, where the text lies in the rendering is unknown, so contents could no longer
be encoded as plain text (the rule above) without guessing, and the published templates tested
here (Qwen 2.5, Llama 3, Gemma 3, Mistral v3, Phi-3 style) all pass the probes. The check is
one render per probe when a split is made (2 ms a split for Qwen 2.5's template without
examples, 6 ms with two, on this 2-core host), nothing per item.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..errors import ModelError

PAD = " \n"  # around each marker, to see whether the template trims the content
# Texts every content is set to in turn, to see that the template puts a content in as given
# (or trimmed): (text, what it is, for the error). None is whitespace only (an empty system
# prompt folded into a trimmed user turn is one trimmed run, not two) and the short ones stay
# under 30 characters, so that a length test is reported as the long text's.
PROBES = (
    ("\n\nstarts with blank lines", "a text starting with a newline"),
    ("ends with a newline\n", "a text ending with a newline"),
    ("  padded with spaces  ", "a text with leading or trailing spaces"),
    ("line one\nline two\n\nline 4", "a text with newlines inside"),
    ("x", "a one-character text"),
    ('<b>Tom & "Jo"</b> 5 > 3 \\', "a text with characters a template might escape"),
    ("数据 ünïcode 🙂", "a non-ASCII text"),
    (" ".join(["word"] * 400), "a 2,000-character text"),
)
PROCESSOR_TEMPLATE = (
    "chat_template.json"  # where a processor keeps it (vision-language checkpoints)
)
SPECIAL_VARS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


def marker(i: int) -> str:
    return f"\ue000mlxbatch{i}\ue001"  # private-use characters: in no template, not whitespace


def read_template(model_dir: Path) -> tuple[str | None, dict[str, str], str]:
    """(the template source or None, the special-token variables, where the source is), from
    the model directory."""
    path = model_dir / "tokenizer_config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        cfg = {}
    except (OSError, ValueError) as e:  # read as absent, it ran another template, silently
        raise ModelError(f"{path}: cannot be read as JSON ({str(e)[:100]})") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{path}: not a JSON object")
    template = cfg.get("chat_template")
    if template is not None and not isinstance(template, (str, list)):
        raise ModelError(f"{path}: chat_template is neither a template nor a list of named ones")
    variables = {}
    for key in SPECIAL_VARS:
        v = cfg.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            variables[key] = v
    file = model_dir / "chat_template.jinja"
    source, where = _default_of(cfg.get("chat_template")), f"{path} (chat_template)"
    if file.is_file():
        source, where = file.read_text(encoding="utf-8"), str(file)
    elif source is None and (model_dir / PROCESSOR_TEMPLATE).is_file():
        source, where = _processor_template(model_dir / PROCESSOR_TEMPLATE)
    if isinstance(source, str) and not source.strip():  # read as absent, ChatML ran silently
        raise ModelError(f"{where}: an empty template; mend it, or remove it (ChatML runs "
                         "without one)")  # fmt: skip
    return (source if isinstance(source, str) else None), variables, where


def _processor_template(path: Path) -> tuple[str, str]:
    """A vision-language checkpoint's template where its tokenizer has none: its processor's
    `chat_template.json` ({"chat_template": "..."}), as transformers' processors save it. A
    file there that holds no template is refused: read as absent, ChatML ran in its place."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise ModelError(f"{path}: cannot be read as JSON ({str(e)[:100]})") from None
    source = _default_of(data.get("chat_template")) if isinstance(data, dict) else None
    if not isinstance(source, str) or not source.strip():
        raise ModelError(f'{path}: holds no template (expected {{"chat_template": "..."}}); '
                         "mend it or remove it (ChatML runs without one)")  # fmt: skip
    return source, f"{path} (chat_template)"


def _default_of(source):
    """A template, or of a list of named ones the one named "default" (None if none is)."""
    if isinstance(source, list):
        return next((t.get("template") for t in source if isinstance(t, dict)
                     and t.get("name") == "default"), None)  # fmt: skip
    return source


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


def _difference(split: Split, contents: list[str], text: str) -> str:
    """Where a rendering first departs from the split's, in which message, and how (a template
    that upper-cases labels fails every probe: the first probe's name alone misled)."""
    pieces = [(p if isinstance(p, str) else split.content(p, contents[p]), p) for p in split.parts]
    expected = "".join(piece for piece, _ in pieces)
    at = next((i for i, (a, b) in enumerate(zip(text, expected)) if a != b),
              min(len(text), len(expected)))  # fmt: skip
    ends = itertools.accumulate(len(piece) for piece, _ in pieces)
    hole = next((p for (_, p), end in zip(pieces, ends) if end > at), "")
    role = "the template's own text" if isinstance(hole, str) else _role(hole, split.item)
    return f": in {role}, {text[at : at + 24]!r} where {expected[at : at + 24]!r} was expected"


def _role(i: int, item: int) -> str:
    """Content i of a conversation (see `Split`), in words."""
    if i == item:
        return "the item"
    return "the system prompt" if i == 0 else "an example's text" if i % 2 else "an example's label"


def _altered(split: Split) -> str | None:
    """The content whose marker the template rendered changed (upper-cased, say), or None."""
    for p in split.parts:
        if isinstance(p, str) and (m := re.search("\ue000mlxbatch(\\d+)", p, re.IGNORECASE)):
            return _role(int(m.group(1)), split.item)
    return None


class ChatTemplate:
    def __init__(self, source: str, variables: dict[str, str], where: str = "the chat template"):
        self.template, self.variables, self.where = compile_template(source), variables, where

    def render(self, messages: list[dict]) -> str:
        return self.template.render(messages=messages, add_generation_prompt=True,
                                    **self.variables)  # fmt: skip

    def split(self, n_examples: int) -> Split:
        """Render the conversation (system, n examples, the item) with markers, and find them;
        refuse a template that renders a probe text otherwise than the split would put it in."""
        n = 2 + 2 * n_examples  # system, example texts and labels, the item
        split = _find(self.conversation([PAD + marker(i) + PAD for i in range(n)]), n)
        if altered := _altered(split):
            raise self._changes(f"it renders {altered} otherwise than given")
        for probe, what in PROBES:
            contents = [probe] * n
            try:
                text, failed = self.conversation(contents), ""
            except ModelError as e:  # the template's own error, for the message
                text, failed = None, f": {e}"
            if text != "".join(t for t, _ in split.fill(contents)):
                found = failed or _difference(split, contents, text)
                raise self._changes(f"{what} renders differently{found}")
        return split

    def _changes(self, how: str) -> ModelError:
        return ModelError(f"{self.where}: the chat template changes the text it is given "
                          f"({how}), so mlxbatch cannot put each text into one prompt; edit "
                          "the template to insert message['content'] as it is (or with | trim)")  # fmt: skip

    def conversation(self, contents: list[str]) -> str:
        """The rendering of contents[0] as the system prompt, then pairs of example text and
        label as user and assistant turns, the last as the item's user turn."""
        import jinja2

        turns = [{"role": "user", "content": contents[k]} for k in range(1, len(contents) - 1, 2)]
        turns = [x for k, t in enumerate(turns)
                 for x in (t, {"role": "assistant", "content": contents[2 + 2 * k]})]  # fmt: skip
        turns.append({"role": "user", "content": contents[-1]})
        try:
            return self.render([{"role": "system", "content": contents[0]}, *turns])
        except jinja2.exceptions.TemplateError:  # no system role: fold it in ourselves
            first = dict(turns[0], content=contents[0] + "\n\n" + turns[0]["content"])
            try:
                return self.render([first, *turns[1:]])
            except jinja2.exceptions.TemplateError as e:
                raise ModelError(f"the chat template refuses the conversation ({e})") from None
        except Exception as e:  # jinja2's sandbox and the template's own errors
            raise ModelError(f"the chat template cannot be rendered ({e})") from None


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
