"""The checkpoint's own chat template, rendered as transformers renders it, split around the item.

The template (`chat_template.jinja`, else `chat_template` in `tokenizer_config.json`) is
rendered by jinja2's sandbox with transformers' settings over the conversation: the system
prompt, each few-shot example as a user and an assistant turn, the item as the last user turn.

Every content is rendered as a marker padded with whitespace, so the result is template text
with holes (the part before the item's hole is every item's shared prefix), and the padding
shows whether the template trims a content. Template text is encoded with its special tokens
recognised, contents as plain text. A template that refuses a system role gets the system
prompt folded into the first user turn, as Gemma 3's template does itself.

The split is exact only for a template that puts each content in as given, or trimmed, so
each split is checked when made: the item's text is traced through the template, and the
rendering with every content set to each of `PROBES` must equal the split filled with them.
A template that fails is refused, by name, with what it does to the text. Rendering per item
instead would lose where the text lies, so contents could not be encoded as plain text.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError, one_line
from . import template_env

PAD = " \n"  # around each marker, to see whether the template trims the content
# (text, what it is): none is whitespace only (a folded empty system prompt would be one
# trimmed run, not two); short ones stay under 30 characters so a length test names the long one.
PROBES = (
    ("\n\nstarts with blank lines", "a text starting with a newline"),
    ("ends with a newline\n", "a text ending with a newline"),
    ("  padded with spaces  ", "a text with leading or trailing spaces"),
    ("line one\nline two\n\nline 4", "a text with newlines inside"),
    ("x", "a one-character text"),
    ('<b>Tom & "Jo"</b> 5 > 3 \\', "a text with characters a template might escape"),
    ("数据 ünïcode 🙂", "a non-ASCII text"),
    (" ".join(["word"] * 400), "a 2,000-character text"),
    ("Ends in punctuation!", "a text ending in punctuation"),
    ("my password is hunter2", "a text with a word a template might hide"),
    ("before </think> after", "a text holding </think>"),
    ("<tool_response>x</tool_response>", "a text wrapped in tags"),
)
MOST_SOURCE = 1_000_000  # characters of template source
MOST_BRANCHES = 256  # renderings of one conversation with a test of the item answered otherwise
PROCESSOR_TEMPLATE = (
    "chat_template.json"  # where a processor keeps it (vision-language checkpoints)
)
SPECIAL_VARS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


def marker(i: int) -> str:
    return f"\ue000mlxbatch{i}\ue001"  # private-use characters: in no template, not whitespace


def read_template(model_dir: Path) -> tuple[str | None, dict[str, str], str]:
    """(template source or None, special-token variables, where the source is) of a model."""
    path = model_dir / "tokenizer_config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        cfg = {}
    except (OSError, ValueError) as e:  # read as absent, another template would run
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
    where = f"{path} (chat_template)"
    source = _default_of(cfg.get("chat_template"), where)
    if file.exists() or file.is_symlink():  # a directory or a broken link is not "absent"
        source, where = _read_text(file), str(file)
    elif source is None and (model_dir / PROCESSOR_TEMPLATE).is_file():
        source, where = _processor_template(model_dir / PROCESSOR_TEMPLATE)
    if isinstance(source, str) and not source.strip():  # read as absent, ChatML would run
        raise ModelError(
            f"{where}: an empty template; mend it, or remove it (ChatML runs without one)"
        )
    return (source if isinstance(source, str) else None), variables, where


def _read_text(file: Path) -> str:
    """A template file's text; an unreadable one is refused (read as absent, another would run)."""
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ModelError(
            f"{file}: not UTF-8 text (byte {e.start + 1}); save the template as UTF-8"
        ) from None
    except (OSError, RuntimeError) as e:  # a directory, a link loop, no permission
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ModelError(f"{file}: cannot be read as a chat template ({why})") from None


