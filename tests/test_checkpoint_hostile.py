"""Hostile checkpoints and model choices: config values of the wrong type, attention or
quantization mlxbatch does not run, a cut weights file, an empty chat template or --model."""

from __future__ import annotations

import json
import shutil

import pytest
from cli_run import invoke, one_line_error

from mlxbatch.errors import ModelError

GOOD = '{"id": "a", "text": "I was charged twice"}\n{"id": "b", "text": "the app crashes"}\n'


def _with_config(tiny_model_dir, tmp_path, name: str, **changes):
    """A copy of the tiny model whose config.json has `changes`, marked a converted model (a
    synthetic one is passed over by the default-model search for that alone)."""
    d = shutil.copytree(tiny_model_dir, tmp_path / name)
    cfg = json.loads((d / "config.json").read_text()) | changes
    (d / "config.json").write_text(json.dumps(cfg))
    manifest = json.loads((d / "mlxbatch.json").read_text()) | {"synthetic": False}
    (d / "mlxbatch.json").write_text(json.dumps(manifest))
    return d


def test_the_default_model_is_the_first_runnable_one(tiny_model_dir, tmp_path, monkeypatch):
    import json
    import shutil

    from mlxbatch.model.defaults import default_model_dir, not_runnable

    weights = tmp_path / "w"
    (weights / "a-broken").mkdir(parents=True)
    shutil.copyfile(tiny_model_dir / "config.json", weights / "a-broken" / "config.json")
    good = shutil.copytree(tiny_model_dir, weights / "b-good")
    manifest = json.loads((good / "mlxbatch.json").read_text()) | {"synthetic": False}
    (good / "mlxbatch.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("MLXBATCH_WEIGHTS", str(weights))
    said = []
    assert default_model_dir(said.append) == good
    assert "passing over" in said[0] and "a-broken" in said[0] and "no *.safetensors" in said[0]
    assert said[1].startswith(f"default model (no --model given): {good}")  # not a 2nd "model:"
    assert not_runnable(weights / "a-broken") == "no *.safetensors weights"
    listed = invoke(["models", "--json"], tmp_path)  # the same check, in the listing
    broken = {m["name"]: m["broken"] for m in json.loads(listed.stdout)}
    assert broken.get("a-broken", "no *.safetensors weights") == "no *.safetensors weights"
    assert broken.get("b-good") is None
    r = invoke(["classify", "-", "--labels", "billing,technical"], tmp_path, input=GOOD)
    assert r.exit_code == 0 and "b-good" in r.stderr, r.output


def test_a_partial_rotary_factor_is_read_only_by_the_family_that_rotates_part_of_a_head(tmp_path):
    """transformers' Qwen2 (Llama, Qwen3, Gemma 3) rotates the whole head whatever
    `partial_rotary_factor` says; mlxbatch rotated half of it (max logit diff 7e-3)."""
    import mlx.core as mx
    import numpy as np
    import torch
    import transformers
    from conftest import save_randomised

    from mlxbatch.model.load import load_model

    cfg = transformers.Qwen2Config(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        partial_rotary_factor=0.5,
    )
    torch.manual_seed(0)
    path = save_randomised(
        transformers.AutoModelForCausalLM.from_config(cfg).float(), tmp_path / "qwen2"
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    lm = load_model(path)
    tokens = lm.tokenizer.prompt("Classify.", "the app crashes when I log in " * 4)
    ours = np.array(lm.model.head(lm.model(mx.array([tokens])))[0])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([tokens])).logits[0].numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4)


def test_gemma_configs_whose_attention_mlxbatch_does_not_run_are_refused():
    """EmbeddingGemma's `use_bidirectional_attention` (max logit diff 1.16 against
    transformers, and --verify at 100%: the gold loop shares the forward) and a rope scaling
    of the sliding layers (0.71) were read past in silence."""
    import pytest

    from mlxbatch.errors import ModelError
    from mlxbatch.model.config import ModelArgs

    base = dict(
        model_type="gemma3_text",
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        head_dim=16,
        vocab_size=300,
    )
    ModelArgs.from_dict(base)
    for extra, said in (
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        (
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
                }
            },
            "rope_parameters.sliding_attention: rope scaling 'linear'",
        ),
    ):
        with pytest.raises(ModelError, match=said):
            ModelArgs.from_dict(base | extra)
    vision = {"model_type": "gemma3", "text_config": base | {"use_bidirectional_attention": True}}
    with pytest.raises(ModelError, match="use_bidirectional_attention"):
        ModelArgs.from_dict(vision)


