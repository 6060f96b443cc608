"""`mlxbatch serve` at the edge of HTTP, over raw sockets on the loopback: a request target in
absolute form (what a proxy sends), a request head over h11's limit, and a percent-encoded
slash in the path. Every reply is read until the server closes, under the socket's bound."""

from __future__ import annotations

import json
import time

import pytest
from test_serve import running, wait_for
from test_serve_hostile import FAST, HEAD, body_of, connect, read_until_closed

BODY = json.dumps({"input": "my invoice is wrong"}).encode()


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    with running(tiny_model_dir, *FAST, tmp=tmp_path_factory.mktemp("edges")) as s:
        yield s
    assert "Traceback" not in s.log.read_text()


def exchange(port: int, request: bytes) -> bytes:
    with connect(port) as s:
        s.sendall(request)
        return read_until_closed(s)


def classify(target: bytes) -> bytes:
    return (
        b"POST "
        + target
        + HEAD[len(b"POST /v1/classify") :]
        + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(BODY)
        + BODY
    )


def get(target: bytes) -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def test_an_absolute_form_target_is_served_as_its_path(server):
    """RFC 9112 §3.2.2: a server accepts `http://host/path` as the target (a proxy sends it);
    it was a 404, its "path" the whole URL."""
    here = b"http://127.0.0.1:%d" % server.port
    reply = exchange(server.port, classify(here + b"/v1/classify"))
    assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
    assert len(body_of(reply)["data"]) == 1
    for target in (here + b"/health?probe=1", b"HTTPS://elsewhere.example/health"):
        assert exchange(server.port, get(target)).startswith(b"HTTP/1.1 200"), target


@pytest.mark.parametrize(
    "target", [b"ftp://x/health", b"http:/health", b"health", b"http://user@x/health", b"x:80"]
)
def test_a_target_neither_a_path_nor_an_http_url_is_400(server, target):
    reply = exchange(server.port, get(target))
    assert reply.startswith(b"HTTP/1.1 400"), reply[:300]
    assert body_of(reply)["error"]["type"] == "invalid_request"


@pytest.mark.parametrize("header_kb", [200, 2000])
def test_a_head_over_the_limit_is_431_and_counted(server, header_kb):
    """h11 refuses a head over its buffer with a hint of 431, which was answered 400 "not
    valid HTTP"; a head far over it is still being sent when the 431 goes out, and the reply
    must not be lost to a reset."""
    before = server.metric('mlxbatch_requests_total{outcome="headers_too_large"')
    with connect(server.port) as s:
        try:
            s.sendall(get(b"/health")[:-2] + b"X-Big: " + b"a" * header_kb * 1000 + b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered before the whole head was sent: fine, if the reply can be read
        reply = read_until_closed(s)
    head, body = reply.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), head
    assert b"content-type: application/json" in head and b"connection: close" in head
    error = json.loads(body)["error"]
    assert error["type"] == "headers_too_large" and error["code"] == 431 and error["message"]
    wait_for(
        lambda: server.metric('mlxbatch_requests_total{outcome="headers_too_large"') == before + 1,
        "the 431 counted",
    )


@pytest.mark.parametrize("target", [b"/v1%2Fclassify", b"/v1%2fclassify"])
def test_an_encoded_slash_is_not_a_path_separator(server, target):
    """uvicorn decodes the path before routing: /v1%2Fclassify was served as /v1/classify.
    Other escapes still decode (%79 is "y")."""
    reply = exchange(server.port, classify(target))
    assert reply.startswith(b"HTTP/1.1 404"), reply[:300]
    assert body_of(reply)["error"]["type"] == "not_found"
    assert exchange(server.port, classify(b"/v1/classif%79")).startswith(b"HTTP/1.1 200")


def test_a_head_over_the_limit_in_one_read_is_431_too(server):
    """h11 checks its buffer only while it waits for more: a 40 KB head that came in one read
    was parsed and served (200)."""
    big = get(b"/health")[:-2] + b"X-Big: " + b"a" * 40_000 + b"\r\n\r\n"
    assert len(big) < 65536  # one read of the socket
    reply = exchange(server.port, big)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:300]


def test_a_refused_head_lingers_past_the_head_deadline_without_a_second_reply(server):
    """The 431's lingering close kept the head's timer: a client still sending after
    --timeout-header (1 s here) got a 408 written after the 431 (a traceback in the log, the
    request counted twice)."""
    late = server.metric('mlxbatch_requests_total{outcome="timeout"')
    with connect(server.port) as s:
        s.sendall(get(b"/health")[:-2] + b"X-Big: " + b"a" * 40_000 + b"\r\n\r\n")
        for _ in range(15):  # 1.5 s of a client that goes on sending
            time.sleep(0.1)
            try:
                s.sendall(b"x" * 100)
            except (BrokenPipeError, ConnectionResetError):
                break
        reply = read_until_closed(s)
    assert reply.startswith(b"HTTP/1.1 431") and reply.count(b"HTTP/1.1 ") == 1, reply[:300]
    assert server.metric('mlxbatch_requests_total{outcome="timeout"') == late
    assert "Traceback" not in server.log.read_text()
