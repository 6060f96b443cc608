"""The built-in default model: a converted checkpoint under weights/, else a synthetic one."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

SYNTHETIC_NAME = "qwen2.5-0.5b-synthetic"


def weights_dir() -> Path:
    return Path(os.environ.get("MLXBATCH_WEIGHTS", "weights"))


def not_runnable(model_dir: Path) -> str | None:
    """Why a model directory cannot run, from cheap checks (config, tensor tables, tokenizer)."""
    from ..errors import ModelError
    from .config import ModelArgs
    from .files import check_regular_files
    from .quantize import quantization
    from .weights import check_checkpoint

    if not list(model_dir.glob("*.safetensors")):
        return "no *.safetensors weights"
    try:
        check_regular_files(model_dir)
        args = ModelArgs.load(model_dir)
        quantization(json.loads((model_dir / "config.json").read_text()))
        check_checkpoint(model_dir, args)  # the headers alone: milliseconds
    except ModelError as e:
        return str(e).removeprefix(f"{model_dir / 'config.json'}: ")
    if not (model_dir / "tokenizer.json").is_file():
        return "no tokenizer.json"
    return template_problem(model_dir)


def template_problem(model_dir: Path) -> str | None:
    """Why the checkpoint's chat template cannot run, or None (its tokenizer is not loaded)."""
    from ..errors import ModelError
    from .chat import ChatTemplate, read_template

    try:
        source, variables, where = read_template(model_dir)
        if source is not None:
            ChatTemplate(source, variables, where).split(0)
    except ModelError as e:
        return str(e)
    return None


def default_model_dir(announce: Callable[[str], None] = print) -> Path:
    """The first runnable converted model under weights/ (others named and passed over); else
    the synthetic model at Qwen2.5-0.5B's shapes, created on first use."""
    from .convert import init_random
    from .load import read_manifest

    root = weights_dir()
    found = sorted(d for d in root.glob("*") if (d / "config.json").is_file())
    for d in (d for d in found if not read_manifest(d).get("synthetic")):
        if why := not_runnable(d):
            announce(f"passing over {d}: not runnable ({why}; see `mlxbatch models`)")
            continue
        announce(f"default model (no --model given): {d}, a converted checkpoint")
        return d
    synthetic = root / SYNTHETIC_NAME
    if not (synthetic / "mlxbatch.json").is_file():
        announce(
            f"no converted model under {root}/: writing a SYNTHETIC random model at the "
            f"Qwen2.5-0.5B shapes to {synthetic} (once, ~1 GB)"
        )
        tmp = root / f".{SYNTHETIC_NAME}.{os.getpid()}"
        init_random(tmp, preset="qwen2.5-0.5b", seed=0)
        try:
            tmp.rename(synthetic)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    announce(
        f"default model (no --model given): {synthetic}, SYNTHETIC random weights at the "
        "Qwen2.5-0.5B shapes, not a real model: its labels carry no meaning"
    )
    return synthetic


def model_dir(model: str | Path | None, announce: Callable[[str], None] = print) -> Path:
    """What `--model` names (hub.resolve), else the built-in default; every command calls it."""
    from .hub import resolve

    # (an empty one is refused, not taken for no --model)
    return default_model_dir(announce=announce) if model is None else resolve(model)
