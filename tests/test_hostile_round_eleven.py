"""Round eleven: what this stop's hostile passes found, each with the case that found it:
config values of the wrong type that were tracebacks, an empty --model taken for none. (The
service's: tests/test_serve_hostile.py.)"""

from __future__ import annotations

import json
import shutil

import pytest
from cli_run import invoke, one_line_error

from mlxbatch.errors import ModelError


def _with_config(tiny_model_dir, tmp_path, name: str, **changes):
    """A copy of the tiny model whose config.json has `changes`, marked a converted model (a
    synthetic one is passed over by the default-model search for that alone)."""
    d = shutil.copytree(tiny_model_dir, tmp_path / name)
    cfg = json.loads((d / "config.json").read_text()) | changes
    (d / "config.json").write_text(json.dumps(cfg))
    manifest = json.loads((d / "mlxbatch.json").read_text()) | {"synthetic": False}
    (d / "mlxbatch.json").write_text(json.dumps(manifest))
    return d


def test_config_values_of_the_wrong_type_are_one_line_not_a_traceback(tiny_model_dir, tmp_path):
    """`"model_type": ["qwen2"]` was `TypeError: unhashable type: 'list'` (classify, doctor,
    and classify with no --model where such a folder sat beside a good one); a list as
    rope_scaling's `rope_type` took `mlxbatch models` down."""
    from mlxbatch.model.config import ModelArgs
    from mlxbatch.model.defaults import not_runnable

    base = json.loads((tiny_model_dir / "config.json").read_text())
    for changes, said in (
        ({"model_type": ["qwen2"]}, "model_type \\['qwen2'\\] is not supported"),
        ({"model_type": {"name": "gemma3"}}, "is not supported"),
        ({"rope_scaling": {"rope_type": ["linear"], "factor": 2.0}}, "rope scaling \\['linear'\\]"),
        ({"rope_scaling": {"type": {"x": 1}, "factor": 2.0}}, "rope scaling {'x': 1}"),
    ):  # fmt: skip
        with pytest.raises(ModelError, match=said):
            ModelArgs.from_dict(base | changes)
    bad = _with_config(tiny_model_dir, tmp_path / "w", "a-bad", model_type=["qwen2"])
    worse = _with_config(tiny_model_dir, tmp_path / "w", "b-worse",
                         rope_scaling={"rope_type": ["linear"], "factor": 2.0})  # fmt: skip
    good = _with_config(tiny_model_dir, tmp_path / "w", "c-good")
    assert "model_type" in not_runnable(bad) and "rope scaling" in not_runnable(worse)
    r = invoke(["classify", "-", "--model", bad, "--labels", "a,b"], tmp_path, input="hi\n")
    one_line_error(r, "model_type")
    env = {"MLXBATCH_WEIGHTS": str(tmp_path / "w")}
    r = invoke(["classify", "-", "--labels", "a,b"], tmp_path, input="hi\n", env=env)
    assert r.exit_code == 0, r.output[-2000:]
    assert str(good) in r.stderr and "passing over" in r.stderr
    listed = json.loads(invoke(["models", "--json"], tmp_path, env=env).stdout)
    assert {m["name"] for m in listed} >= {"b-worse", "c-good"}