def _processor_template(path: Path) -> tuple[str, str]:
    """A vision-language checkpoint's processor template (`{"chat_template": "..."}`); one
    holding no template is refused, since read as absent ChatML would run in its place."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise ModelError(f"{path}: cannot be read as JSON ({str(e)[:100]})") from None
    where = f"{path} (chat_template)"
    source = _default_of(data.get("chat_template"), where) if isinstance(data, dict) else None
    if not isinstance(source, str) or not source.strip():
        raise ModelError(
            f'{path}: holds no template (expected {{"chat_template": "..."}}); '
            "mend it or remove it (ChatML runs without one)"
        )
    return source, where


def _default_of(source, where: str):
    """A template, or the one named "default" of a list (refused without one, as transformers)."""
    if not isinstance(source, list):
        return source
    named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
    if "default" not in named:
        names = ", ".join(repr(n) for n in named if isinstance(n, str)) or "none"
        raise ModelError(
            f"{where}: a list of named chat templates ({names}) and none named "
            "'default', which transformers needs to choose one; name one "
            "'default'"
        )
    return named["default"]


def compile_template(source: str, where: str = "the chat template"):
    import jinja2

    if len(source) > MOST_SOURCE:  # published templates are under 20,000 characters
        raise ModelError(
            f"{where}: the chat template is {len(source):,} characters (mlxbatch "
            f"takes at most {MOST_SOURCE:,})"
        )
    try:
        return template_env.environment().from_string(source)
    except jinja2.exceptions.TemplateError as e:
        raise ModelError(f"{where}: the chat template does not compile ({e})") from None
    except (RecursionError, MemoryError):
        raise ModelError(f"{where}: the chat template does not compile (nested too deep)") from None


@dataclass(frozen=True)
class Split:
    """A rendered conversation: template text and content holes, in order.

    `parts`: str (template text) or int (content i: 0 the system prompt, 1.. the examples'
    texts and labels in turn, the last the item); `trim[i]`: (left, right) stripped."""

    parts: tuple[str | int, ...]
    trim: dict[int, tuple[bool, bool]]
    item: int
    dropped: tuple[int, ...] = ()  # contents the template leaves out

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
    """Where a rendering first departs from the split's, in which message, and how."""
    pieces = [(p if isinstance(p, str) else split.content(p, contents[p]), p) for p in split.parts]
    expected = "".join(piece for piece, _ in pieces)
    at = next(
        (i for i, (a, b) in enumerate(zip(text, expected)) if a != b), min(len(text), len(expected))
    )
    ends = itertools.accumulate(len(piece) for piece, _ in pieces)
    hole = next((p for (_, p), end in zip(pieces, ends) if end > at), "")
    role = "the template's own text" if isinstance(hole, str) else _role(hole, split.item)
    return f": in {role}, {text[at : at + 24]!r} where {expected[at : at + 24]!r} was expected"


