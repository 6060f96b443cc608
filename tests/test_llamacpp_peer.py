"""The llama.cpp bench peer: converter lookup, command and prefix without llama.cpp; with it
(the `llamacpp` extra and $MLXBATCH_LLAMA_CPP_SRC), labels that agree with the gold loop."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from mlxbatch.bench.llamacpp import (
    SRC_ENV,
    LlamaCppOptions,
    cache_key,
    convert_command,
    find_converter,
    llamacpp_peer,
    score_gguf,
    shared_prefix_len,
)
from mlxbatch.bench.peers import run_peers
from mlxbatch.engine.scheduler import score_all


def _llama_tree(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "convert_hf_to_gguf.py").write_text("")
    (root / "gguf-py").mkdir()
    return root


def test_the_converter_is_found_in_llama_cpp_or_its_python_sdist(tmp_path, monkeypatch):
    monkeypatch.delenv(SRC_ENV, raising=False)
    assert find_converter(None)[0] is None and "--llama-cpp-src" in find_converter(None)[1]
    direct = _llama_tree(tmp_path / "llama.cpp")
    sdist = tmp_path / "llama_cpp_python-0.3.36"
    _llama_tree(sdist / "vendor" / "llama.cpp")
    assert find_converter(direct)[0] == direct / "convert_hf_to_gguf.py"
    assert find_converter(sdist)[0] == sdist / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    monkeypatch.setenv(SRC_ENV, str(sdist))
    assert find_converter(None)[0] == sdist / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    (direct / "gguf-py").rmdir()  # the converter needs its own gguf-py next to it
    converter, why = find_converter(direct)
    assert converter is None and "gguf-py" in why


def test_the_converter_command_and_the_cache_key(tmp_path):
    conv = tmp_path / "convert_hf_to_gguf.py"
    assert convert_command(conv, tmp_path / "m", "q8_0", tmp_path / "o.gguf") == [
        sys.executable,
        str(conv),
        str(tmp_path / "m"),
        "--outtype",
        "q8_0",
        "--outfile",
        str(tmp_path / "o.gguf"),
    ]
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64}')
    (model / "model.safetensors").write_bytes(b"x")
    key = cache_key(model, conv)
    assert cache_key(model, conv) == key
    (model / "model.safetensors").write_bytes(b"xy")
    assert cache_key(model, conv) != key
    assert cache_key(model, tmp_path / "other" / "convert_hf_to_gguf.py") != cache_key(model, conv)


def test_the_shared_prefix_leaves_each_prompt_a_token():
    assert shared_prefix_len([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert shared_prefix_len([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_prefix_len([[1, 2, 3]]) == 2
    assert shared_prefix_len([[7, 1], [8, 1]]) == 0


def test_labels_of_several_tokens_leave_out_the_peers_that_score_first_tokens(tmp_path):
    out = run_peers(
        tmp_path,
        [[1, 2, 3]],
        [[5, 7], [6]],
        [0],
        4096,
        8,
        8,
        ("mlx-lm", "transformers"),
        lambda m: None,
    )
    assert [p["name"] for p in out] == ["mlx-lm", "transformers"]
    assert all("first token only" in p["error"] for p in out)


def test_llama_cpp_names_both_peers_and_says_why_they_cannot_run(tmp_path, monkeypatch):
    monkeypatch.delenv(SRC_ENV, raising=False)
    out = run_peers(
        tmp_path,
        [[1, 2, 3]],
        [[5], [6]],
        [0],
        4096,
        8,
        8,
        ("llama.cpp", "llama.cpp-f32"),
        lambda m: None,
        LlamaCppOptions(),
    )
    assert [p["name"] for p in out] == ["llama.cpp F32", "llama.cpp Q8_0"]
    installed = importlib.util.find_spec("llama_cpp") is not None
    why = "--llama-cpp-src" if installed else "mlxbatch[llamacpp]"
    assert all(why in p["error"] for p in out)


def _skip_without_llama_cpp() -> Path:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip(
            "llama_cpp not importable: pip install 'mlxbatch[llamacpp]' (compiles llama.cpp)"
        )
    converter, why = find_converter(None)
    if converter is None:
        pytest.skip(f"{why}")
    return converter


def test_llama_cpp_agrees_with_the_gold_loop_on_the_tiny_model(tiny_model_dir, tmp_path):
    _skip_without_llama_cpp()
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.bench.workload import generate
    from mlxbatch.engine.planner import plan_batches
    from mlxbatch.engine.prompt import DEFAULT_LABELS

    clf = Classifier.load(tiny_model_dir, DEFAULT_LABELS)
    assert clf.labels.max_len == 1  # one token a label here: several are checked below
    prompts = [clf.engine.prompt(t["text"]) for t in generate(12, 0, "default")]
    gold_probs = score_all(
        clf.engine,
        prompts,
        plan_batches([len(p) for p in prompts], "sequential", 1 << 30, 1),
        "gold",
    )
    gold = gold_probs.argmax(1).tolist()
    top2 = np.sort(gold_probs, 1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-3  # not a near-tie: fp32 op orders cannot flip it
    o = LlamaCppOptions(threads=1, cache=tmp_path)
    labels = [list(t) for t in clf.labels.tokens]
    f32 = llamacpp_peer("llama.cpp-f32", tiny_model_dir, prompts, labels, gold, o, lambda m: None)
    assert "error" not in f32, f32
    assert f32["agreement"] >= 0.9 and f32["threads"] == 1
    picked = score_gguf(Path(f32["gguf"]), prompts, labels, 1)[0].argmax(1)
    assert clear.any() and all(p == g for p, g, c in zip(picked, gold, clear) if c)
    q8 = llamacpp_peer("llama.cpp-q8_0", tiny_model_dir, prompts, labels, gold, o, lambda m: None)
    assert "error" not in q8, q8
    assert q8["agreement"] >= 0.5  # 8-bit weights of a random model: near-ties may flip
    assert os.path.getsize(q8["gguf"]) < os.path.getsize(f32["gguf"]) / 2


def test_a_model_given_as_a_gguf_is_timed_on_that_very_file(tmp_path):
    """llama.cpp runs the GGUF a model directory was converted from (`--model FILE.gguf`), not a
    conversion of its own; a directory whose source is gone or is no GGUF converts as before."""
    import json

    from mlxbatch.bench.llamacpp import own_gguf

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    model = tmp_path / "model"
    model.mkdir()
    meta = {"source": str(gguf), "gguf": {"quantization": "Q4_1"}}
    (model / "mlxbatch.json").write_text(json.dumps(meta))
    assert own_gguf(model) == (gguf, "Q4_1")
    gguf.unlink()
    assert own_gguf(model) is None
    (model / "mlxbatch.json").write_text(json.dumps({"source": "x"}))
    assert own_gguf(model) is None


def test_llama_cpp_scores_labels_of_several_tokens_as_the_gold_loop(tmp_path, monkeypatch):
    """On a tiny GGUF whose tokenizer splits the labels, llama.cpp's summed label log-probs
    (the prompt's KV cache reused, each label's tokens fed behind it) give the gold loop's
    probabilities, and the peer runs the model's own file."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp not importable: pip install 'mlxbatch[llamacpp]'")
    pytest.importorskip("gguf")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # never the user's cache
    from gguf_files import tiny_checkpoint, write_gguf

    from mlxbatch.api.classifier import Classifier
    from mlxbatch.bench.workload import generate
    from mlxbatch.engine.planner import plan_batches

    gguf = write_gguf(tiny_checkpoint(tmp_path / "hf", "qwen2"), tmp_path / "tiny.gguf")
    clf = Classifier.load(str(gguf), ["billing", "technical", "account"])
    labels = [list(t) for t in clf.labels.tokens]
    assert clf.labels.max_len > 2 and min(map(len, labels)) == 1
    prompts = [clf.engine.prompt(t["text"]) for t in generate(8, 0, "default")]
    sequential = plan_batches([len(p) for p in prompts], "sequential", 1 << 30, 1)
    gold_probs = score_all(clf.engine, prompts, sequential, "gold")
    scores, _ = score_gguf(gguf, prompts, labels, 1)
    probs = np.exp(scores - scores.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    assert np.abs(probs - gold_probs).max() < 1e-5
    gold = gold_probs.argmax(1).tolist()
    o = LlamaCppOptions(threads=1)
    peer = llamacpp_peer("llama.cpp-f32", clf.lm.path, prompts, labels, gold, o, lambda m: None)
    assert "error" not in peer, peer
    assert peer["gguf"] == str(gguf) and "own F32 GGUF" in peer["name"]
    assert peer["agreement"] == 1.0