def test_an_empty_model_name_is_refused_not_taken_for_the_default(tiny_model_dir, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    """`--model ""` (a script's unset $MODEL) ran as if no --model was given: it wrote a
    958 MB synthetic model under ./weights and classified with it, exit 0; the Python API
    said "config.json: not found (is . a model directory?)". Both say it now, in one line."""
    from mlxbatch import Classifier

    monkeypatch.setenv("MLXBATCH_WEIGHTS", str(tmp_path / "none"))
    for empty in ("", " "):
        r = invoke(["classify", "-", "--model", empty, "--labels", "a,b"], tmp_path,
                   input="hi\n")  # fmt: skip
        one_line_error(r, "empty string")
        with pytest.raises(ModelError, match="empty string"):
            Classifier.load(empty, ["a", "b"])
    assert not (tmp_path / "weights").exists() and not (tmp_path / "none").exists()


def test_many_multi_token_labels_stay_within_the_memory_bound(tiny_model_dir, tmp_path):
    """Forty four-token labels behind 20 tickets peaked at 1.36 GiB against a printed bound of
    1.03 (300 such labels were killed by the kernel at 23.7 GB, with no line): the later label
    tokens' logits were made for every row at once and counted once, and the label rows'
    attention scores, nearly all padding, were counted twice where they live four times."""
    import re
    import subprocess
    import sys

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"ticket {i}: the invoice was charged twice "
                                               f"and the refund is {i} days late"}) + "\n"
                           for i in range(20)))  # fmt: skip
    labels = ",".join(f"label{i:03d}" for i in range(40))
    r = subprocess.run([sys.executable, "-m", "mlxbatch", "classify", str(src), "--model",
                        str(tiny_model_dir), "--labels", labels, "-o", str(tmp_path / "o.jsonl")],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    peak, bound = map(float, re.search(r"peak memory ([\d.]+) GiB \(bound ([\d.]+) GiB\)",
                                       r.stderr).groups())  # fmt: skip
    assert peak <= bound, r.stderr


def test_the_continuation_pass_gives_the_same_bits_a_few_rows_at_a_time(tiny_model_dir,
                                                                        monkeypatch):  # fmt: skip
    """The later label tokens' log-probs, taken a row at a time to bound their memory, are
    the ones all rows at once give, bit for bit."""
    import mlx.core as mx
    import numpy as np

    from mlxbatch import Classifier
    from mlxbatch.engine import labels as lab

    clf = Classifier.load(tiny_model_dir, [f"label{i:03d}" for i in range(6)])
    model, labels = clf.lm.model, clf.labels
    assert labels.max_len > 1
    h_lab = mx.random.normal((5 * len(labels.names), labels.max_len - 1, model.args.hidden_size),
                             key=mx.random.key(0))  # fmt: skip
    whole = np.array(lab.continuation_logprobs(model, h_lab, labels, host_kernels=True))
    monkeypatch.setattr(lab, "LOGIT_BYTES", 1)  # one row a chunk
    assert lab.continuation_rows(10, model.args.vocab_size) == 1
    rows = np.array(lab.continuation_logprobs(model, h_lab, labels, host_kernels=True))
    assert np.array_equal(whole, rows)


def test_rows_heavy_with_labels_are_planned_as_few_a_batch_as_memory_needs(tiny_model_dir):
    """200 four-token labels: each row carries its cache and attention once per label, and a
    budget floor of 64 tokens, raised to fit the longest item, planned 3 rows a batch where
    one row's label pass took 3.6 GB; with the buffers MLX kept (7 GB, not in the bound) a
    24 GB machine killed the job. The rows and the budget now come down as far as memory
    needs; an ordinary label set keeps its 64 rows."""
    from mlxbatch import Classifier

    many = Classifier.load(tiny_model_dir, [f"label{i:03d}" for i in range(200)]).footprint
    few = Classifier.load(tiny_model_dir, ["spam", "ham"]).footprint
    avail = int(2.5 * many.batch_cost(1, 1, 1).total)  # half of it holds one such row, not 2
    assert many.batch_cost(2, 2, 1).total > avail / 2
    assert many.most_rows(64, avail) == 1 and few.most_rows(64, avail) == 64
    assert many.memory_budget(64, 1, avail) == 1
    assert few.memory_budget(64, 1, avail) == few.memory_budget(64, 1, 1 << 40) >= 64


def test_buffers_kept_for_reuse_are_lowered_to_what_the_bound_leaves():
    """MLX's cache of freed buffers was raised to a window's largest activations and never
    lowered: beside batches that took most of the memory it kept gigabytes more."""
    import mlx.core as mx

    from mlxbatch.runtime.memory import keep_freed_buffers

    before = mx.set_cache_limit(32 << 20)
    try:
        keep_freed_buffers(256 << 20)
        keep_freed_buffers(1 << 20)  # lower, with no ceiling: kept
        assert mx.set_cache_limit(256 << 20) == 256 << 20
        keep_freed_buffers(1 << 20, 64 << 20)  # what the bound leaves: 64 MB
        assert mx.set_cache_limit(64 << 20) == 64 << 20
    finally:
        mx.set_cache_limit(before)


def test_a_job_refused_before_its_first_row_leaves_no_journal(tiny_model_dir, tmp_path):
    """A naive batch refused for memory, after the scan, left a journal holding only its
    header: the run the refusal advised (a lower --max-batch) was refused ("holds an
    interrupted run: add --resume"), and with --resume it ran the shape the journal recorded,
    the one just refused, unchecked as a resumed plan."""
    import subprocess
    import sys

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [{"text": f"ticket {i} about a refund"} for i in range(24)]
    rows[3]["text"] = " ".join(f"word{i}" for i in range(600))  # ~2,600 tokens: under the limit
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**__import__("os").environ, "MLXBATCH_MEMORY_LIMIT": "3G"}

    def classify(*extra):
        return subprocess.run([sys.executable, "-m", "mlxbatch", "classify", str(src), "--model",
                               str(tiny_model_dir), "--labels", "spam,ham", "-o", str(out),
                               "--mode", "naive", *extra],
                              capture_output=True, text=True, timeout=600, env=env)  # fmt: skip

    r = classify()
    assert r.returncode == 2 and "one batch needs about" in r.stderr, r.stderr[-2000:]
    assert not out.exists() and not (tmp_path / "out.jsonl.part").exists()
    r = classify("--max-batch", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(out.read_text().splitlines()) == 24


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
