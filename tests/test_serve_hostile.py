"""`mlxbatch serve` against hostile clients, over real sockets on the loopback: slow heads,
stalled bodies, idle and too many connections, SIGTERM and Ctrl-C while they hang, bodies over
the cap sent by urllib, numbers past Python's digit limit, start-up refusals, the metrics of
every reply, keys and the access log; and the bounded tokenization behind a long item.
Deadlines are set small by options; every wait ends on the state it waits for, under a
generous bound."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from test_serve import Server, error_of, free_port, running, wait_for

FAST = ["--timeout-header", "1", "--timeout-body", "2", "--timeout-keep-alive", "1"]
SLOW = ["--timeout-header", "600", "--timeout-body", "600", "--timeout-keep-alive", "600"]
HEAD = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    with running(tiny_model_dir, *FAST, tmp=tmp_path_factory.mktemp("hostile")) as s:
        yield s
    assert "Traceback" not in s.log.read_text()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=60)


def read_until_closed(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket's timeout, 60 s,
    bounds a server that never does)."""
    out = b""
    while data := s.recv(65536):
        out += data
    return out


def body_of(reply: bytes) -> dict:
    return json.loads(reply.split(b"\r\n\r\n", 1)[1])


# -- deadlines ---------------------------------------------------------------------------


def test_a_head_that_stalls_gets_408_and_an_idle_socket_is_closed(server):
    before = server.metric('mlxbatch_requests_total{outcome="timeout"')
    with connect(server.port) as slow, connect(server.port) as idle:
        slow.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        reply = read_until_closed(slow)
        assert reply.startswith(b"HTTP/1.1 408") and body_of(reply)["error"]["type"] == "timeout"
        assert read_until_closed(idle) == b""  # sent nothing: closed without a word
    assert server.metric('mlxbatch_requests_total{outcome="timeout"') == before + 1
    # logged as the other refusals are (it was counted, and no line said so)
    wait_for(
        lambda: re.search(
            r"127\.0\.0\.1:\d+ - refused 408: the request head came too "
            "slowly",
            server.log.read_text(),
        ),
        "the 408 logged",
        60,
    )


def test_a_head_still_trickling_at_its_deadline_reads_the_408_not_a_reset(server):
    """The 408 was written and the socket closed with the client's bytes unread: a client
    still sending its head past the deadline (1 s here) read a reset instead of the reply."""
    with connect(server.port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        ends = time.monotonic() + 1.6  # within the lingering close (2 s) after the deadline
        try:
            while time.monotonic() < ends:
                s.sendall(b"X-Pad: " + b"a" * 100 + b"\r\n")
                time.sleep(0.05)
        except OSError:
            pass
        reply = read_until_closed(s)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]


def test_a_body_that_stalls_gets_408(server):
    with connect(server.port) as s:
        s.sendall(HEAD + b"Content-Length: 2000000\r\n\r\n" + b'{"input": "' + b"x" * 100_000)
        reply = read_until_closed(s)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert "did not all arrive" in body_of(reply)["error"]["message"]
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200


def test_an_idle_keep_alive_connection_is_closed(server):
    with connect(server.port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = read_until_closed(s)  # the reply, then (idle past the keep-alive) the close
    assert reply.startswith(b"HTTP/1.1 200") and reply.count(b"HTTP/1.1") == 1


def test_a_trickled_head_cannot_outlive_its_deadline(server):
    """A byte at a time: the head's deadline counts from the connect, not from the last byte."""
    with connect(server.port) as s:
        start = time.monotonic()
        try:
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 500:
                s.sendall(bytes([byte]))
                time.sleep(0.05)  # 25 s in all, far past the 1 s deadline
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = read_until_closed(s)
        assert time.monotonic() - start < 25
    assert reply.startswith(b"HTTP/1.1 408")


# -- connections -------------------------------------------------------------------------


def test_connections_past_the_cap_are_refused_and_the_log_stays_quiet(tiny_model_dir, tmp_path):
    with running(tiny_model_dir, *SLOW, "--max-connections", "20", tmp=tmp_path) as s:
        held = [connect(s.port) for _ in range(20)]
        wait_for(
            lambda: s.metric("mlxbatch_connections_refused_total") > 0 or refused(s.port),
            "a connection past the cap to be refused",
        )
        many = [connect(s.port) for _ in range(300)]  # a few hundred more, all refused
        replies = [read_until_closed(c) for c in many]
        assert all(r == b"" or r.startswith(b"HTTP/1.1 503") for r in replies)
        assert sum(r.startswith(b"HTTP/1.1 503") for r in replies) > 0
        for c in held + many:
            c.close()
        wait_for(lambda: health_status(s) == 200, "a connection to be served again")
        log = s.log.read_text()
        assert log.count("refusing new ones") == 1 and "Traceback" not in log
        assert s.metric("mlxbatch_connections_refused_total") >= 300


def refused(port: int) -> bool:
    with connect(port) as c:
        c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        return read_until_closed(c).startswith(b"HTTP/1.1 503")


def health_status(server) -> int | None:
    try:
        return httpx.get(server.url + "/health", timeout=60).status_code
    except httpx.TransportError:
        return None


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_drains_past_stalled_clients_and_exits(tiny_model_dir, tmp_path, sig, code):
    """Clients stalled in each state do not hold the exit: the drain answers the stalled body
    (503), drops the rest, and the server exits with the documented code before any of their
    own deadlines (600 s) could have closed them."""
    s = Server(tiny_model_dir, *SLOW, "--drain-timeout", "5", tmp=tmp_path)
    try:
        idle, head, body, kept = (connect(s.port) for _ in range(4))
        head.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\n")
        body.sendall(HEAD + b"Content-Length: 2000000\r\n\r\n" + b'{"input": "' + b"x" * 2**20)
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b"}"):  # the whole reply; then the connection idles
            first += kept.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        with httpx.Client(timeout=60) as c:  # an ordinary request still in flight is answered
            assert c.post(s.url + "/v1/classify", json={"input": ["a", "b"]}).status_code == 200
        start = time.monotonic()
        s.proc.send_signal(sig)
        reply = read_until_closed(body)
        assert reply.startswith(b"HTTP/1.1 503") and body_of(reply)["error"]["code"] == 503
        assert s.proc.wait(120) == code  # the drain's 5 s, with a margin for a busy machine
        assert time.monotonic() - start < 120
        for c in (idle, head, kept):
            assert read_until_closed(c) == b""
            c.close()
        if sig == signal.SIGINT:
            assert "error: interrupted" in s.log.read_text()
    finally:
        s.stop()