def test_a_checkpoint_whose_weights_file_is_cut_is_not_the_default_model(
    tiny_model_dir, tmp_path, monkeypatch
):
    """A model folder with a 2-byte model.safetensors was taken as runnable: `models` did not
    mark it BROKEN and classify with no --model chose it, then failed ("truncated safetensors
    file"). Its tensor table is read now (headers alone)."""
    import shutil

    from mlxbatch.model.defaults import default_model_dir, not_runnable

    weights = tmp_path / "w"
    cut = shutil.copytree(tiny_model_dir, weights / "a-cut")
    (cut / "model.safetensors").write_bytes(b"\x00\x01")
    good = shutil.copytree(tiny_model_dir, weights / "b-good")
    for d in (cut, good):  # converted checkpoints, not synthetic ones (passed over)
        manifest = json.loads((d / "mlxbatch.json").read_text()) | {"synthetic": False}
        (d / "mlxbatch.json").write_text(json.dumps(manifest))
    assert "truncated safetensors file" in not_runnable(cut)
    assert not_runnable(good) is None
    monkeypatch.setenv("MLXBATCH_WEIGHTS", str(weights))
    said = []
    assert default_model_dir(said.append) == good
    assert "passing over" in said[0] and "a-cut" in said[0] and "truncated" in said[0]
    listed = json.loads(invoke(["models", "--json"], tmp_path).stdout)
    assert "truncated" in {m["name"]: m["broken"] for m in listed}["a-cut"]


def test_per_layer_quantization_that_contradicts_the_weights_is_one_line(tmp_path):
    """A converted 2-bit model whose config.json gives one layer an entry of its own (false,
    8 bits in groups of 32, a string): a traceback, exit 1 ("Received 2 parameters not in
    model", "Expected shape", "class_predicate must return a bool")."""
    import shutil

    from conftest import make_hf_checkpoint

    from mlxbatch.model.convert import convert_hf

    q2 = tmp_path / "q2"
    convert_hf(make_hf_checkpoint(tmp_path / "hf", "tied_gqa"), q2, q_bits=2, q_group_size=32)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "charged twice"}) + "\n")
    layer = "model.layers.0.mlp.down_proj"
    for n, entry in enumerate((False, {"bits": 8, "group_size": 32}, "weird")):
        model = shutil.copytree(q2, tmp_path / f"m{n}")
        cfg = json.loads((model / "config.json").read_text())
        cfg["quantization"][layer] = entry
        (model / "config.json").write_text(json.dumps(cfg))
        r = invoke(["classify", src, "--model", model, "--labels", "spam,ham"], tmp_path)
        one_line_error(r, "quantization")


def test_an_empty_chat_template_is_refused_not_read_as_none(tiny_model_dir, tmp_path):
    """`"chat_template": ""` in tokenizer_config.json (or an empty chat_template.jinja) was read
    as no template, and ChatML ran in its place; an empty chat_template.json was refused."""
    import shutil

    import pytest

    from mlxbatch import Classifier
    from mlxbatch.errors import ModelError

    for n, where in enumerate(("tokenizer_config.json", "chat_template.jinja")):
        model = shutil.copytree(tiny_model_dir, tmp_path / f"m{n}")
        if where == "tokenizer_config.json":
            cfg = json.loads((model / where).read_text())
            (model / where).write_text(json.dumps(cfg | {"chat_template": "  \n"}))
        else:
            (model / where).write_text("")
        with pytest.raises(ModelError, match=f"{where}.*an empty template"):
            Classifier.load(model, labels=["spam", "ham"])


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
    ):
        with pytest.raises(ModelError, match=said):
            ModelArgs.from_dict(base | changes)
    bad = _with_config(tiny_model_dir, tmp_path / "w", "a-bad", model_type=["qwen2"])
    worse = _with_config(
        tiny_model_dir,
        tmp_path / "w",
        "b-worse",
        rope_scaling={"rope_type": ["linear"], "factor": 2.0},
    )
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


def test_an_empty_model_name_is_refused_not_taken_for_the_default(
    tiny_model_dir, tmp_path, monkeypatch
):
    """`--model ""` (a script's unset $MODEL) ran as if no --model was given: it wrote a
    958 MB synthetic model under ./weights and classified with it, exit 0; the Python API
    said "config.json: not found (is . a model directory?)". Both say it now, in one line."""
    from mlxbatch import Classifier

    monkeypatch.setenv("MLXBATCH_WEIGHTS", str(tmp_path / "none"))
    for empty in ("", " "):
        r = invoke(["classify", "-", "--model", empty, "--labels", "a,b"], tmp_path, input="hi\n")
        one_line_error(r, "empty string")
        with pytest.raises(ModelError, match="empty string"):
            Classifier.load(empty, ["a", "b"])
    assert not (tmp_path / "weights").exists() and not (tmp_path / "none").exists()
