"""What a request may be: the limits, the body read under its cap and deadline, its shape."""

from __future__ import annotations

import asyncio
import codecs
import difflib
import json
import math
import sys
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request

from ..errors import unicode_problem
from ..io.formats import json_kind
from .errors import ApiError

MB = 2**20


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 2 * MB  # like TEI's 2 MB payload limit
    max_inputs: int = 256  # texts in one request
    max_tokens: int | None = 2048  # an item's prompt; the model's context caps it too
    max_queue: int = 1024  # items waiting in the scheduler
    max_wait_s: float = 0.005  # how long the oldest queued item waits for company

    def as_dict(self) -> dict:
        return {
            "max_body_bytes": self.max_body_bytes,
            "max_inputs_per_request": self.max_inputs,
            "max_tokens": self.max_tokens,
            "max_queue": self.max_queue,
            "max_wait_ms": self.max_wait_s * 1000,
        }


@dataclass(frozen=True)
class ClassifyBody:
    """A /v1/classify body once parsed: its texts, and whether a long one is cut to fit."""

    texts: list[str]
    truncate: bool


CLOSE = {"Connection": "close"}  # the connection cannot carry another request after it
FIELDS = {"model", "input", "truncate", "user"}  # "user": accepted as OpenAI clients send it


async def read_body(
    request: Request, cap: int, deadline: float, clocks: set[asyncio.Timeout]
) -> bytes:
    """The body, or 413 past `cap` bytes, or 408 past `deadline` (in `clocks`: a drain cuts it)."""
    declared = request.headers.get("content-length")
    if declared is not None and "transfer-encoding" in request.headers:  # RFC 9112 6.3: the
        raise ApiError(
            400, "the request has both Content-Length and Transfer-Encoding", CLOSE
        )  # length is ambiguous (request smuggling behind a proxy)
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise ApiError(
            413, f"the body is {int(declared):,} bytes; the limit is {cap:,} (--max-body-mb)"
        )
    chunks, size = [], 0
    try:
        async with asyncio.timeout(deadline) as clock:
            clocks.add(clock)
            try:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > cap:
                        raise ApiError(
                            413, f"the body passes the limit of {cap:,} bytes (--max-body-mb)"
                        )
                    chunks.append(chunk)
            finally:
                clocks.discard(clock)
    except TimeoutError:
        raise ApiError(
            408, f"the body did not all arrive within {deadline:g} s ({size:,} bytes came)", CLOSE
        ) from None
    return b"".join(chunks)


# A body past this size is parsed on a worker thread: 2 MB of small JSON values takes tenths
# of a second, which would hold every other connection; short requests stay on the loop.
THREAD_BYTES = 64 * 1024


async def parse_body(body: bytes, limits: Limits, models: tuple[str, ...]) -> ClassifyBody:
    """parse_classify, off the event loop when the body is large enough to hold it."""
    if len(body) < THREAD_BYTES:
        return parse_classify(body, limits, models)
    return await asyncio.to_thread(parse_classify, body, limits, models)


def parse_classify(body: bytes, limits: Limits, models: tuple[str, ...]) -> ClassifyBody:
    """The request's texts, or the ApiError (400, 404, 413) naming the field or the item."""
    try:  # UTF-8 alone (RFC 8259), a byte order mark passed over: json.loads read UTF-16/32 too
        text = body.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not UTF-8 ({e.reason} at byte {e.start:,})") from None
    try:
        doc = json.loads(
            text,
            object_pairs_hook=_unique,
            parse_int=_int,
            parse_float=_float,
            parse_constant=_not_json,
        )
    except _NotJson as e:
        raise ApiError(400, f"the body is not valid JSON ({e.args[0]})") from None
    except _LongNumber as e:
        raise ApiError(
            400,
            f"the body holds a number of {e.args[0]:,} digits (the most is "
            f"{sys.get_int_max_str_digits():,})",
        ) from None
    except json.JSONDecodeError as e:
        raise ApiError(400, f"the body is not valid JSON ({e})") from None
    except RecursionError:
        raise ApiError(400, "the body nests too deeply to be a request") from None
    except _Repeated as e:
        raise ApiError(400, f"the body names {e.args[0]!r} twice") from None
    if not isinstance(doc, dict):
        raise ApiError(400, f'the body must be a JSON object with "input", not {json_kind(doc)}')
    unknown = sorted(set(doc) - FIELDS)
    if unknown:  # named up to 5, each cut to 100 characters: the reply stays small
        shown = [k if len(k) <= 100 else k[:100] + "..." for k in unknown[:5]]
        near = [
            f"{k!r} (did you mean {m[0]!r}?)"
            for k in shown
            if (m := difflib.get_close_matches(k, sorted(FIELDS), 1))
        ]
        more = f" and {len(unknown) - 5:,} more" if len(unknown) > 5 else ""
        raise ApiError(
            400,
            f"unknown field(s) {', '.join(near) or shown}{more}: a request has "
            f"{', '.join(sorted(FIELDS))}; the model, labels and prompt are set when "
            "the server starts",
        )
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, f'"model" must be a string, not {json_kind(model)}')
    if model is not None and model not in models:
        shown = (
            repr(model) if len(model) <= 200 else f"{model[:200]!r}... ({len(model):,} characters)"
        )
        raise ApiError(404, f"model {shown} is not served here (this server serves {models[0]!r})")
    truncate = doc.get("truncate", False)
    if not isinstance(truncate, bool):
        raise ApiError(400, f'"truncate" must be true or false, not {json_kind(truncate)}')
    return ClassifyBody(_texts(doc, limits.max_inputs), truncate)


def _texts(doc: dict, max_inputs: int) -> list[str]:
    if "input" not in doc:
        raise ApiError(400, 'the body has no "input" (a string or a list of strings)')
    texts = doc["input"]
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list):
        raise ApiError(
            400, f'"input" must be a string or a list of strings, not {json_kind(texts)}'
        )
    if not texts:
        raise ApiError(400, '"input" is an empty list')
    if len(texts) > max_inputs:
        raise ApiError(
            413,
            f'"input" holds {len(texts):,} texts; the limit is {max_inputs:,} '
            "a request (--max-inputs-per-request)",
        )
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ApiError(400, f"input[{i}] must be a string, not {json_kind(t)}")
        if problem := unicode_problem(t):
            raise ApiError(400, f"input[{i}] holds {problem}")
        if not t.strip():
            raise ApiError(400, f"input[{i}] is empty (as classify refuses an empty row)")
    return texts


class _Repeated(ValueError):
    pass


class _LongNumber(Exception):
    pass


def _int(digits: str) -> int:
    """A JSON integer; one past Python's digit limit is the client's error, not a 500."""
    try:
        return int(digits)
    except ValueError:
        raise _LongNumber(len(digits.lstrip("-"))) from None


class _NotJson(ValueError):
    pass


def _not_json(word: str):
    """NaN, Infinity and -Infinity, which Python's json reads and JSON does not have."""
    raise _NotJson(f"{word} is not a JSON number")


def _float(text: str) -> float:
    """A JSON number; one past a float's range (1e999) is no number a client means."""
    value = float(text)
    if math.isinf(value):
        raise _NotJson(f"{text[:40]} is past a float's range")
    return value


def _unique(pairs: list) -> dict:
    """A JSON object whose keys are all different (json keeps the last of a repeated key)."""
    doc = {}
    for key, value in pairs:
        if key in doc:
            raise _Repeated(key)
        doc[key] = value
    return doc


__all__ = [
    "ClassifyBody",
    "ClientDisconnect",
    "Limits",
    "parse_body",
    "parse_classify",
    "read_body",
]