# -- refusals a client can read ----------------------------------------------------------


@pytest.mark.parametrize("megabytes", [3, 20])
def test_urllib_reads_the_413_of_a_body_over_the_cap(server, megabytes):
    request = urllib.request.Request(
        server.url + "/v1/classify",
        data=b"x" * (megabytes << 20),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    assert caught.value.code == 413
    assert json.loads(caught.value.read())["error"]["type"] == "too_large"
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200


@pytest.mark.parametrize("where", ['{"input": "x", "user": N}', '{"input": ["x", N]}', "N"])
def test_an_integer_past_the_digit_limit_is_400(server, where):
    body = where.replace("N", "9" * 5000).encode()
    message = error_of(
        httpx.post(server.url + "/v1/classify", content=body, timeout=60), 400, "invalid_request"
    )
    assert "5,000 digits" in message


# -- start-up ----------------------------------------------------------------------------


def start(model, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlxbatch", "serve", "--model", str(model), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def error_lines(r: subprocess.CompletedProcess) -> list[str]:
    """stderr less the warnings (this machine's BLAS may have one)."""
    return [
        line for line in r.stderr.splitlines() if line.strip() and not line.startswith("warning:")
    ]


def test_a_port_in_use_is_one_line_and_exit_2(tiny_model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = start(tiny_model_dir, "--port", str(port))
    assert r.returncode == 2, r.stderr
    assert error_lines(r) == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use"]


def test_a_bad_label_set_is_refused_before_the_port_is_bound(tiny_model_dir):
    with socket.socket() as taken:  # were the port bound first, this would be the error
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = start(tiny_model_dir, "--port", str(taken.getsockname()[1]), "--labels", "only")
    assert r.returncode == 2, r.stderr
    (line,) = error_lines(r)
    assert line.startswith("error: ") and "label" in line and "listen" not in line


def test_a_key_with_a_space_is_refused_at_start(tiny_model_dir, tmp_path):
    key = tmp_path / "key"
    key.write_text("two words\n")
    r = start(tiny_model_dir, "--port", str(free_port()), "--api-key-file", str(key))
    assert r.returncode == 2 and error_lines(r)[-1].startswith("error: --api-key-file")


# -- metrics, keys, the log ----------------------------------------------------------------


def test_metrics_count_unknown_routes_and_wrong_methods(server):
    count = server.metric
    before = (
        count('mlxbatch_requests_total{outcome="not_found"'),
        count('mlxbatch_requests_total{outcome="method_not_allowed"'),
    )
    error_of(httpx.get(server.url + "/nothing", timeout=60), 404, "not_found")
    error_of(httpx.get(server.url + "/v1/classify", timeout=60), 405, "method_not_allowed")
    assert count('mlxbatch_requests_total{outcome="not_found"') == before[0] + 1
    assert count('mlxbatch_requests_total{outcome="method_not_allowed"') == (before[1] + 1)


def test_a_non_ascii_key_matches_its_utf8_bytes_and_401s_are_counted(tiny_model_dir, tmp_path):
    key = tmp_path / "key"
    key.write_bytes("clé-secrète-票\n".encode())
    with running(tiny_model_dir, "--api-key-file", str(key), tmp=tmp_path) as s:
        good = {"Authorization": "Bearer clé-secrète-票".encode()}
        bad = {"Authorization": "Bearer cl\xe9-secr\xe8te".encode("latin-1")}
        url = s.url + "/v1/classify"
        assert httpx.post(url, json={"input": "x"}, headers=good, timeout=60).status_code == 200
        error_of(httpx.post(url, json={"input": "x"}, headers=bad, timeout=60), 401, "unauthorized")
        error_of(httpx.get(s.url + "/v1/models", timeout=60), 401, "unauthorized")
        assert httpx.get(s.url + "/v1/models", headers=good, timeout=60).status_code == 200
        # two keys: the first was checked, so a right one after a wrong one was refused and
        # the other way round served; either order is a 401 now
        for pair in ([bad, good], [good, bad]):
            headers = httpx.Headers([("Authorization", h["Authorization"]) for h in pair])
            error_of(
                httpx.post(url, json={"input": "x"}, headers=headers, timeout=60),
                401,
                "unauthorized",
            )
        # an unknown /v1/ route was a 404 without a key: a client could list the routes
        error_of(httpx.get(s.url + "/v1/nope", timeout=60), 401, "unauthorized")
        error_of(httpx.get(s.url + "/v1/nope", headers=good, timeout=60), 404, "not_found")
        assert s.metric('mlxbatch_requests_total{outcome="unauthorized"') == 5


def test_query_strings_never_reach_the_access_log(server):
    httpx.get(server.url + "/health?api_key=hunter2-in-a-url", timeout=60)
    httpx.post(server.url + "/v1/classify?key=hunter2-in-a-url", json={"input": "x"}, timeout=60)
    wait_for(
        lambda: server.log.read_text().count('"POST /v1/classify HTTP/1.1"') >= 1,
        "the access log line",
    )
    log = server.log.read_text()
    assert '"GET /health HTTP/1.1" 200' in log and "hunter2" not in log


# -- one long request does not freeze the others ---------------------------------------------


def test_health_answers_while_long_texts_are_tokenized(server):
    """Four requests of ~1.9 MB texts (truncated) in flight: /health keeps answering. Before,
    each text held the GIL for seconds and /health took 6.5 s; the bound is generous."""
    texts = [f"ticket {i}: my invoice is wrong and the app crashes " * 38_000 for i in range(4)]

    def send(text: str) -> int:
        return httpx.post(
            server.url + "/v1/classify", json={"input": text, "truncate": True}, timeout=600
        ).status_code

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(send, t) for t in texts]
        checks, slowest = health_until_done(server, futures, pause=0.05)
        assert [f.result() for f in futures] == [200] * 4
    assert checks >= 3 and slowest < 3.0, (checks, slowest)


def test_health_answers_while_a_body_of_numbers_is_parsed(tiny_model_dir, tmp_path):
    """Two 12 MB bodies of 6 million numbers each: /health keeps answering while they parse.
    Parsed on the event loop, each held /health for the whole parse (0.3-0.4 s a 2 MB body on
    a Zen 3; two queued: twice that); the bound is one parse, timed here."""
    from mlxbatch.serve.limits import Limits, parse_classify

    body = b'{"input": ["my invoice is wrong"], "user": [' + b"1," * 6_000_000 + b"1]}"
    t0 = time.perf_counter()
    parse_classify(body, Limits(max_body_bytes=len(body)), ("x",))
    parse_s = time.perf_counter() - t0
    with running(tiny_model_dir, "--max-body-mb", "13", tmp=tmp_path) as server:

        def send() -> int:
            return httpx.post(
                server.url + "/v1/classify",
                content=body,
                timeout=600,
                headers={"content-type": "application/json"},
            ).status_code

        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(send) for _ in range(2)]
            checks, slowest = health_until_done(server, futures, pause=0.02)
            assert [f.result() for f in futures] == [200, 200]
    assert checks >= 5 and slowest < parse_s, (checks, slowest, parse_s)


def health_until_done(server, futures, pause: float) -> tuple[int, float]:
    """GET /health every `pause` seconds until `futures` are all done, each answer a 200:
    (how many were asked, the slowest answer's seconds)."""
    done, checks, slowest = threading.Event(), 0, 0.0
    threading.Thread(target=lambda: (wait_all(futures), done.set()), daemon=True).start()
    while not done.is_set():
        t0 = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=60).status_code == 200
        slowest = max(slowest, time.monotonic() - t0)
        checks += 1
        time.sleep(pause)
    return checks, slowest


