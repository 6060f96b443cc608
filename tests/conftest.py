"""Shared fixtures: tiny random Qwen2 checkpoints saved by `transformers`, converted by us."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mlxbatch.runtime import blas

blas.activate_in_process()  # before mlx is imported: in-process tests use the fast BLAS too

from mlxbatch.model.convert import convert_hf, init_random, qwen_tokenizer_dir  # noqa: E402

TINY_CONFIGS = {
    # name: (hidden, layers, heads, kv_heads, intermediate, tied)
    "tied_gqa": (64, 2, 4, 2, 160, True),
    "untied_mha": (48, 2, 3, 3, 96, False),  # GQA ratio 1, odd head count
    "tied_odd_gqa": (72, 3, 6, 2, 128, True),  # 6 heads over 2 kv heads
}


def make_hf_checkpoint(path: Path, name: str = "tied_gqa", seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, heads, kv, inter, tied = TINY_CONFIGS[name]
    cfg = Qwen2Config(
        vocab_size=151936, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
        tie_word_embeddings=tied, rope_theta=1_000_000.0, max_position_embeddings=4096,
        rms_norm_eps=1e-6,
    )  # fmt: skip
    torch.manual_seed(seed)
    return save_randomised(Qwen2ForCausalLM(cfg).float(), path)


def save_randomised(model, path: Path) -> Path:
    """A transformers model saved with the Qwen tokenizer beside it, its biases and norms moved
    off their initial values first (HF zero-inits biases and ones the norms: every path is
    then exercised)."""
    import torch

    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    for f in qwen_tokenizer_dir().iterdir():
        shutil.copyfile(f, path / f.name)
    return path


@pytest.fixture(scope="session", params=list(TINY_CONFIGS))
def hf_and_mlx(request, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp(request.param)
    hf = make_hf_checkpoint(root / "hf", request.param)
    convert_hf(hf, root / "mlx")
    return hf, root / "mlx"


@pytest.fixture(scope="session")
def tied_pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tied_pair")
    hf = make_hf_checkpoint(root / "hf", "tied_gqa", seed=1)
    convert_hf(hf, root / "mlx")
    return hf, root / "mlx"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_random") / "model"
    init_random(out, preset="tiny", seed=0, dtype="float32")
    return out
