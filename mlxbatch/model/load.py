"""Load a model directory (config.json + safetensors + tokenizer) into an MLX Qwen2."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from ..errors import ModelError
from .config import ModelArgs
from .qwen2 import Qwen2
from .tokenizer import PromptTokenizer
from .weights import check_checkpoint, load_tensors

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def default_dtype() -> mx.Dtype:
    """fp16 on a GPU; fp32 on the CPU, where MLX's fp16/bf16 matmuls are far slower."""
    return mx.float16 if mx.default_device() == mx.gpu else mx.float32


def parse_dtype(name: str | None) -> mx.Dtype:
    if name in (None, "auto"):
        return default_dtype()
    if name not in DTYPES:
        raise ModelError(f"dtype {name!r} is not one of {', '.join(DTYPES)} or auto")
    return DTYPES[name]


def read_manifest(model_dir: Path) -> dict:
    path = model_dir / "mlxbatch.json"
    return json.loads(path.read_text()) if path.is_file() else {}


@dataclass
class LoadedModel:
    model: Qwen2
    tokenizer: PromptTokenizer
    path: Path
    manifest: dict
    dtype: mx.Dtype

    @property
    def synthetic(self) -> bool:
        return bool(self.manifest.get("synthetic"))

    def describe(self) -> str:
        kind = "SYNTHETIC random weights, not a real model" if self.synthetic else "converted"
        return f"{self.path} ({kind}, {str(self.dtype).split('.')[-1]})"


def load_model(
    model_dir: str | Path, dtype: str | mx.Dtype | None = None, check_finite: bool = False
) -> LoadedModel:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"{model_dir}: model directory not found")
    args = ModelArgs.load(model_dir)
    tokenizer = PromptTokenizer(model_dir)
    if tokenizer.vocab_size > args.vocab_size:
        raise ModelError(
            f"{model_dir}: the tokenizer has {tokenizer.vocab_size} tokens (control tokens up to "
            f"id {max(tokenizer.im_start, tokenizer.im_end)}) but config.json's vocab_size is "
            f"{args.vocab_size}: tokenizer and checkpoint do not belong together"
        )
    files = check_checkpoint(model_dir, args)
    dt = dtype if isinstance(dtype, mx.Dtype) else parse_dtype(dtype)
    tensors = load_tensors(files, check_finite=check_finite)
    if args.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    model = Qwen2(args)
    model.load_weights([(k, v.astype(dt)) for k, v in tensors.items()], strict=True)
    mx.eval(model.parameters())
    return LoadedModel(model, tokenizer, model_dir, read_manifest(model_dir), dt)
