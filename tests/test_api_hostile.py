"""Hostile calls of the Python API: arguments it cannot use, texts it cuts, scores that are not
finite, a classifier in a forked child."""

from __future__ import annotations

import itertools

import pytest

from mlxbatch import Classifier


def test_the_python_api_takes_only_what_it_can_use(tiny_model_dir):
    import pytest

    from mlxbatch import Classifier
    from mlxbatch.errors import UsageError

    labels = ["billing", "technical"]
    pairs = [("I was charged twice", "billing"), ("the app crashes", "technical")]
    listed = Classifier.load(tiny_model_dir, labels=labels, examples=pairs)
    streamed = Classifier.load(tiny_model_dir, labels=labels, examples=(p for p in pairs))
    assert streamed.examples == listed.examples == tuple(pairs)  # a generator, read once
    with pytest.raises(UsageError, match="examples: expected"):
        Classifier.load(tiny_model_dir, labels=labels, examples=5)
    for flag in ("no", 1, None):
        with pytest.raises(UsageError, match="truncate: expected True or False"):
            listed.classify(["hello"], truncate=flag)
    for empty in ("", "  \n"):
        with pytest.raises(UsageError, match=r"texts\[1\] is empty \(as classify refuses"):
            listed.classify(["hello", empty])
    assert listed.classify(["hello"], truncate=False)[0].label in labels


def test_a_classifier_in_a_forked_child_fails_instead_of_hanging(tiny_model_dir):
    import multiprocessing

    from mlxbatch import Classifier

    clf = Classifier.load(tiny_model_dir, labels=["billing", "technical"])
    clf.classify(["warm"])
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def child():
        try:
            clf.classify(["in the child"])
            queue.put("classified")
        except Exception as e:  # the refusal, sent back
            queue.put(str(e))

    proc = ctx.Process(target=child)
    proc.start()
    try:
        said = queue.get(timeout=120)
        proc.join(60)
        assert "forked child" in said and "spawn" in said, said
        assert proc.exitcode == 0  # the child ended, not hung in MLX or OpenBLAS
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_the_python_api_refuses_odd_priors_flags_and_counts(tiny_model_dir):
    """A list as `prior`, "0.5" or True as a weight, `calibrate="no"` and `max_batch=None` are
    refused by name, not taken or crashed on deep inside; NumPy's integers are whole numbers."""
    import numpy as np
    import pytest

    from mlxbatch import Classifier
    from mlxbatch.errors import UsageError

    for prior, words in (
        ([0.5, 0.5], "prior: expected {label: weight}"),
        ({"a": "0.5", "b": 0.5}, "prior['a']: expected a number, got str"),
        ({"a": True, "b": 0.5}, "prior['a']: expected a number, got bool"),
    ):
        with pytest.raises(UsageError, match=words.replace("[", r"\[").replace("{", r"\{")):
            Classifier.load(tiny_model_dir, labels=["a", "b"], prior=prior)
    with pytest.raises(UsageError, match="calibrate: expected True or False"):
        Classifier.load(tiny_model_dir, labels=["a", "b"], calibrate="no")
    clf = Classifier.load(tiny_model_dir, labels=["a", "b"], prior={"a": 1, "b": 3.0})
    with pytest.raises(UsageError, match="max_batch must be a positive whole number, not None"):
        clf.classify(["hi"], max_batch=None)
    for probs in (np.ones(2), np.ones((1, 3)), np.ones((1, 1, 2))):
        with pytest.raises(UsageError, match=r"probs: expected an \(N, 2\) array"):
            clf.predictions(probs)
    same = clf.classify(["hi there"], batch_tokens=np.int64(512), max_batch=np.int32(4))
    assert same == clf.classify(["hi there"], batch_tokens=512, max_batch=4)


def test_the_python_api_refuses_unordered_texts(tiny_model_dir):
    # a dict was classified by its keys, a set in hash order: answers matched to nothing
    from mlxbatch import Classifier
    from mlxbatch.errors import UsageError

    clf = Classifier.load(tiny_model_dir)
    for unordered in ({"I was charged twice": 1}, {"a text", "another"}, frozenset({"a"})):
        with pytest.raises(UsageError, match="unordered collection"):
            clf.classify(unordered)
    assert len(clf.classify(t for t in ["hello", "world"])) == 2  # a generator has an order


