"""The jinja2 sandbox a chat template runs in: transformers' settings, bounds, and a traced text.

A template is code from the checkpoint: a rendering is bounded in time (`SECONDS`), in the
size of any text or number it builds and of what it renders, so a template that loops or
allocates without end is refused by name instead of hanging the load.

`Traced` is a text that records every test of it (`'x' in t`, `t | length`) with its answer,
which can be forced, and every new text made from it (`t[:50]`); whitespace trims are the
only changes allowed, since a split finds them around the item (see chat.py).
"""

from __future__ import annotations

import functools
import json
import math
import sys
import threading
import time
from datetime import datetime

SECONDS = 2.0  # a published template renders a conversation in milliseconds
MOST = 1_000_000  # characters (or list items) a template may build, beyond its contents
TRIMS = ("strip", "lstrip", "rstrip")
TESTS = frozenset(
    {
        "__contains__",
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__len__",
        "startswith",
        "endswith",
        "count",
        "find",
        "rfind",
        "index",
        "rindex",
        "isalnum",
        "isalpha",
        "isascii",
        "isdecimal",
        "isdigit",
        "isidentifier",
        "islower",
        "isnumeric",
        "isprintable",
        "isspace",
        "istitle",
        "isupper",
    }
)
LENGTH = "the text's length"
KEPT_FILTERS = frozenset({"trim", "string", "default", "d", "length", "count"})


class OverBounds(Exception):
    """A rendering that went past a bound (time, size): the template's fault."""


class Trace:
    """What one rendering did with a traced text: its tests (construct, answer) in order,
    answers forced by place, and the new texts made from it. `mark`: a string only the traced
    text holds, to know a text made from it where the trace is lost (a macro's output, `~`)."""

    def __init__(self, forced: dict[int, object] | None = None, mark: str = ""):
        self.forced = forced or {}
        self.tests: list[tuple[str, object]] = []
        self.changes: list[str] = []
        self.mark = mark

    def call(self, name: str, method, args: tuple, kwargs: dict):
        """A method of the traced text called: a test's answer (maybe forced) or a change."""
        if name in TESTS:
            k = len(self.tests)
            answer = self.forced[k] if k in self.forced else method(*args, **kwargs)
            self.tests.append((_construct(name, args), answer))
            return answer
        if not (name in TRIMS and all(a is None for a in (*args, *kwargs.values()))):
            self.changes.append(_construct(name, args))
        return method(*args, **kwargs)


def _construct(name: str, args: tuple) -> str:
    shown = ", ".join(repr(a)[:40] for a in args)
    if name == "__contains__":
        return f"{shown} in the text"
    if name == "__len__":
        return LENGTH
    if name == "__getitem__" and isinstance(args[0], slice):
        k = args[0]
        step = "" if k.step is None else f":{k.step}"
        return f"the slice [{'' if k.start is None else k.start}:{'' if k.stop is None else k.stop}{step}]"
    if name == "__getitem__":
        return f"the index [{shown}]"
    if name.startswith("__"):
        return f"the text {name.strip('_')} {shown}"
    return f".{name}({shown})"


def _method(name: str):
    base = getattr(str, name)

    def traced(self, *args, **kwargs):
        trace = self.trace
        if name == "__add__":
            result = base(self, *args, **kwargs)
            if isinstance(result, str):
                _check_size(_size(result))
                return Traced(result, trace)
            return result
        result = trace.call(name, base.__get__(self), args, kwargs)
        if name in TRIMS and isinstance(result, str):
            # an item is never blank, so a trim that reaches it stops inside it
            return Traced(result, trace)
        return result

    traced.__name__ = name
    return traced


class Traced(str):
    """A text that records what is done with it in `trace` (see the module docstring)."""

    def __new__(cls, text: str, trace: Trace):
        self = super().__new__(cls, text)
        self.trace = trace
        return self

    def __radd__(self, other):
        if not isinstance(other, str):
            return NotImplemented
        _check_size(_size(other) + _size(self))
        return Traced(str.__add__(other, self), self.trace)

    def __iter__(self):
        self.trace.changes.append("the text's characters, one by one")
        return str.__iter__(self)

    __hash__ = str.__hash__


