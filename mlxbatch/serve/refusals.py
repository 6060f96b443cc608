"""What the protocol refuses below the app, in what words, and the whole replies it writes to
a connection about to close (connections.py writes them)."""

from __future__ import annotations

import json
from http import HTTPStatus
from urllib.parse import urlsplit

import h11
from uvicorn.protocols.http import h11_impl

from .errors import TYPES

# h11 parses a chunked body a chunk at a time on the event loop (~9 us a chunk): past
# FREE_CHUNKS, chunks must average CHUNK_BYTES, bounding a 2 MB body at ~5,000 chunks.
FREE_CHUNKS = 1024
CHUNK_BYTES = 512


def closing_reply(status: int, message: str) -> bytes:
    """A whole error reply in the service's shape for a connection about to close, its length counted."""
    body = json.dumps({"error": {"message": message, "type": TYPES[status], "code": status}})
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"content-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body.encode())}\r\n\r\n"
    )
    return (head + body).encode()


# made by closing_reply: a length typed by hand cuts the JSON off
REFUSED = closing_reply(503, "too many open connections; retry later")
HEAD_SLOW = "the request head came too slowly"
HEAD_TIMEOUT = closing_reply(408, HEAD_SLOW)
NOT_HTTP = "the request is not valid HTTP/1.1"
INVALID_HTTP = closing_reply(400, NOT_HTTP)
# h11's buffer: it refuses a head that outgrows it only while it waits for more, so one that
# came in a single read is measured again once parsed
MAX_HEAD = h11_impl.DEFAULT_MAX_INCOMPLETE_EVENT_SIZE  # h11's own, as uvicorn imports it
HEAD_TOO_LARGE = f"the request line and headers are too large ({MAX_HEAD // 1024} KB at most)"


def head_size(event: h11.Request) -> int:
    """The bytes of a parsed request's target and header lines (name, ": ", value, CRLF)."""
    return len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)


def origin_form(target: bytes) -> bytes | None:
    """The request target as a path (and query): itself when it is one, the path of an http(s)
    URL (absolute form, as a proxy sends), or None for anything else."""
    if target.startswith(b"/") or target == b"*":
        return target
    try:
        url = urlsplit(target)
    except ValueError:  # "http://[::1/": a bracket never closed
        return None
    if url.scheme not in (b"http", b"https") or not url.hostname or b"@" in url.netloc:
        return None
    return (url.path or b"/") + (b"?" + url.query if url.query else b"")


def http10_framing(event: h11.Request) -> tuple[int, str] | None:
    """(status, why) for an HTTP/1.0 request whose body is not framed by Content-Length, its only
    framing (RFC 9112 6.1): chunked is 400, a POST without a length 411; None otherwise."""
    if event.http_version != b"1.0":
        return None
    names = {k.lower() for k, _ in event.headers}
    if b"transfer-encoding" in names:
        return 400, "Transfer-Encoding is not HTTP/1.0: send the body with Content-Length"
    if event.method == b"POST" and b"content-length" not in names:
        return 411, "an HTTP/1.0 request's body needs Content-Length"
    return None
