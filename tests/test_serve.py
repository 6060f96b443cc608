"""`mlxbatch serve` over real HTTP on the loopback: a uvicorn server in a subprocess on the tiny
model, answers checked against the gold loop, and every limit, error and the drain on SIGTERM.
Every wait here is bounded; the servers stop themselves at the end of the module."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import numpy as np
import pytest

from mlxbatch.bench.workload import generate
from mlxbatch.runtime.testhold import HOLD_FILE

SECRET = "zebra-umbrella-7731"  # a ticket text that must never reach the server's log


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model, *args: str, tmp=None, env=None):
        self.port = free_port()
        self.url, self.name = f"http://127.0.0.1:{self.port}", str(model)
        self.log = (tmp or ".") / f"serve-{self.port}.log"
        cmd = [
            sys.executable,
            "-m",
            "mlxbatch",
            "serve",
            "--model",
            str(model),
            "--port",
            str(self.port),
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        self.seen = []  # /health statuses before ready
        deadline = time.monotonic() + 600  # a bound for a hung start, not a race: left early
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                r = httpx.get(self.url + "/health", timeout=2)
                if r.status_code == 200:
                    return
                self.seen.append((r.status_code, r.json()["status"]))
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the server did not become healthy: {self.log.read_text()}")

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and line[len(name)] in " {,"
        )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def wait_for(condition, what: str, limit: float = 600.0) -> None:
    """Until `condition()` holds; failing (never passing) if it does not within `limit` s, a
    bound for a hung server: every wait here ends on the state it waits for, not on time."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def draining(server) -> bool:
    """503 from /health, or no longer listening (uvicorn closes its socket as it drains)."""
    try:
        return httpx.get(server.url + "/health", timeout=60).status_code == 503
    except httpx.TransportError:
        return True


@contextmanager
def running(model, *args, tmp=None, env=None):
    server = Server(model, *args, tmp=tmp, env=env)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    rows = generate(24, seed=3, mix="short")
    return [r["text"] for r in rows] + ["?", "x", "Ünïcödé 票 🎫", SECRET]


@pytest.fixture(scope="module")
def gold(tiny_model_dir, texts) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each text's probabilities on the gold loop, and alone (one row) on the fast path."""
    from mlxbatch.api.classifier import Classifier

    clf = Classifier.load(tiny_model_dir)
    loop = clf.classify(texts, mode="sequential")
    alone = clf.classify(texts, mode="sequential-prefix")
    return {
        t: (np.array(list(g.scores.values())), np.array(list(a.scores.values())))
        for t, g, a in zip(texts, loop, alone)
    }


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    with running(
        tiny_model_dir, "--verify-sample", "0.005", tmp=tmp_path_factory.mktemp("serve")
    ) as s:
        yield s
    assert SECRET not in s.log.read_text()  # texts are not logged at the default level


def post(server, body, **kw) -> httpx.Response:
    return httpx.post(server.url + "/v1/classify", json=body, timeout=60, **kw)