def _role(i: int, item: int) -> str:
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
        self.template, self.variables = compile_template(source, where), variables
        self.where = where

    def render(self, messages: list[dict], generation: bool = True, trace=None) -> str:
        """The template over `messages` within the sandbox's bounds; TemplateError passes."""
        import jinja2

        extra = sum(str.__len__(m["content"]) for m in messages)  # not a test of a Traced
        try:
            return template_env.render(
                self.template,
                extra,
                trace,
                messages=messages,
                add_generation_prompt=generation,
                **self.variables,
            )
        except jinja2.exceptions.TemplateError:
            raise
        except template_env.OverBounds as e:
            raise ModelError(
                f"{self.where}: the chat template {e}; mlxbatch refuses a template past its bounds"
            ) from None
        except (RecursionError, MemoryError) as e:
            what = "recurses too deep" if isinstance(e, RecursionError) else "runs out of memory"
            raise ModelError(f"{self.where}: the chat template {what} when rendered") from None
        except Exception as e:  # jinja2's sandbox and the template's own errors
            raise ModelError(
                f"{self.where}: the chat template cannot be rendered "
                f"({type(e).__name__}: {one_line(e, 120)})"
            ) from None

    def split(self, n_examples: int) -> Split:
        """The conversation rendered with markers and split; checked (`check`) before it is used."""
        n = 2 + 2 * n_examples  # system, example texts and labels, the item
        split = _find(self.conversation([PAD + marker(i) + PAD for i in range(n)]), n)
        if altered := _altered(split):
            raise self._changes(f"it renders {altered} otherwise than given")
        self.check(split, [PAD + marker(i) + PAD for i in range(n)])  # names what it does
        return split

    def check(self, split: Split, contents: list[str]) -> None:
        """Refuse a template that renders `contents` (the last, the item's, unused) otherwise
        than `split` puts them in, or whose rendering depends on the item's text.

        The item is a `Traced` text: a new text made from it is refused, and each test of it
        (`| length > 40`) is answered otherwise in turn, each rendering to equal the first;
        the probe texts catch what escapes the trace (`'%.50s' % text`)."""
        import jinja2

        item = PAD + marker(split.item) + PAD
        shared = list(contents[:-1])
        expected = "".join(t for t, _ in split.fill([*shared, item]))
        paths: list[dict[int, object]] = [{}]
        for renders in itertools.count():
            if not paths:
                break
            if renders == MOST_BRANCHES:
                raise self._changes(
                    f"its rendering tests the item's text in over {MOST_BRANCHES} ways"
                )
            forced = paths.pop()
            trace = template_env.Trace(forced, marker(split.item))
            try:
                traced = template_env.Traced(item, trace)
                text = self.conversation([*shared, traced], not forced, trace)
            except jinja2.exceptions.TemplateError:  # a branch the template refuses itself
                continue
            if trace.changes:
                raise self._changes(f"it makes a new text from the item's with {trace.changes[0]}")
            if text != expected:
                if forced:
                    k = max(forced)
                    raise self._changes(
                        f"its rendering depends on {trace.tests[k][0]} when that is the item's text"
                    )
                raise self._changes(_difference(split, [*shared, item], text).removeprefix(": "))
            for k in range(len(forced), len(trace.tests)):
                answers = {i: a for i, (_, a) in enumerate(trace.tests[:k])}
                paths += [{**answers, k: a} for a in _other_answers(*trace.tests[k])]
        for probe, what in PROBES:
            self._probe(split, [*shared, probe], what)

    def _probe(self, split: Split, contents: list[str], what: str) -> None:
        try:
            text, failed = self.conversation(contents), ""
        except ModelError as e:  # the template's own error, for the message
            text, failed = None, f": {e}"
        if text != "".join(t for t, _ in split.fill(contents)):
            raise self._changes(
                f"{what} renders differently{failed or _difference(split, contents, text)}"
            )

    def _changes(self, how: str) -> ModelError:
        return ModelError(
            f"{self.where}: the chat template changes the text it is given "
            f"({how}), so mlxbatch cannot put each text into one prompt; edit "
            "the template to insert message['content'] as it is (or with | trim)"
        )

    def conversation(self, contents: list[str], own_errors: bool = True, trace=None) -> str:
        """contents[0] as system prompt, (text, label) pairs as turns, the last as the item."""
        import jinja2

        turns = [{"role": "user", "content": contents[k]} for k in range(1, len(contents) - 1, 2)]
        turns = [
            x
            for k, t in enumerate(turns)
            for x in (t, {"role": "assistant", "content": contents[2 + 2 * k]})
        ]
        turns.append({"role": "user", "content": contents[-1]})
        try:
            return self.render([{"role": "system", "content": contents[0]}, *turns], True, trace)
        except jinja2.exceptions.TemplateError:  # no system role: fold it in ourselves
            first = dict(turns[0], content=contents[0] + "\n\n" + turns[0]["content"])
            try:
                return self.render([first, *turns[1:]], True, trace)
            except jinja2.exceptions.TemplateError as e:
                if not own_errors:
                    raise
                raise ModelError(
                    f"{self.where}: the chat template refuses the conversation ({one_line(e, 120)})"
                ) from None

    def notes(self, split: Split) -> list[str]:
        """One line each for a dropped system prompt or a missing generation prompt."""
        out = []
        if split.dropped and 0 in split.dropped:
            out.append(
                f"{self.where}: the chat template drops the system prompt, so the model "
                "is not told the labels"
            )
        messages = [{"role": "user", "content": "x"}]
        try:
            same = self.render(messages) == self.render(messages, generation=False)
        except Exception:  # a template that needs a system turn: `split` has rendered it
            same = False
        if same:
            out.append(
                f"{self.where}: the chat template adds no generation prompt, so each "
                "label is scored right after the item's turn"
            )
        return out


def _other_answers(construct: str, answer) -> tuple:
    """The answers a test could give for another text: the other truth value; for a count or a
    position, sizes from none to a million (a threshold anywhere between lies between two)."""
    if isinstance(answer, bool):
        return (not answer,)
    if isinstance(answer, int):
        least = 1 if construct == template_env.LENGTH else -1  # an item is never empty
        return tuple(
            n
            for n in (-1, 0, 1, 2, 10, 50, 100, 1000, 5000, 10**5, 10**6)
            if n != answer and n >= least
        )
    return ()


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
            raise ModelError(
                "the chat template renders a message twice: mlxbatch cannot "
                "find one shared prefix before the item"
            )
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
    return Split(tuple(p for p in parts if p != ""), trim, n - 1, tuple(missing))
