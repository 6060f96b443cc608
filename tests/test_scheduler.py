"""The scheduler seam: items in by key, batches cut by the policy, results out by key, from a
whole file at once, from arriving work, and from several callers at once."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mlxbatch.runtime import testhold

TEXTS = [
    f"ticket {k}: " + "my invoice is wrong and the app crashes " * (k % 7 + 1) for k in range(40)
]


@pytest.fixture(scope="module")
def clf(tiny_model_dir):
    from mlxbatch.api.classifier import Classifier

    return Classifier.load(tiny_model_dir)


def policy(clf, planner="greedy", batch_tokens=200, max_batch=8):
    from mlxbatch.engine.scheduler import BatchPolicy

    return BatchPolicy(planner, "fast", batch_tokens, max_batch, None)


def item(engine, key, text):
    from mlxbatch.engine.item import Item

    prompt = engine.prompt(text)
    return Item(key, prompt, len(engine.fed(prompt)))


def test_every_key_comes_back_once_with_its_own_scores(clf):
    from mlxbatch.engine.scheduler import Scheduler

    engine = clf.engine
    sched = Scheduler(engine, policy(clf))
    keys = [("file", k) for k in range(len(TEXTS))]
    for key, text in zip(keys, TEXTS):
        sched.add(item(engine, key, text))
    with pytest.raises(KeyError):
        sched.add(item(engine, keys[0], TEXTS[0]))
    batches = sched.plan()
    assert sorted(k for b in batches for k in b.indices) == sorted(keys)
    got = {}
    for batch, probs, record in sched.step(batches):
        assert record.rows == len(batch.indices) and record.padded_tokens >= record.useful_tokens
        got.update(zip(batch.indices, probs))
    assert sched.queued == 0 and set(got) == set(keys)
    alone = engine.score_batches([[engine.prompt(t)] for t in TEXTS])
    for key, want in zip(keys, alone):
        np.testing.assert_allclose(got[key], want[0], atol=2e-6)


def test_a_step_scores_one_batch_per_lane_oldest_first(clf):
    from mlxbatch.engine.scheduler import Scheduler

    engine = clf.engine
    sched = Scheduler(engine, policy(clf, batch_tokens=64, max_batch=2))
    for k, text in enumerate(TEXTS[:12]):
        sched.add(item(engine, k, text), arrived=float(k))
    done = list(sched.step(lanes=engine.lanes))
    assert 1 <= len(done) <= engine.lanes
    assert 0 in {k for batch, _, _ in done for k in batch.indices}  # the oldest item went first
    left = sched.queued
    assert left == 12 - sum(len(b.indices) for b, _, _ in done)
    while sched.queued:
        assert list(sched.step(lanes=engine.lanes))
    assert not list(sched.step(lanes=engine.lanes))


def test_arriving_work_is_batched_and_every_caller_gets_its_own_answers(clf):
    """Requests of one to five items from 16 threads: each future holds its items' scores in
    its order; the queue limit refuses at once; closing drains what is queued."""
    from mlxbatch.engine.live import LiveScheduler, QueueFull

    engine = clf.engine
    prompts = [item(engine, None, t) for t in TEXTS]
    alone = np.concatenate(engine.score_batches([[p.prompt] for p in prompts]))
    records = []
    live = LiveScheduler(engine, policy(clf), max_wait=0.01, max_queue=64, on_batch=records.append)
    live.start()

    def request(n: int) -> None:
        picks = [(n * 7 + j) % len(prompts) for j in range(n % 5 + 1)]
        got = live.submit([prompts[i] for i in picks]).result(timeout=120)
        assert got.shape == (len(picks), len(engine.labels.names))
        np.testing.assert_allclose(got, alone[picks], atol=2e-6)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(request, range(48)))
    assert records and max(r.rows for r in records) > 1  # callers' items shared batches
    with pytest.raises(QueueFull) as full:
        live.submit(prompts * 2)  # 80 items > the 64 the queue may hold
    assert full.value.retry_after > 0
    pending = live.submit(prompts[:3])
    live.close(drain=True)
    np.testing.assert_allclose(pending.result(timeout=60), alone[:3], atol=2e-6)
    with pytest.raises(RuntimeError, match="draining"):
        live.submit(prompts[:1])


def test_classify_from_eight_threads_at_once(clf):
    """Eight callers share the lanes (never a lane's buffers, never the BLAS setting): every
    answer equals the same call made alone, to the bit, and the gold loop's labels."""
    reference = clf.classify(TEXTS)
    gold = clf.classify(TEXTS[:8], mode="sequential")
    errors: list[BaseException] = []

    def caller(n: int) -> None:
        try:
            for _ in range(2):
                got = clf.classify(TEXTS)
                assert [p.scores for p in got] == [p.scores for p in reference]
            mine = clf.classify(TEXTS[:8], mode="sequential" if n % 4 == 0 else "sorted")
            for p, g in zip(mine, gold):
                assert p.label == g.label
                np.testing.assert_allclose(
                    list(p.scores.values()), list(g.scores.values()), atol=2e-6
                )
        except BaseException as e:  # noqa: BLE001  (re-raised in the main thread)
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors[0]
    assert not any(t.is_alive() for t in threads)


def test_the_python_api_refuses_what_it_cannot_classify(clf):
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.errors import ItemTooLong, JobError, UsageError

    with pytest.raises(UsageError, match="a list of strings"):
        clf.classify("hello")
    with pytest.raises(UsageError, match=r"texts\[1\]"):
        clf.classify(["fine", 3])
    # named as the API takes them, not as the CLI's flags
    with pytest.raises(
        ItemTooLong, match=r"texts\[0\].*set by max_tokens=8 \(see max_tokens, truncate\)$"
    ):
        clf.classify(["word " * 50], max_tokens=8)
    with pytest.raises(ItemTooLong, match=r"set by max_tokens=8 \(see max_tokens, truncate\)$"):
        clf.prepare("word " * 50, max_tokens=8)
    with pytest.raises(JobError, match=r"batch_tokens=1000000000; lower it$"):
        clf.classify(["x"], batch_tokens=10**9)
    cut = clf.classify(["word " * 50], max_tokens=8, truncate=True)
    assert len(cut) == 1 and cut[0].label in clf.labels.names
    # over the tiny model's context, and what memory holds (one rule for every entry: the
    # smaller names the limit): refused before any allocation
    huge = "word " * 50_000
    with pytest.raises(ItemTooLong, match="context|free memory"):
        clf.classify([huge])
    with pytest.raises(UsageError, match="labels"):
        Classifier.load(clf.lm.path, labels="a,b")
    with pytest.raises(UsageError, match=r"labels\[1\]"):
        Classifier.load(clf.lm.path, labels=["a", 2])
    with pytest.raises(UsageError, match="mode"):
        clf.classify(["x"], mode="fastest")
    for bad in (None, 5, "", "  "):  # prepare checks a text as classify does
        with pytest.raises(UsageError, match=r"^text"):
            clf.prepare(bad)


def test_closing_without_a_drain_mid_round_fails_the_requests_and_ends_the_thread(clf):
    """`close(drain=False)` from the server's thread between two batches of one round fails
    the requests, and the round's next batch meets no missing request (no KeyError)."""
    from mlxbatch.engine.live import LiveScheduler

    engine = clf.engine

    class TwoLanes:  # the engine, stepped two batches a round whatever this machine's lanes
        lanes = 2

        def __getattr__(self, name):
            return getattr(engine, name)

    def close_from_another_thread(record):  # as the server does, after the round's 1st batch
        closer = threading.Thread(target=live.close, kwargs={"drain": False, "timeout": 0.01})
        closer.start()
        closer.join()

    failures = []
    previous, threading.excepthook = threading.excepthook, failures.append
    try:
        live = LiveScheduler(
            TwoLanes(),
            policy(clf, batch_tokens=64, max_batch=2),
            max_wait=0.05,
            on_batch=close_from_another_thread,
        )
        futures = [live.submit([item(engine, None, t)]) for t in TEXTS[:8]]
        live.start()
        live._thread.join(60)
    finally:
        threading.excepthook = previous
    assert not live._thread.is_alive()
    assert not failures, [f.exc_value for f in failures]
    closed = [f for f in futures if f.exception(timeout=1) is not None]
    assert 0 < len(closed) < len(futures)  # the first batch's requests were answered
    for future in closed:
        with pytest.raises(RuntimeError, match="closed"):
            future.result()


class OneLane:  # the engine, stepped one batch a round whatever this machine's lanes
    lanes = 1

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_a_small_request_is_not_kept_behind_a_large_one(clf, monkeypatch):
    """Twelve texts of one request, then one of another, queued together, a batch a round:
    the second request is scored in the second round. Taking the batches that hold the oldest
    items first, it waited for all twelve (a client's 256 long texts held the requests after
    it for minutes)."""
    from mlxbatch.engine.live import LiveScheduler

    engine, records, hold = clf.engine, [], threading.Event()
    hold.set()
    monkeypatch.setattr(testhold, "held", hold.is_set)
    live = LiveScheduler(
        OneLane(engine), policy(clf, max_batch=1), max_wait=0.001, on_batch=records.append
    )
    live.start()
    long = [t for t in TEXTS if t.count("crashes") == 7][:1] * 12
    large = live.submit([item(engine, None, t) for t in long])
    small_done_after = []
    small = live.submit([item(engine, None, "refund please")])
    small.add_done_callback(lambda f: small_done_after.append(len(records)))
    hold.clear()
    small.result(timeout=120)
    large.result(timeout=120)
    live.close()
    assert len(records) == 13
    assert small_done_after == [1], small_done_after  # the round before it scored large's first


def test_a_stream_of_small_requests_does_not_starve_a_large_one(clf):
    """A new one-text request after every batch, 40 in all, while a six-text request waits:
    the six are scored before the stream ends, and the stream got no more padded tokens than
    they did meanwhile (a request that joined at nothing served won every round)."""
    from mlxbatch.engine.live import LiveScheduler

    engine, records, sent = clf.engine, [], []
    short = item(engine, None, "refund please")
    large_items = [item(engine, None, TEXTS[k]) for k in range(6)]
    assert min(i.fed for i in large_items) > short.fed  # a batch's width tells whose it is

    def another(record) -> None:
        records.append(record)
        if len(sent) < 40:
            sent.append(live.submit([short]))

    live = LiveScheduler(
        OneLane(engine), policy(clf, max_batch=1), max_wait=0.001, on_batch=another
    )
    large_done_after = []
    large = live.submit(large_items)
    large.add_done_callback(lambda f: large_done_after.append(len(records)))
    live.start()
    large.result(timeout=120)
    deadline = time.monotonic() + 120
    while len(sent) < 40 and time.monotonic() < deadline:  # the stream goes on after it
        time.sleep(0.01)
    assert len(sent) == 40 and all(f.result(timeout=120) is not None for f in sent)
    live.close()
    before = records[: large_done_after[0]]
    stream = sum(r.width for r in before if r.width == short.fed)
    assert len(before) < 6 + 40 and stream <= sum(i.fed for i in large_items), (
        [r.width for r in before],
        stream,
    )


def test_a_drain_answers_the_requests_nearest_done_first(clf, monkeypatch):
    """Four requests of six texts queued, then the scheduler is closed with a drain: its rounds
    take the requests one at a time (the first is answered after its own three batches,
    and each before the next), so a drain cut short by its deadline has answered most of what
    it scored. The fair rounds brought every request to its end at once: a 20 s drain of 16
    requests answered none."""
    from mlxbatch.engine.live import LiveScheduler

    engine, records, hold = clf.engine, [], threading.Event()
    hold.set()
    monkeypatch.setattr(testhold, "held", hold.is_set)
    live = LiveScheduler(
        OneLane(engine), policy(clf, max_batch=2), max_wait=0.001, on_batch=records.append
    )
    live.start()
    done_after = []
    futures = []
    for r in range(4):  # each request one text of every length: the planner mixes them
        texts = [TEXTS[(k + r) % len(TEXTS)] for k in range(0, 36, 6)]
        futures.append(live.submit([item(engine, None, t) for t in texts]))
        futures[-1].add_done_callback(lambda f, r=r: done_after.append((len(records), r)))
    closing = threading.Thread(target=live.close)  # drains: joins the scheduler's thread
    closing.start()
    time.sleep(0.05)
    hold.clear()
    closing.join(120)
    assert all(f.result(timeout=1).shape == (6, 3) for f in futures)
    assert len(records) == 12
    assert [r for _, r in done_after] == [0, 1, 2, 3], done_after
    # each answered in its own third batch (delivered before that batch's record is kept)
    assert [n for n, _ in done_after] == [2, 5, 8, 11], done_after