def test_a_text_is_cut_the_same_way_on_every_call(tiny_model_dir, monkeypatch):
    # the item limit was measured from the free memory on every call: with 4 GiB taken in
    # between, the same text was cut at 10,615 tokens, then at 9,637 (other scores)
    from mlxbatch import Classifier
    from mlxbatch.api import spec

    clf = Classifier.load(tiny_model_dir, ["billing", "bug"])
    weights = clf.engine.footprint.weight_bytes
    free = itertools.cycle([weights + (64 << 20), weights + (16 << 20)])  # less at every other call
    monkeypatch.setattr(spec, "available_bytes", lambda: next(free))
    text = "my invoice was charged twice this month " * 200  # over what 64 MiB holds
    first = clf.classify([text], truncate=True)
    assert first == clf.classify([text], truncate=True)
    cut = clf.prepare(text, truncate=True).truncated
    assert cut is not None and cut == clf.prepare(text, truncate=True).truncated


def test_the_python_api_scores_each_distinct_prompt_once(tiny_model_dir, monkeypatch):
    """`clf.classify(["same text"] * 20_000)` took 53 s (every copy scored) where classify's
    file job took 1.1 s; the answers are each text's own, in input order."""
    import pytest

    from mlxbatch.api import classifier
    from mlxbatch.errors import ItemTooLong

    clf = Classifier.load(tiny_model_dir, labels=["spam", "ham"])
    texts = ["buy now", "hello there", "buy now", "meeting at 3", "hello there"] * 40
    alone = {t: clf.classify([t])[0] for t in set(texts)}
    sizes = []
    real = classifier.Scheduler

    def counting(engine, policy, items):
        items = list(items)
        sizes.append(len(items))
        return real(engine, policy, items)

    monkeypatch.setattr(classifier, "Scheduler", counting)
    got = clf.classify(texts)
    assert sizes == [3] and got == [alone[t] for t in texts]
    with pytest.raises(ItemTooLong, match=r"^texts\[1\]: "):  # its first place, as before
        clf.classify(["ok", "word " * 300, "ok", "word " * 300], max_tokens=64)


def test_the_python_api_says_which_texts_it_cut(tiny_model_dir):
    """`truncate=True` cut texts without a word to a Python caller (classify's rows and the
    service name the cut: `truncated`)."""
    clf = Classifier.load(tiny_model_dir, labels=["spam", "ham"])
    long = "word " * 300
    got = clf.classify(["short", long, "short", long], max_tokens=64, truncate=True)
    cut = clf.prepare(long, max_tokens=64, truncate=True).truncated
    assert cut and cut["to_tokens"] <= 64 < cut["from_tokens"]
    assert [p.truncated for p in got] == [None, cut, None, cut]


def test_the_python_api_gives_no_label_for_scores_that_are_not_finite(tiny_model_dir, tmp_path):
    """`predictions` of NaN scores answered the first label (argmax reads NaN first), and
    `classify` on a model with NaN weights answered it for every text, where classify's rows
    are error rows."""
    import shutil

    import mlx.core as mx
    import numpy as np
    import pytest

    from mlxbatch import Classifier
    from mlxbatch.errors import ModelError

    clf = Classifier.load(tiny_model_dir, labels=["spam", "ham", "eggs"])
    (said,) = clf.predictions(np.full((1, 3), np.nan, np.float32))
    assert said.label is None and not said.abstained
    model = shutil.copytree(tiny_model_dir, tmp_path / "nan")
    t = mx.load(str(model / "model.safetensors"))
    t["model.norm.weight"] = mx.full(t["model.norm.weight"].shape, float("nan"))
    mx.save_safetensors(str(model / "model.safetensors"), t)
    with pytest.raises(ModelError, match=r"^texts\[0\]: the model gave non-finite scores"):
        Classifier.load(model, labels=["spam", "ham"]).classify(["charged twice"])


def test_python_api_numbers_past_a_float_are_short_refusals(tiny_model_dir):
    """A prior weight of 10**400 raised a bare OverflowError; a min_confidence of 10**400 was
    refused with its 401 digits in the message."""
    import pytest

    from mlxbatch import Classifier
    from mlxbatch.errors import LabelError

    with pytest.raises(LabelError, match="past a float's range"):
        Classifier.load(tiny_model_dir, labels=["spam", "ham"], prior={"spam": 10**400, "ham": 1})
    with pytest.raises(LabelError) as e:
        Classifier.load(tiny_model_dir, labels=["spam", "ham"], min_confidence=10**400)
    assert len(str(e.value)) < 120 and "not between 0 and 1" in str(e.value)