def wait_all(futures) -> None:
    for f in futures:
        f.exception()


# -- the bounded tokenization is the same tokenization -----------------------------------------

LONG = {
    "ascii": "my invoice is wrong, please refund it. " * 700,
    "dashes": "-" * 30_000,  # the longest tokens there are
    "cjk": "票据错误，请退款。" * 2_000,
    "combining": "e\u0301a\u0300 " * 5_000,  # NFC composes them: fewer characters
    "newlines": "\n\n" + "line\n" * 4_000,
}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from mlxbatch.api.classifier import Classifier

    return Classifier.load(tiny_model_dir).engine


def reference_fit(engine, text: str, limit: int, truncating: bool):
    """The unbounded original: tokenize all of it, binary-search the cut on full tokenizations."""
    from mlxbatch.api.limits import MARK

    def cut(k):
        return text[: k - k // 2] + MARK + (text[len(text) - k // 2 :] if k // 2 else "")

    def size(k):
        return len(engine.fed(engine.prompt(cut(k))))

    n = len(engine.fed(engine.prompt(text)))
    if n <= limit:
        return engine.prompt(text), n, None
    if not truncating or size(0) > limit:
        return None
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if size(mid) <= limit else (lo, mid - 1)
    return engine.prompt(cut(lo)), size(lo), {"from_tokens": n, "to_tokens": size(lo)}


@pytest.mark.parametrize("name", sorted(LONG))
@pytest.mark.parametrize("limit", [40, 4000])
def test_bounded_fit_answers_as_the_full_tokenization_did(engine, name, limit):
    from mlxbatch.api.limits import Limit, prepare

    text = LONG[name]
    for truncating in (False, True):
        got = prepare(engine, text, Limit(limit, "--max-tokens"), truncating)
        want = reference_fit(engine, text, limit, truncating)
        if want is None:
            assert isinstance(got, str) and "--max-tokens" in got
        else:
            assert (got.prompt, got.fed, got.truncated) == want


@pytest.mark.parametrize("name", sorted(LONG))
def test_the_token_floor_is_a_floor(engine, name):
    tokenizer = engine.tokenizer
    text = LONG[name]
    assert 0 < tokenizer.least_tokens(text) <= len(tokenizer.encode(text))
    assert tokenizer.least_tokens(text[:100]) <= len(tokenizer.encode(text[:100]))


def test_requests_cut_at_the_drain_deadline_get_503_and_the_exit_keeps_it(tiny_model_dir, tmp_path):
    """A request still queued when --drain-timeout runs out is a 503 in the error envelope (no
    traceback), and the exit follows the deadline instead of scoring the queue for nobody."""
    s = Server(tiny_model_dir, *SLOW, "--drain-timeout", "1", tmp=tmp_path)
    try:
        body = json.dumps({"input": ["hello world " * 100] * 256}).encode()
        clients = [connect(s.port) for _ in range(4)]  # 1,024 items: the queue bound
        for c in clients:
            c.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(0.5)  # all four queued
        start = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0
        took = time.monotonic() - start
        statuses = []
        for c in clients:
            reply = read_until_closed(c)
            statuses.append(int(reply.split(b" ", 2)[1]))
            if statuses[-1] != 200:
                assert body_of(reply)["error"]["type"] == "unavailable", reply[:300]
            c.close()
        assert set(statuses) <= {200, 503}, statuses
        log = s.log.read_text()
        assert "Traceback" not in log and "never retrieved" not in log
        if 503 in statuses:  # the deadline cut the queue: the exit did not score the rest
            assert took < 1 + 30, took
    finally:
        s.stop()


# -- slow, odd and misbehaving clients ------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        HEAD + b"Content-Length: abc\r\n\r\n{}",  # not a length
        b"POST /v1/classify HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",  # HTTP/1.1 without Host
        HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",  # a bad chunk size
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS ClientHello
    ],
    ids=["length", "no-host", "chunk-size", "tls"],
)
def test_bytes_that_are_not_http_get_the_json_error_and_are_counted(server, raw):
    """They got uvicorn's text/plain "Invalid HTTP request received." and no metric; a bad
    chunk size after a valid head was counted twice, as a 400 and as a client gone (499)."""
    before = server.metric('mlxbatch_requests_total{outcome="invalid_request"')
    gone = server.metric('mlxbatch_requests_total{outcome="disconnected"')
    with connect(server.port) as s:
        s.sendall(raw)
        reply = read_until_closed(s)
    head, body = reply.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head
    assert int(head.split(b"content-length: ")[1].split(b"\r\n")[0]) == len(body)
    assert json.loads(body)["error"] == {
        "message": "the request is not valid HTTP/1.1",
        "type": "invalid_request",
        "code": 400,
    }
    wait_for(
        lambda: server.metric('mlxbatch_requests_total{outcome="invalid_request"') == before + 1,
        "the 400 counted",
    )
    time.sleep(2.5)  # a refused body lingers up to 2 s before the app sees the disconnect
    assert server.metric('mlxbatch_requests_total{outcome="invalid_request"') == before + 1
    assert server.metric('mlxbatch_requests_total{outcome="disconnected"') == gone


