"""Load a model directory (config.json + safetensors + tokenizer) into an MLX decoder (any supported family)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from ..errors import ModelError, one_line
from . import quantize
from .config import ModelArgs
from .decoder import Decoder
from .tokenizer import PromptTokenizer
from .weights import check_checkpoint, load_tensors, resolve_head

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
    try:
        m = json.loads((model_dir / "mlxbatch.json").read_text())
    except (OSError, ValueError):
        return {}
    return m if isinstance(m, dict) else {}


def read_config(model_dir: Path) -> dict:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


@dataclass
class LoadedModel:
    model: Decoder
    tokenizer: PromptTokenizer
    path: Path
    manifest: dict
    dtype: mx.Dtype
    quantization: dict | None = None  # the checkpoint's (MLX format), if quantized
    note: str = ""  # how the weights were transformed at load, for describe()

    @property
    def synthetic(self) -> bool:
        return bool(self.manifest.get("synthetic"))

    def describe(self) -> str:
        dtype = str(self.dtype).split(".")[-1]
        kind = "SYNTHETIC random weights, not a real model" if self.synthetic else "checkpoint"
        if gguf := self.manifest.get("gguf"):  # converted from a GGUF file (gguf_convert.py)
            kind = f"converted from a {gguf['quantization']} GGUF, weights {gguf['weights']}"
        parts = [kind]
        if self.quantization:
            q = self.quantization
            parts.append(f"{q['bits']}-bit, group {q['group_size']}")
        parts.append(self.note.format(dtype) if self.note else dtype)
        return f"{self.path} ({', '.join(parts)})"


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
            f"{model_dir}: the tokenizer has {tokenizer.vocab_size} tokens (control tokens "
            "included) but config.json's vocab_size is "
            f"{args.vocab_size}: tokenizer and checkpoint do not belong together"
        )
    q = quantize.quantization(read_config(model_dir))
    files = check_checkpoint(model_dir, args)
    dt = dtype if isinstance(dtype, mx.Dtype) else parse_dtype(dtype)
    tensors = load_tensors(files, check_finite, args.vision_language)
    args = resolve_head(args, tensors, model_dir)
    model = Decoder(args)
    if q:
        quantize.apply(model, q, tensors)
    # floating tensors take the run's dtype; packed quantized weights stay uint32
    try:
        model.load_weights([(k, v.astype(dt) if mx.issubdtype(v.dtype, mx.floating) else v)
                            for k, v in tensors.items()], strict=True)  # fmt: skip
    except ValueError as e:  # a quantized layer config.json describes otherwise than stored
        if not q:
            raise
        raise ModelError(f"{model_dir}: the weights do not fit the layers config.json's "
                         f"quantization makes ({one_line(e, 200)})") from None  # fmt: skip
    note = ""
    if q and mx.default_device() == mx.cpu:
        quantize.dequantize(model, dt)
        note = "dequantized to {} at load: MLX's CPU quantized matmul is slower than BLAS"
    mx.eval(model.parameters())
    manifest = read_manifest(model_dir)
    return LoadedModel(model, tokenizer, model_dir, manifest, dt, q, note)
