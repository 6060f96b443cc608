"""Shared fixtures: tiny random Qwen2 checkpoints saved by `transformers`, converted by us."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import signal
import sys
from pathlib import Path

import pytest

from mlxbatch.runtime import blas

blas.activate_in_process()  # before mlx is imported: in-process tests use the fast BLAS too

from mlxbatch.model.convert import convert_hf, init_random, qwen_tokenizer_dir  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36


def pytest_sessionstart(session):
    """Orphans of the tests' processes (a killed launcher's ranks, a forked child) become this
    process's children, so `pytest_sessionfinish` can end them: one left running with an
    inherited standard output keeps a CI runner waiting after the last test."""
    if platform.system() == "Linux":
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[1]) == pid:
            kids.append(int(entry.name))
    return kids


def pytest_sessionfinish(session, exitstatus):
    """Every process the tests left behind, named and ended."""
    if platform.system() != "Linux":
        return
    for pid in _children(os.getpid()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":  # a zombie has already ended: only reaped below
                sys.stderr.write(
                    f"\nconftest: ending a process the tests left running: {pid} {cmd}\n"
                )
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (OSError, ChildProcessError):
            pass


def pytest_unconfigure(config):
    """A process that has not exited 10 minutes after its last test (a thread that never
    ends: the interpreter joins it at exit) prints every thread's stack and exits 1, so CI
    shows where instead of waiting out its limit."""
    import faulthandler

    faulthandler.dump_traceback_later(600, exit=True)


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
        vocab_size=151936,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        tie_word_embeddings=tied,
        rope_theta=1_000_000.0,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
    )
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
    from mlxbatch.api.classifier import Classifier

    # the planner's first-job check, done here once: on a machine with nothing cached its
    # notice came before the one-line error of whichever test first reached a job's settings
    Classifier.load(out).cost_model()
    return out