def test_a_refused_head_is_answered_to_a_client_still_sending_and_logged_with_its_reason(server):
    """A bad Content-Length refused the head and closed the socket with the body unread: the
    kernel reset the connection, and the 400 with it (5 of 5 clients that sent 1 MB read a
    reset). The log said "Invalid HTTP request received." with neither client nor reason; an
    Upgrade header logged "pip install 'uvicorn[standard]'"."""
    body = b"x" * 1_000_000
    with connect(server.port) as s:
        sending = threading.Thread(
            target=lambda: _send_all(s, HEAD + b"Content-Length: abc\r\n\r\n" + body)
        )
        sending.start()
        reply = read_until_closed(s)
        sending.join()
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    with connect(server.port) as s:
        s.sendall(
            b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
    wait_for(
        lambda: "refused 400: the request is not valid HTTP/1.1" in server.log.read_text(),
        "the refusal logged",
    )
    log = server.log.read_text()
    assert "Invalid HTTP request received" not in log and "WebSocket" not in log, log[-3000:]
    line = next(x for x in log.splitlines() if "refused 400" in x)
    assert re.search(r"127\.0\.0\.1:\d+ - refused 400", line), line


def test_a_client_pipelining_without_end_is_read_no_further_ahead_than_a_megabyte(server):
    """A keep-alive client pipelining small valid requests as fast as the socket takes them is
    not read into the server's memory far ahead of the answers: the server stops reading until
    it has answered what it holds, and the sender stalls on the kernel's buffers."""
    body = b'{"input": "hello there"}'
    one = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body
    blob, total = one * ((1 << 20) // len(one)), 64 << 20
    sent = [0]
    with connect(server.port) as s:

        def flood():
            try:
                while sent[0] < total:
                    s.sendall(blob)
                    sent[0] += len(blob)
            except OSError:  # closed under it once the test has its figure
                pass

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        last, still = -1, 0
        while sent[0] < total and still < 15:  # until it has sent all, or 1.5 s without progress
            time.sleep(0.1)
            still, last = (still + 1, last) if sent[0] == last else (0, sent[0])
        sent_then = sent[0]
    sender.join(60)
    # what the kernel buffers on both sides holds (a few MB) and the server's bound, no more
    assert sent_then < total // 2, f"{sent_then >> 20} MB read ahead of its answers"
    reply = httpx.get(server.url + "/health", timeout=60)
    assert reply.status_code == 200 and reply.elapsed.total_seconds() < 10


def _send_all(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
    except OSError:  # the server may close its side once it has read what it needs
        pass


def test_the_replies_written_below_the_app_say_their_own_length():
    """The 503 of a refused connection said 96 bytes of a 100-byte body (a client read cut-off
    JSON), the head's 408 91 of 90."""
    from mlxbatch.serve import refusals

    for reply in (refusals.REFUSED, refusals.HEAD_TIMEOUT, refusals.INVALID_HTTP):
        head, body = reply.split(b"\r\n\r\n", 1)
        assert int(head.split(b"content-length: ")[1].split(b"\r\n")[0]) == len(body)
        assert json.loads(body)["error"]["code"] == int(head.split(b" ")[1])


def test_ctrl_c_twice_exits_130_with_a_clean_log(tiny_model_dir, tmp_path):
    """The second Ctrl-C skipped uvicorn's lifespan shutdown, and the cancelled lifespan left
    a CancelledError traceback in the log."""
    s = Server(tiny_model_dir, *SLOW, tmp=tmp_path)
    try:
        s.proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        s.proc.send_signal(signal.SIGINT)
        assert s.proc.wait(120) == 130
        log = s.log.read_text()
        assert "Traceback" not in log and "error: interrupted" in log
    finally:
        s.stop()


def _watched_service(monkeypatch, seconds: float):
    """A service whose tokenizing only counts how many run at once, and in all, then refuses."""
    from mlxbatch.engine.promptspec import PromptSpec
    from mlxbatch.serve.errors import ApiError
    from mlxbatch.serve.service import ServeSpec, Service

    spec = ServeSpec(model=Path("/nonexistent-model"), name="m", prompt=PromptSpec(("a", "b")))
    svc = Service(spec)
    seen, lock = {"running": 0, "most": 0, "calls": 0}, threading.Lock()

    def prepare(req):  # what a worker thread does
        with lock:
            seen["running"] += 1
            seen["calls"] += 1
            seen["most"] = max(seen["most"], seen["running"])
        time.sleep(seconds)
        with lock:
            seen["running"] -= 1
        raise ApiError(422, "stop here")

    monkeypatch.setattr(svc, "_prepare", prepare)
    return svc, seen


def test_long_requests_are_prepared_one_at_a_time(monkeypatch):
    """Sixteen 2 MB texts under "truncate" were tokenized at once: ~170 MB each (3.2 GB), and
    a SIGTERM waited for every worker thread (8.9 s past a 2 s --drain-timeout). Requests over
    LONG_CHARS now take turns on a thread of their own."""
    import asyncio

    from mlxbatch.serve import service as service_module
    from mlxbatch.serve.errors import ApiError
    from mlxbatch.serve.limits import ClassifyBody

    svc, seen = _watched_service(monkeypatch, 0.1)

    async def burst(chars: int) -> int:
        seen["most"] = 0
        body = ClassifyBody(["x" * chars], True)
        calls = [svc.classify(body) for _ in range(6)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, ApiError) for r in results)
        return seen["most"]

    try:
        assert asyncio.run(burst(service_module.LONG_CHARS + 1)) == 1
        assert asyncio.run(burst(100)) > 1  # short ones still run side by side
    finally:
        svc.close()


def test_a_long_request_whose_client_left_keeps_its_turn_until_its_thread_ends(monkeypatch):
    """The turn was held by the request: a client that sent 2 MB and left (its request
    cancelled) released it while its thread still tokenized, and the next ran beside it (20
    such clients: 14 more threads, +1.7 GB). The turns its request had not begun never run,
    and a request after the service closed is a 503."""
    import asyncio

    from mlxbatch.serve import service as service_module
    from mlxbatch.serve.errors import ApiError
    from mlxbatch.serve.limits import ClassifyBody

    svc, seen = _watched_service(monkeypatch, 0.3)
    body = ClassifyBody(["x" * (service_module.LONG_CHARS + 1)], True)

    async def clients_leave_then_others_come() -> None:
        left = [asyncio.create_task(svc.classify(body)) for _ in range(5)]
        await asyncio.sleep(0.05)  # the first is tokenizing, four wait their turn
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        after = [svc.classify(body) for _ in range(3)]
        results = await asyncio.gather(*after, return_exceptions=True)
        assert all(isinstance(r, ApiError) and r.status == 422 for r in results), results

    async def after_close() -> None:
        with pytest.raises(ApiError) as e:
            await svc.classify(body)
        assert e.value.status == 503

    try:
        asyncio.run(clients_leave_then_others_come())
    finally:
        svc.close()
    assert seen["most"] == 1 and seen["calls"] == 4, seen
    asyncio.run(after_close())


# -- clients that leave their work behind, or never read -----------------------------------


def test_the_work_of_a_client_that_left_is_withdrawn_not_scored(tiny_model_dir, tmp_path):
    """Two clients that sent 40 texts each and closed their sockets were still scored, for
    minutes with long texts, and counted gone only then: every request after theirs waited."""
    from mlxbatch.runtime.testhold import HOLD_FILE

    hold = tmp_path / "hold"  # while it exists the scheduler starts no round
    hold.write_text("")
    with running(tiny_model_dir, tmp=tmp_path, env={HOLD_FILE: str(hold)}) as s:
        body = json.dumps({"input": [f"ticket {i} about my invoice" for i in range(40)]})
        head = HEAD + b"Content-Length: %d\r\n\r\n" % len(body)
        for _ in range(2):
            with connect(s.port) as c:
                c.sendall(head + body.encode())
                wait_for(lambda: s.metric("mlxbatch_queue_depth") == 40, "the items queued")
        gone = 'mlxbatch_requests_total{outcome="disconnected"'
        wait_for(lambda: s.metric(gone) == 2, "both clients counted gone, unscored")
        wait_for(lambda: s.metric("mlxbatch_queue_depth") == 0, "their items withdrawn")
        hold.unlink()
        r = httpx.post(s.url + "/v1/classify", json={"input": "charged twice"}, timeout=60)
        assert r.status_code == 200
        assert s.metric("mlxbatch_items_total") == 1  # theirs were never scored
    assert "Traceback" not in s.log.read_text()


def test_a_one_text_request_is_answered_before_a_long_request_queued_ahead_of_it(
    tiny_model_dir, tmp_path
):
    """Sixteen long texts, a batch each, then one short text, queued together: the short one
    is answered first. The rounds took the batches of the oldest items, so it waited for all
    sixteen."""
    from mlxbatch.runtime.testhold import HOLD_FILE

    hold = tmp_path / "hold"  # while it exists the scheduler starts no round
    hold.write_text("")
    done: list[str] = []

    def post(name: str, texts: list[str]) -> None:
        r = httpx.post(s.url + "/v1/classify", json={"input": texts}, timeout=300)
        assert r.status_code == 200
        done.append(name)

    long = [f"ticket {i}: " + "my invoice is wrong and the app crashes " * 150 for i in range(16)]
    env = {HOLD_FILE: str(hold)}
    with running(tiny_model_dir, "--batch-tokens", "2048", tmp=tmp_path, env=env) as s:
        with ThreadPoolExecutor(2) as pool:
            large = pool.submit(post, "large", long)
            wait_for(lambda: s.metric("mlxbatch_queue_depth") == 16, "the long texts queued")
            small = pool.submit(post, "small", ["charged twice"])
            wait_for(lambda: s.metric("mlxbatch_queue_depth") == 17, "the short one queued")
            hold.unlink()
            small.result(timeout=300), large.result(timeout=300)
    assert done == ["small", "large"]


def test_a_client_that_never_reads_its_replies_is_dropped(tiny_model_dir, tmp_path):
    """Pipelined requests whose replies are never read held their connections, and the slots
    of --max-connections, for good: two such clients took a two-slot server down."""
    args = ["--max-connections", "2", "--timeout-reply", "1", *SLOW]
    with running(tiny_model_dir, *args, tmp=tmp_path) as s:
        ask = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" * 50
        stalled = []
        for _ in range(2):
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills after few replies
            c.connect(("127.0.0.1", s.port))
            c.settimeout(0.5)
            try:
                for _ in range(2000):  # until the server stops reading: its replies are unread
                    c.sendall(ask)
            except (TimeoutError, BlockingIOError):
                pass
            stalled.append(c)
        try:
            wait_for(
                lambda: s.metric("mlxbatch_connections_dropped_total") == 2,
                "both readers dropped",
                limit=120,
            )
            assert httpx.get(s.url + "/health", timeout=30).status_code == 200
        finally:
            for c in stalled:
                c.close()
    assert "Traceback" not in s.log.read_text()


def test_a_client_not_reading_when_the_drain_ends_is_dropped_with_a_line(tiny_model_dir, tmp_path):
    """A client that stops reading its replies, with --drain-timeout shorter than
    --timeout-reply: the drain's end drops it (one log line, counted), before uvicorn cancels
    the reply it blocks, which logged "Exception in ASGI application" and a traceback."""
    s = Server(
        tiny_model_dir, *SLOW, "--drain-timeout", "3", "--timeout-reply", "600", tmp=tmp_path
    )
    c = socket.socket()
    try:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.connect(("127.0.0.1", s.port))
        c.settimeout(0.5)
        try:
            for _ in range(2000):  # until the server stops reading: its replies are unread
                c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
        except (TimeoutError, BlockingIOError):
            pass
        served = [-1.0, s.metric('mlxbatch_requests_total{outcome="ok"')]
        while served[-1] != served[-2] and len(served) < 300:  # until it serves no more: its
            # replies fill the socket (a bound of 5 min: the client sent a finite number)
            time.sleep(1.0)
            served.append(s.metric('mlxbatch_requests_total{outcome="ok"'))
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(120) == 0
    finally:
        c.close()
        s.stop()
    log = s.log.read_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]
    assert "did not read its replies by the drain's end" in log


@pytest.mark.parametrize(
    "head, status, words",
    [
        (b"Transfer-Encoding: chunked\r\n", 400, "Transfer-Encoding is not HTTP/1.0"),
        (b"", 411, "needs Content-Length"),
    ],
)
def test_an_http10_body_is_framed_by_content_length_alone(server, head, status, words):
    """HTTP/1.0 has no chunked framing (RFC 9112 6.1): such a body was scored (200); a POST
    without Content-Length was read as empty and answered "the body is not valid JSON"."""
    body = b'{"input": "hello"}'
    sent = b"11\r\n" + body[:17] + b"\r\n1\r\n}\r\n0\r\n\r\n" if head else body
    with connect(server.port) as c:
        c.sendall(
            b"POST /v1/classify HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n"
            + head
            + b"\r\n"
            + sent
        )
        if not head:
            c.shutdown(socket.SHUT_WR)  # an HTTP/1.0 body without a length ends at EOF
        reply = read_until_closed(c)
    assert reply.startswith(b"HTTP/1.1 %d" % status), reply[:200]
    assert words in body_of(reply)["error"]["message"]


def test_a_trailing_slash_an_ambiguous_length_and_a_huge_model_name(server):
    """A trailing slash was a 307 to a Location built from the client's Host header; a request
    with both Content-Length and Transfer-Encoding was served and its connection kept (a
    smuggling vector behind a proxy); a 100 KB model name came back whole in the 404."""
    r = httpx.post(
        server.url + "/v1/classify/",
        json={"input": "a"},
        timeout=30,
        headers={"Host": "evil.example"},
    )
    assert error_of(r, 404, "not_found") and "location" not in r.headers
    chunked = b"11\r\n" + b'{"input": "hello"}'[:17] + b"\r\n0\r\n\r\n"
    with connect(server.port) as c:
        c.sendall(HEAD + b"Content-Length: 17\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
        reply = read_until_closed(c)  # closed after the reply, not kept alive
    assert reply.startswith(b"HTTP/1.1 400") and b"connection: close" in reply.lower()
    assert "both Content-Length and Transfer-Encoding" in body_of(reply)["error"]["message"]
    r = httpx.post(
        server.url + "/v1/classify", json={"model": "m" * 100_000, "input": "a"}, timeout=30
    )
    message = error_of(r, 404, "not_found")
    assert len(message) < 400 and "100,000 characters" in message


# -- bodies and heads that would hold the event loop ----------------------------------------


def test_a_body_in_tiny_chunks_is_refused_before_it_holds_the_loop(server):
    """h11 parses chunks one by one on the event loop: a 1 MB body as 1-byte chunks held
    /health for 2.4 s and was answered after 9.2 s. Past 1,024 chunks they must average 512
    bytes: the 400 names why, and the same body in larger chunks is served."""
    from mlxbatch.serve.refusals import CHUNK_BYTES, FREE_CHUNKS

    body = json.dumps({"input": "my invoice is wrong " * 50_000, "truncate": True}).encode()
    tiny = b"".join(b"1\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body)))
    gone = server.metric('mlxbatch_requests_total{outcome="disconnected"')
    with connect(server.port) as s:
        start = time.monotonic()
        s.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + tiny + b"0\r\n\r\n")
        reply = read_until_closed(s)
    assert reply.startswith(b"HTTP/1.1 400") and b"connection: close" in reply.split(b"\r\n\r\n")[0]
    message = body_of(reply)["error"]["message"]
    assert f"{FREE_CHUNKS + 1:,} chunks of 1 bytes" in message and str(CHUNK_BYTES) in message
    assert time.monotonic() - start < 30  # refused after ~1,000 chunks, not ~1,000,000
    big = b"".join(
        b"%x\r\n" % len(body[i : i + 4096]) + body[i : i + 4096] + b"\r\n"
        for i in range(0, len(body), 4096)
    )
    pieces = [b"x"] * (FREE_CHUNKS - 2)  # with its two ends: FREE_CHUNKS chunks, all small
    small = b"".join(b"%x\r\n" % len(p) + p + b"\r\n" for p in [b'{"input": "'] + pieces + [b'"}'])
    for wire in (big, small):
        with connect(server.port) as s:
            s.sendall(
                HEAD
                + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                + wire
                + b"0\r\n\r\n"
            )
            assert read_until_closed(s).startswith(b"HTTP/1.1 200")
    time.sleep(2.5)  # the refused body's disconnect reaches the app after the linger
    assert server.metric('mlxbatch_requests_total{outcome="disconnected"') == gone


def test_http2_and_a_reply_before_the_body_close_the_connection_and_say_so(server):
    with connect(server.port) as s:  # an HTTP/2 preface was a 404 (path "*"), then a 400
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        reply = read_until_closed(s)
    assert reply.startswith(b"HTTP/1.1 400") and reply.count(b"HTTP/1.1") == 1
    assert body_of(reply)["error"]["message"] == "HTTP/2.0 is not served here"
    with connect(server.port) as s:  # a 413 before the body is read: the connection closes
        s.sendall(HEAD + b"Content-Length: 3000000\r\n\r\n")  # without saying so before
        head = read_until_closed(s).split(b"\r\n\r\n")[0]
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head


def test_a_partial_head_pipelined_behind_a_request_gets_its_408(server):
    """The rest of a head sent with the previous request got keep-alive's silent close, not
    the 408 of a head that came too slowly."""
    first = json.dumps({"input": "hello"}).encode()
    with connect(server.port) as s:
        s.sendall(
            HEAD + b"Content-Length: %d\r\n\r\n" % len(first) + first + b"GET /health HTTP/1.1\r\n"
        )
        replies = read_until_closed(s)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", replies) == [b"200", b"408"], replies[:300]


def test_an_api_key_file_saved_with_a_bom_holds_the_key_without_it(tmp_path, capsys):
    # Notepad's UTF-8 starts with EF BB BF: the key kept it, and every request was a 401
    from mlxbatch.cli.serve import read_api_key

    key = tmp_path / "key"
    key.write_bytes(b"\xef\xbb\xbfs3cret\r\n")
    assert read_api_key(key) == b"s3cret"
    key.write_bytes(b"\xef\xbb\xbf\n")
    with pytest.raises(SystemExit) as e:
        read_api_key(key)
    assert e.value.code == 2 and "the file is empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    "body, said",
    [
        (b"[1]", "not an array"),
        (b'{"input": 5}', "not a number"),
        (b'{"input": {"a": 1}}', "not an object"),
        (b'{"input": ["x", null]}', "input[1] must be a string, not null"),
        (b'{"input": "x", "truncate": "yes"}', "not a string"),
    ],
)
def test_a_request_names_a_wrong_value_in_jsons_words(body, said):
    # the service said "not a list" and "not a null": its own copy of io/formats.json_kind
    from mlxbatch.serve.errors import ApiError
    from mlxbatch.serve.limits import Limits, parse_classify

    with pytest.raises(ApiError) as e:
        parse_classify(body, Limits(), ("m",))
    assert e.value.status == 400 and said in str(e.value), str(e.value)


def test_a_request_of_many_unknown_fields_is_answered_in_a_line():
    # 150,000 unknown keys were all named: a 1.5 MB error reply
    from mlxbatch.serve.errors import ApiError
    from mlxbatch.serve.limits import Limits, parse_classify

    body = json.dumps({"input": "x", **{f"k{i}" * 30: 1 for i in range(2000)}}).encode()
    with pytest.raises(ApiError) as e:
        parse_classify(body, Limits(), ("m",))
    assert e.value.status == 400 and "and 1,995 more" in str(e.value) and len(str(e.value)) < 1000


def test_a_request_with_numbers_json_does_not_have_is_a_400():
    """`NaN`, `Infinity` and `1e999` were read (Python's json takes them) and answered 200."""
    import pytest

    from mlxbatch.serve.errors import ApiError
    from mlxbatch.serve.limits import Limits, parse_classify

    for body, said in (
        (b'{"input": "a", "user": NaN}', "NaN is not a JSON number"),
        (b'{"input": "a", "user": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"input": "a", "user": 1e999}', "1e999 is past a float's range"),
    ):
        with pytest.raises(ApiError) as e:
            parse_classify(body, Limits(), ("m",))
        assert e.value.status == 400 and said in str(e.value), str(e.value)
    assert parse_classify(b'{"input": "a", "user": 1.5e3}', Limits(), ("m",)).texts == ["a"]


def test_a_drain_that_ends_with_work_cancelled_is_a_warning(caplog):
    """uvicorn logged the documented end of --drain-timeout (those clients got 503) at ERROR."""
    import logging

    from mlxbatch.serve.server import DrainEnded

    log = logging.getLogger("uvicorn.error")
    ended = DrainEnded()
    log.addFilter(ended)
    try:
        with caplog.at_level(logging.INFO, logger="uvicorn.error"):
            log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", 2)
            log.error("Exception in ASGI application")  # any other error stays one
    finally:
        log.removeFilter(ended)
    assert [r.levelname for r in caplog.records] == ["WARNING", "ERROR"]


def test_the_service_answers_non_finite_scores_with_its_json_500(tiny_model_dir):
    """A reply holding NaN scores failed in the JSON encoder: a text/plain 500 and a traceback
    in the log, after the request was counted a 200."""
    from pathlib import Path

    import numpy as np
    import pytest

    from mlxbatch import Classifier
    from mlxbatch.api.limits import Limit, prepare
    from mlxbatch.engine.promptspec import PromptSpec
    from mlxbatch.serve.errors import ApiError
    from mlxbatch.serve.service import ServeSpec, Service

    prompt = PromptSpec(("spam", "ham"))
    svc = Service(ServeSpec(model=Path(tiny_model_dir), name="m", prompt=prompt))
    svc.clf = Classifier.load(tiny_model_dir, labels=["spam", "ham"])
    items = [prepare(svc.clf.engine, t, Limit(512, "x"), False, i) for i, t in enumerate("ab")]
    probs = np.array([[0.4, 0.6], [np.nan, np.nan]], np.float32)
    with pytest.raises(ApiError) as e:
        svc._reply("r", items, probs)
    assert e.value.status == 500 and e.value.message.startswith(
        "input[1]: the model gave non-finite"
    )
    svc.close()


def test_a_body_in_utf16_is_refused_and_a_utf8_byte_order_mark_is_passed_over():
    """JSON in UTF-16 (with its byte order mark) was scored: `json.loads` on bytes guesses
    UTF-16 and UTF-32. RFC 8259 asks for UTF-8; a UTF-8 byte order mark is passed over."""
    import codecs

    from mlxbatch.serve.errors import ApiError
    from mlxbatch.serve.limits import Limits, parse_classify

    doc = '{"input": ["a refund, please"]}'
    for body in (doc.encode("utf-16"), doc.encode("utf-32"), b'{"input": "caf\xe9"}'):
        with pytest.raises(ApiError, match="the body is not UTF-8") as e:
            parse_classify(body, Limits(), ("m",))
        assert e.value.status == 400
    with pytest.raises(ApiError, match="not valid JSON"):  # no mark: NULs between the bytes
        parse_classify(doc.encode("utf-16-le"), Limits(), ("m",))
    for body in (doc.encode(), codecs.BOM_UTF8 + doc.encode()):
        assert parse_classify(body, Limits(), ("m",)).texts == ["a refund, please"]