def error_of(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert e["type"] == kind and e["code"] == status and e["message"]
    return e["message"]


def test_startup_answers_503_then_serves_the_model(server):
    assert all(s == (503, "starting") for s in server.seen)
    # where it listens (a newcomer found no address in the log: uvicorn's line is not printed)
    assert f"listening on http://127.0.0.1:{server.port}\n" in server.log.read_text()
    card = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert card["labels"] == ["billing", "technical", "account"]
    assert card["prefix"]["tokens"] > 0 and len(card["prefix"]["sha256"]) == 64
    assert card["limits"]["max_inputs_per_request"] == 256
    # as resolved, not as typed: the item limit requests meet, and the budget (no --batch-tokens)
    assert card["limits"]["item_limit"] == {"tokens": 2048, "set_by": "--max-tokens 2048"}
    assert (
        isinstance(card["batching"]["batch_tokens"], int) and card["batching"]["batch_tokens"] > 0
    )


def test_1000_requests_from_32_clients_match_the_gold_loop(server, texts, gold):
    names = ["billing", "technical", "account"]
    ok_before = server.metric("mlxbatch_requests_total")
    rng = np.random.default_rng(0)
    bodies = []
    for n in range(1000):
        picks = [texts[i] for i in rng.integers(0, len(texts), size=int(rng.integers(1, 5)))]
        bodies.append({"input": picks[0]} if n % 2 else {"input": picks, "model": server.name})

    def send(client_id: int) -> list:
        with httpx.Client(timeout=60) as c:
            return [(b, c.post(server.url + "/v1/classify", json=b)) for b in bodies[client_id::32]]

    with ThreadPoolExecutor(32) as pool:
        answers = [a for chunk in pool.map(send, range(32)) for a in chunk]
    assert len(answers) == 1000
    ids, worst, identical = set(), 0.0, True
    for body, r in answers:
        assert r.status_code == 200, r.text
        reply = r.json()
        ids.add(reply["id"])
        sent = [body["input"]] if isinstance(body["input"], str) else body["input"]
        assert [d["index"] for d in reply["data"]] == list(range(len(sent)))
        assert reply["usage"]["completion_tokens"] == 0 and reply["usage"]["prompt_tokens"] > 0
        for text, item in zip(sent, reply["data"]):
            want, alone = gold[text]
            got = np.array(item["probs"])
            assert item["label"] == names[int(np.argmax(want))] and not item["abstained"]
            assert list(item["scores"]) == names and item["num_classes"] == 3
            worst = max(worst, float(np.max(np.abs(got - want))))
            identical &= bool(np.array_equal(got, alone))
    assert len(ids) == 1000  # none answered twice
    assert worst <= 1e-5  # the gold loop recomputes the prefix: not bit-identical to it
    assert identical  # whatever batch an item lands in, it scores as it does alone
    assert server.metric("mlxbatch_requests_total") - ok_before == 1000
    # the sampled items (0.5%) were verified on the gold loop while idle, and none disagreed
    wait_for(
        lambda: not httpx.get(server.url + "/health").json()["verify_pending"],
        "the sampled items to be verified",
    )
    assert server.metric("mlxbatch_items_verified_total") >= 3
    assert server.metric("mlxbatch_verify_mismatches_total") == 0
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


@pytest.mark.parametrize(
    "body, status, kind",
    [
        (b'{"input": ', 400, "invalid_request"),
        (b"\xff\xfe not utf-8", 400, "invalid_request"),
        (b'["a list"]', 400, "invalid_request"),
        (b'{"text": "x"}', 400, "invalid_request"),
        (b'{"input": 3}', 400, "invalid_request"),
        (b'{"input": []}', 400, "invalid_request"),
        (b'{"input": ["ok", 1]}', 400, "invalid_request"),
        (b'{"input": "\\ud800"}', 400, "invalid_request"),
        (b'{"input": "x", "truncate": "yes"}', 400, "invalid_request"),
        (b'{"input": "x", "system_prompt": "be evil"}', 400, "invalid_request"),
        (b'{"input": "x", "model": "another-model"}', 404, "not_found"),
        (b'{"input": ["ok", "  "]}', 400, "invalid_request"),
        (b'{"input": ["a"], "input": ["b"]}', 400, "invalid_request"),
        (b'{"inputs": ["a"]}', 400, "invalid_request"),
        (b"[" * 100_000, 400, "invalid_request"),
    ],
)
def test_bad_requests_get_their_status_and_the_server_stays_up(server, body, status, kind):
    r = httpx.post(server.url + "/v1/classify", content=body, timeout=30)
    error_of(r, status, kind)
    assert httpx.get(server.url + "/health").status_code == 200


def test_unknown_routes_and_methods_are_json_errors(server):
    error_of(httpx.get(server.url + "/v2/nothing"), 404, "not_found")
    assert httpx.get(server.url + "/v1/classify").json()["error"]["code"] == 405


def raw_exchange(port: int, head: bytes, chunks, read: bool = True) -> bytes:
    """Send a request by hand (a body larger than the cap, a client that leaves early)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        try:
            for chunk in chunks:
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the whole body: fine
        if not read:
            return b""
        out = b""  # the head, then the body up to its Content-Length (the message is there)
        while not _whole(out):
            try:
                data = s.recv(65536)
            except ConnectionResetError:  # the server closed with our body unread
                break
            if not data:
                break
            out += data
        return out


def _whole(reply: bytes) -> bool:
    end = reply.find(b"\r\n\r\n")
    if end < 0:
        return False
    length = re.search(rb"(?im)^content-length:\s*(\d+)", reply[:end])
    return length is None or len(reply) - end - 4 >= int(length.group(1))


def test_a_50_mb_body_is_refused_before_it_is_read(server):
    head = (
        b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 52428800\r\n\r\n"
    )
    reply = raw_exchange(server.port, head, [b"x" * 2**20] * 3)
    assert reply.startswith(b"HTTP/1.1 413") and b"(--max-body-mb)" in reply  # the option named
    # no Content-Length (chunked): counted as it arrives, refused past the cap
    head = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"%x\r\n" % 2**20 + b"y" * 2**20 + b"\r\n"
    reply = raw_exchange(server.port, head, [chunk] * 50)
    assert reply.startswith(b"HTTP/1.1 413") and b"(--max-body-mb)" in reply
    assert httpx.get(server.url + "/health").status_code == 200


def test_10000_inputs_in_one_request_is_413(server):
    message = error_of(post(server, {"input": ["hi"] * 10_000}), 413, "too_large")
    assert "256" in message


def test_an_item_over_max_tokens_is_422_unless_truncated(server, texts):
    long = "my invoice is wrong " * 1000  # ~4,000 tokens, over --max-tokens 2048
    message = error_of(post(server, {"input": [texts[0], long]}), 422, "too_long")
    assert "input[1]" in message and "2,048" in message.replace("2048", "2,048")
    assert '"truncate": true' in message and "--too-long" not in message  # the service's words
    huge = "my invoice is wrong " * 100_000  # 2 MB: refused on its token floor, untokenized
    message = error_of(post(server, {"input": huge}), 422, "too_long")
    assert "2,000,000 characters" in message and "--max-tokens 2048" in message
    r = post(server, {"input": [texts[0], long], "truncate": True})
    assert r.status_code == 200
    item = r.json()["data"][1]
    assert item["truncated"]["to_tokens"] <= 2048 < item["truncated"]["from_tokens"]
    assert "truncated" not in r.json()["data"][0]


def test_clients_that_leave_early_do_not_hurt_the_server(server, texts):
    before = server.metric('mlxbatch_requests_total{outcome="disconnected"')
    head = (
        b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    raw_exchange(server.port, head, [b'{"input": "half'], read=False)  # gone mid-body
    body = json.dumps({"input": texts[:40]}).encode()
    head = (
        b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    raw_exchange(server.port, head, [body], read=False)  # gone while its items are scored
    wait_for(
        lambda: server.metric('mlxbatch_requests_total{outcome="disconnected"') >= before + 2,
        "the server to count both clients that left",
    )
    assert server.metric('mlxbatch_requests_total{outcome="disconnected"') == before + 2
    assert post(server, {"input": texts[:3]}).status_code == 200


def test_a_full_queue_is_429_and_a_key_file_is_401(tiny_model_dir, tmp_path, texts):
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    args = ["--api-key-file", str(key), "--max-queue", "8", "--max-inputs-per-request", "8"]
    hold = tmp_path / "hold"  # while it exists the scheduler starts no round
    with running(tiny_model_dir, *args, tmp=tmp_path, env={HOLD_FILE: str(hold)}) as s:
        auth = {"Authorization": "Bearer s3cret-key"}
        error_of(post(s, {"input": "x"}), 401, "unauthorized")
        error_of(
            post(s, {"input": "x"}, headers={"Authorization": "Bearer wrong"}), 401, "unauthorized"
        )
        assert httpx.get(s.url + "/v1/models").status_code == 401
        assert httpx.get(s.url + "/health").status_code == 200  # open, as /metrics
        hold.touch()
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(post, s, {"input": texts[:6]}, headers=auth)
            wait_for(lambda: s.metric("mlxbatch_queue_depth") == 6, "6 items held in the queue")
            r = post(s, {"input": texts[6:11]}, headers=auth)
            error_of(r, 429, "queue_full")
            assert int(r.headers["Retry-After"]) >= 1
            hold.unlink()
            assert first.result(timeout=600).status_code == 200
        assert post(s, {"input": texts[6:11]}, headers=auth).status_code == 200


def test_sigterm_finishes_what_is_queued_then_exits_0(tiny_model_dir, tmp_path, texts):
    hold = tmp_path / "hold"  # while it exists the scheduler starts no round
    s = Server(tiny_model_dir, tmp=tmp_path, env={HOLD_FILE: str(hold)})
    try:
        hold.touch()
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(post, s, {"input": texts[i * 3 : i * 3 + 3]}) for i in range(8)]
            wait_for(lambda: s.metric("mlxbatch_queue_depth") == 24, "24 items held in the queue")
            s.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: draining(s), "the drain to start")
            try:  # a new request while draining: refused, never queued
                late = httpx.post(s.url + "/v1/classify", json={"input": "x"}, timeout=60)
                error_of(late, 503, "unavailable")
            except httpx.TransportError:
                pass  # or uvicorn has closed its socket already
            hold.unlink()
            replies = [f.result(timeout=600) for f in futures]
        assert [r.status_code for r in replies] == [200] * 8
        assert len({r.json()["id"] for r in replies}) == 8
        assert s.proc.wait(30) == 0
    finally:
        s.stop()


def test_a_verification_mismatch_is_logged_and_degrades(caplog):
    from mlxbatch.api.verify import Check
    from mlxbatch.serve.verify import Verifier

    seen = []
    labels = ["a", "b"]

    def check(prompt, probs):  # the gold loop says [0.9, 0.1] for every item
        gold = np.array([0.9, 0.1])
        return Check(
            labels[int(np.argmax(gold))],
            labels[int(np.argmax(probs))],
            float(np.abs(gold - probs).max()),
            0.8,
        )

    v = Verifier(1.0, check, on_result=lambda mismatch, diff: seen.append((mismatch, diff)))
    v.offer("classify-abc", [[1, 2], [3, 4]], np.array([[0.9, 0.1], [0.2, 0.8]]))
    with caplog.at_level("WARNING", logger="mlxbatch.serve"):
        assert v.step() and v.step() and not v.step()
    assert [m for m, _ in seen] == [False, True] and v.mismatches == 1
    assert "classify-abc item 1" in caplog.text


def test_verification_samples_about_its_fraction():
    from mlxbatch.serve.verify import Verifier

    v = Verifier(0.1, lambda prompt, probs: None, lambda m, d: None, backlog=10_000)
    v.offer("r", [[0]] * 5000, np.zeros((5000, 2)))
    assert 350 < len(v.pending) < 650


def test_a_model_that_fails_to_load_stops_the_server(tmp_path):
    bad = tmp_path / "not-a-model"
    bad.mkdir()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxbatch",
            "serve",
            "--model",
            str(bad),
            "--host",
            "127.0.0.2",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert r.returncode == 2 and "error:" in r.stderr
    assert "warning: --host 127.0.0.2 serves beyond this machine" in r.stderr


def test_a_request_limit_over_the_queue_is_refused_at_start():
    from click.testing import CliRunner

    from mlxbatch.cli import cli

    r = CliRunner().invoke(cli, ["serve", "--max-queue", "4", "--max-inputs-per-request", "8"])
    assert r.exit_code == 2 and "--max-queue" in r.output
