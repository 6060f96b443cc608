"""The models users already have: hub ids and the Hugging Face cache, Hugging Face and mlx-lm
directories, quantized checkpoints (ours and mlx-lm's), the Qwen2/2.5 presets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import make_hf_checkpoint

from mlxbatch.bench.workload import generate, write_jsonl
from mlxbatch.cli import cli
from mlxbatch.model.config import ModelArgs
from mlxbatch.model.presets import PRESETS

TEXTS = ["My invoice shows a double charge.", "The app crashes on start.", "Delete my account."]


def run(*args, env=None):
    return CliRunner(env=env).invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def tickets(tmp_path_factory):
    p = tmp_path_factory.mktemp("tk") / "t.jsonl"
    write_jsonl(generate(24, seed=3), p)
    return p


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfdirs")
    return {name: make_hf_checkpoint(root / name, name) for name in ("tied_gqa", "untied_mha")}


def verify_all_modes(model, tickets, tmp_path, env=None):
    for mode in ("sorted", "naive", "sequential"):
        out = tmp_path / f"{mode}.jsonl"
        r = run(
            "classify",
            tickets,
            "--model",
            model,
            "-o",
            out,
            "--mode",
            mode,
            "--verify",
            "--labels",
            "billing,account access,technical",
            env=env,
        )
        assert r.exit_code == 0, r.output
        assert "100.00% label agreement" in r.stderr


def test_a_hugging_face_directory_is_used_directly(hf_dirs, tickets, tmp_path):
    verify_all_modes(hf_dirs["untied_mha"], tickets, tmp_path)


def fake_cache(root, repo, source):
    """A Hugging Face cache laid out as huggingface_hub writes it."""
    base = root / "hub" / f"models--{repo.replace('/', '--')}"
    snap = base / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(source, snap)
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(snap.name)
    return snap


def test_hub_id_resolves_from_the_cache_offline(hf_dirs, tickets, tmp_path, monkeypatch):
    fake_cache(tmp_path / "hf", "Qwen/Tiny", hf_dirs["tied_gqa"])
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    verify_all_modes("Qwen/Tiny", tickets, tmp_path, env=env)
    r = run("classify", tickets, "--model", "Qwen/Absent", env=env)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "Qwen/Absent" in r.stderr and "HF_HUB_OFFLINE" in r.stderr
    from mlxbatch.api.classifier import Classifier

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    pred = Classifier.load("Qwen/Tiny").classify(["hello"])[0]  # the Python API resolves ids too
    assert pred.label in ("billing", "technical", "account")
    r = CliRunner(env=env).invoke(cli, ["models", "--json"])
    assert r.exit_code == 0 and any(m["name"] == "Qwen/Tiny" for m in json.loads(r.stdout))


@pytest.mark.parametrize("ref", ["", "\n", "no-such-snapshot", None])
def test_a_cache_whose_refs_name_no_snapshot_is_one_line_and_marked(
    hf_dirs, tickets, tmp_path, ref
):
    """A refs/main that names no snapshot (empty, unknown or absent) is one line naming the
    model, and `models` never lists such a snapshot as `--model`'s."""
    snap = fake_cache(tmp_path / "hf", "Org/Odd", hf_dirs["tied_gqa"])
    main = snap.parent.parent / "refs" / "main"
    if ref is None:
        main.unlink()
    else:
        main.write_text(ref)
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    r = run("classify", tickets, "--model", "Org/Odd", env=env)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "Org/Odd" in r.stderr, r.stderr
    assert "Traceback" not in r.output
    r = CliRunner(env=env).invoke(cli, ["models", "--json"])
    assert r.exit_code == 0, r.output
    listed = [m for m in json.loads(r.stdout) if m["name"] == "Org/Odd"]
    assert all(m["broken"] or m["main"] is False for m in listed), listed  # never as `--model`'s
    r = CliRunner(env=env).invoke(cli, ["models"])
    assert r.exit_code == 0 and all(
        "not refs/main" in line or "BROKEN" in line
        for line in r.stdout.splitlines()
        if line.startswith("Org/Odd")
    ), r.stdout


def mlx_lm_logits(path, texts):
    from mlx_lm.utils import load_model

    model, _ = load_model(path)
    model.set_dtype(mx.float32) if mx.default_device() == mx.cpu else None
    return model


def our_logits(path, tokens):
    from mlxbatch.model.load import load_model

    lm = load_model(path, "float32")
    return np.array(lm.model.head(lm.model(mx.array([tokens]))).astype(mx.float32))


def tokens_of(path):
    from mlxbatch.model.tokenizer import PromptTokenizer

    return PromptTokenizer(path).prompt("You classify tickets.", TEXTS[0])


def their_logits(path, tokens):
    from mlx_lm.utils import load_model

    model, _ = load_model(path)
    return np.array(model(mx.array([tokens])).astype(mx.float32))


