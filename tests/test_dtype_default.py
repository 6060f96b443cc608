"""The dtype a model runs in when none is asked for: float32 on the CPU, the checkpoint's own
on a GPU (Gemma 3's bfloat16 overflows float16), and the summary and `doctor` lines saying
which and why."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import pytest
from click.testing import CliRunner

from mlxbatch.cli import cli
from mlxbatch.errors import ModelError
from mlxbatch.model.dtypes import resolve_dtype
from mlxbatch.model.load import load_model

GEMMA = {"model_type": "gemma3_text", "torch_dtype": "bfloat16"}  # as google/gemma-3-1b-it says


@pytest.mark.parametrize(
    ("config", "want", "source"),
    [
        (GEMMA, mx.bfloat16, "config.json's torch_dtype"),
        ({"dtype": "bfloat16", "torch_dtype": "float16"}, mx.bfloat16, "config.json's dtype"),
        (
            {"model_type": "gemma3", "text_config": {"dtype": "bfloat16"}},
            mx.bfloat16,
            "config.json's text_config.dtype",
        ),  # a vision-language checkpoint's language model
        ({"torch_dtype": "float16"}, mx.float16, "config.json's torch_dtype"),
        ({"torch_dtype": "float32"}, mx.float32, "config.json's torch_dtype"),  # as mlx-lm
        ({}, mx.float16, "config.json names no dtype"),
        ({"torch_dtype": "auto"}, mx.float16, "config.json names no dtype"),
    ],
)
def test_on_a_gpu_the_default_is_the_checkpoints_own_dtype(config, want, source):
    assert resolve_dtype(None, config, gpu=True) == (want, source)
    assert resolve_dtype("auto", config, gpu=True) == (want, source)


def test_on_the_cpu_the_default_is_float32_and_an_asked_dtype_wins_anywhere():
    assert resolve_dtype(None, GEMMA, gpu=False) == (mx.float32, "the CPU's default")
    for gpu in (False, True):
        assert resolve_dtype("float16", GEMMA, gpu) == (mx.float16, "asked for")
    with pytest.raises(ModelError, match="dtype 'half' is not one of float32, float16"):
        resolve_dtype("half", GEMMA, gpu=True)


@pytest.fixture
def bf16_checkpoint(tiny_model_dir, tmp_path):
    path = tmp_path / "bf16"
    shutil.copytree(tiny_model_dir, path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg | {"torch_dtype": "bfloat16"}))
    return path


def test_a_gpu_load_runs_a_bfloat16_checkpoint_in_bfloat16_and_says_why(
    bf16_checkpoint, monkeypatch
):
    assert load_model(bf16_checkpoint).describe().endswith("float32: the CPU's default)")
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))  # as on Metal / CUDA
    lm = load_model(bf16_checkpoint)
    assert lm.dtype == mx.bfloat16
    assert lm.describe().endswith("bfloat16: config.json's torch_dtype)")
    lm = load_model(bf16_checkpoint, dtype="float16")
    assert lm.dtype == mx.float16 and lm.describe().endswith(", float16: asked for)")


def test_doctor_says_which_dtype_runs_and_why(bf16_checkpoint, monkeypatch):
    r = CliRunner().invoke(cli, ["doctor", "--size", "16", "--json"])
    info = json.loads(r.stdout)
    assert info["dtype"] == "float32" and info["dtype_source"].startswith("the CPU's default")
    from mlxbatch.model import dtypes

    monkeypatch.setattr(dtypes, "on_gpu", lambda: True)  # the line a GPU machine prints
    r = CliRunner().invoke(cli, ["doctor", "--size", "16", "--model", str(bf16_checkpoint)])
    assert r.exit_code == 0, r.output
    assert "dtype: bfloat16" in r.stdout
    assert "dtype_source: config.json's torch_dtype" in r.stdout
    r = CliRunner().invoke(cli, ["doctor", "--size", "16", "--json"])
    assert "each checkpoint's config.json dtype" in json.loads(r.stdout)["dtype_source"]