for _name in (
    *TESTS,
    *TRIMS,
    "__add__",
    "__getitem__",
    "__mod__",
    "__mul__",
    "__rmul__",
    "replace",
    "upper",
    "lower",
    "title",
    "capitalize",
    "casefold",
    "swapcase",
    "center",
    "ljust",
    "rjust",
    "zfill",
    "expandtabs",
    "split",
    "rsplit",
    "splitlines",
    "partition",
    "rpartition",
    "removeprefix",
    "removesuffix",
    "format",
    "format_map",
    "join",
    "translate",
    "encode",
):
    setattr(Traced, _name, _method(_name))


def _size(x) -> int:
    """len(x), not recorded as a test of a Traced text."""
    return str.__len__(x) if isinstance(x, str) else len(x)


class _Rendering(threading.local):
    bound = MOST  # the size bound of the rendering under way
    trace: Trace | None = None  # the item's, where one is traced


NOW = _Rendering()


def _check_size(n: float) -> None:
    if n > NOW.bound:
        raise OverBounds(f"builds a text or list of over {NOW.bound:,} items")


def _big_number(args) -> None:
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > NOW.bound:
            raise OverBounds(f"asks for a size of {a:.3g}")


def _holding(value) -> Trace | None:
    """The trace of the item's text, where `value` is it or a plain text made from it."""
    if isinstance(value, Traced):
        return value.trace
    trace = NOW.trace
    if trace is not None and isinstance(value, str) and trace.mark and trace.mark in value:
        return trace
    return None


def _traced_filter(name: str, f):
    @functools.wraps(f)
    def wrapped(*args, **kwargs):
        _big_number((*args, *kwargs.values()))
        for a in args[:2]:
            if (trace := _holding(a)) is not None:
                trace.changes.append(f"| {name}")
        return f(*args, **kwargs)

    return wrapped


def _raise_exception(message):
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _namespace():
    import jinja2

    class Namespace(jinja2.utils.Namespace):
        """transformers' namespace: no underscore-prefixed attributes."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"no namespace attribute {name!r}")

    return Namespace


def environment():
    """transformers' sandbox (see the module docstring), bounded."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}`: renders its body, as transformers."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            call = self.call_method("_body")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _body(self, context, caller):
            return caller()

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+"})

        def call_binop(self, context, operator, left, right):
            if operator == "**" and all(isinstance(x, (int, float)) for x in (left, right)):
                if abs(right) > 64 and math.log2(abs(left) + 1) * abs(right) > 64 * NOW.bound:
                    raise OverBounds(f"computes {left!r:.20} ** {right!r:.20}")
            elif operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(n, int) and hasattr(seq, "__len__"):
                        _check_size(_size(seq) * n)
            elif operator == "+" and hasattr(left, "__len__") and hasattr(right, "__len__"):
                _check_size(_size(left) + _size(right))
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's names)
            _big_number((*args, *kwargs.values()))
            text = getattr(__obj, "__self__", None)
            if not isinstance(text, Traced) and (trace := _holding(text)) is not None:
                method = functools.partial(super().call, __context, __obj)
                return trace.call(__obj.__name__, method, args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    for name, f in list(env.filters.items()):
        if name not in KEPT_FILTERS:
            env.filters[name] = _traced_filter(name, f)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = lambda *args, **kwargs: dict(*args, **kwargs)
    env.globals["namespace"] = _namespace()
    return env


def render(template, extra: int, trace: Trace | None = None, **variables) -> str:
    """`template.render(**variables)` within SECONDS and MOST characters beyond `extra` (the
    contents'), else OverBounds; `trace`: the item's, for the texts made from it."""
    NOW.bound, NOW.trace = MOST + 4 * extra, trace
    deadline, lines = time.monotonic() + SECONDS, [0]

    def on_line(frame, event, arg):
        lines[0] += 1
        if lines[0] % 512 == 0 and time.monotonic() > deadline:
            raise OverBounds(f"runs over {SECONDS:g} s (a loop that does not end?)")
        return on_line

    def on_call(frame, event, arg):  # only the template's own code is traced line by line
        return on_line if frame.f_code.co_filename == "<template>" else None

    before = sys.gettrace()
    sys.settrace(on_call)
    try:
        out, size = [], 0
        for chunk in template.generate(**variables):
            size += _size(chunk)
            if size > NOW.bound:
                raise OverBounds(f"renders over {NOW.bound:,} characters")
            out.append(chunk)
        return "".join(out)
    finally:
        sys.settrace(before)
        NOW.trace = None