@pytest.mark.parametrize("name", ["tied_gqa", "untied_mha"])
def test_mlx_lm_quantized_checkpoints_load_and_match_mlx_lm(hf_dirs, tmp_path, name):
    out = tmp_path / "q4"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_lm.convert",
            "--hf-path",
            str(hf_dirs[name]),
            "--mlx-path",
            str(out),
            "-q",
            "--q-bits",
            "4",
            "--q-group-size",
            "32",
        ],
        check=True,
        capture_output=True,
    )
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 4
    toks = tokens_of(out)
    ours, theirs = our_logits(out, toks), their_logits(out, toks)
    assert np.abs(ours - theirs).max() < 1e-3 * max(1.0, np.abs(theirs).max())
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() > 0.95


@pytest.mark.parametrize("bits", [4, 8])
def test_our_quantized_output_loads_in_mlx_lm_and_verifies_in_every_mode(
    hf_dirs, tickets, tmp_path, bits
):
    out = tmp_path / f"q{bits}"
    r = run("convert", hf_dirs["tied_gqa"], out, "-q", "--q-bits", bits, "--q-group-size", 32)
    assert r.exit_code == 0, r.output
    # one line of ours (a newcomer saw mlx-lm's "[INFO] Quantized ...", packed uint32 counted
    # as parameters, and a Python list of dtypes)
    (line,) = r.stdout.splitlines()
    assert f"stored values ({bits}-bit weights packed into uint32)" in line and "[" not in line
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"] == {"group_size": 32, "bits": bits, "mode": "affine"}
    toks = tokens_of(out)
    ours, theirs = our_logits(out, toks), their_logits(out, toks)
    assert np.abs(ours - theirs).max() < 1e-3 * max(1.0, np.abs(theirs).max())
    # quantized vs full precision: close, not equal
    dense = our_logits(hf_dirs["tied_gqa"], toks)
    assert 0 < np.abs(ours - dense).max() < (0.5 if bits == 4 else 0.1) * np.abs(dense).max()
    verify_all_modes(out, tickets, tmp_path)
    from mlxbatch.model.load import load_model

    assert f"{bits}-bit, group 32" in load_model(out).describe()


def test_a_broken_quantized_checkpoint_is_named(hf_dirs, tmp_path):
    out = tmp_path / "q4"
    assert run("convert", hf_dirs["tied_gqa"], out, "-q", "--q-group-size", 32).exit_code == 0
    t = mx.load(str(out / "model.safetensors"))
    t["model.layers.0.mlp.up_proj.scales"] = t["model.layers.0.mlp.up_proj.scales"][:, :1]
    mx.save_safetensors(str(out / "model.safetensors"), t)
    r = CliRunner().invoke(cli, ["classify", "-", "--model", str(out)], input="hello\n")
    assert r.exit_code == 2 and "model.layers.0.mlp.up_proj" in r.stderr


def test_fp16_overflow_is_refused_on_conversion(hf_dirs, tmp_path):
    src = tmp_path / "big"
    shutil.copytree(hf_dirs["tied_gqa"], src)
    t = mx.load(str(src / "model.safetensors"))
    t["model.norm.weight"] = t["model.norm.weight"] * 0 + 1e6
    mx.save_safetensors(str(src / "model.safetensors"), t, metadata={"format": "pt"})
    r = run("convert", src, tmp_path / "f16", "--dtype", "float16")
    assert r.exit_code == 2 and "model.norm.weight" in r.stderr and "float16" in r.stderr
    assert run("convert", src, tmp_path / "bf16", "--dtype", "bfloat16").exit_code == 0


PUBLISHED = {  # parameter counts of the published checkpoints (embeddings counted once if tied)
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-7b": 7_615_616_512,
}


@pytest.mark.parametrize("preset", list(PUBLISHED))
def test_presets_have_the_published_parameter_counts(preset):
    args = ModelArgs.from_dict(PRESETS[preset])
    n = sum(int(np.prod(s)) for s in args.expected_shapes().values())
    assert n == PUBLISHED[preset]
    assert args.tie_word_embeddings == (preset != "qwen2.5-7b")


@pytest.mark.skipif(
    not os.environ.get("MLXBATCH_BIG_TESTS"),
    reason="a 3 GB model: MLXBATCH_BIG_TESTS=1 runs it (the 0.5B shapes run always)",
)
def test_a_synthetic_1_5b_model_verifies(tmp_path):
    model = tmp_path / "q15"
    r = run("init-random", model, "--preset", "qwen2.5-1.5b", "--dtype", "bfloat16")
    assert r.exit_code == 0, r.output
    src = tmp_path / "t.jsonl"
    write_jsonl(generate(4, seed=1), src)
    r = run("classify", src, "--model", model, "--verify", "-o", tmp_path / "o.jsonl")
    assert r.exit_code == 0, r.output
    assert "100.00% label agreement" in r.stderr
