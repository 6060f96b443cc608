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
