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
from .dtypes import on_gpu, resolve_dtype
from .files import check_regular_files, read_regular
from .tokenizer import PromptTokenizer
from .weights import check_checkpoint, load_tensors, resolve_head


def read_manifest(model_dir: Path) -> dict:
    try:
        m = json.loads(read_regular(model_dir / "mlxbatch.json") or b"null")
    except (OSError, ValueError, ModelError):  # a FIFO there is refused by the load
        return {}
    return m if isinstance(m, dict) else {}


def read_config(model_dir: Path) -> dict:
    try:
        cfg = json.loads(read_regular(model_dir / "config.json") or b"null")
    except (OSError, ValueError, ModelError):
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
    dtype_source: str = ""  # why this dtype, in words (dtypes.resolve_dtype)

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
        shown = f"{dtype}: {self.dtype_source}" if self.dtype_source else dtype
        parts.append(self.note.format(dtype) if self.note else shown)
        return f"{self.path} ({', '.join(parts)})"


def load_model(
    model_dir: str | Path, dtype: str | mx.Dtype | None = None, check_finite: bool = False
) -> LoadedModel:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"{model_dir}: model directory not found")
    check_regular_files(model_dir)  # before any is opened: a FIFO would block the first read
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
    dt, why = (
        (dtype, "asked for")
        if isinstance(dtype, mx.Dtype)
        else resolve_dtype(dtype, read_config(model_dir), on_gpu())
    )
    tensors = load_tensors(files, check_finite, args.vision_language)
    args = resolve_head(args, tensors, model_dir)
    model = Decoder(args)
    if q:
        quantize.apply(model, q, tensors)
    # floating tensors take the run's dtype; packed quantized weights stay uint32
    try:
        model.load_weights(
            [
                (k, v.astype(dt) if mx.issubdtype(v.dtype, mx.floating) else v)
                for k, v in tensors.items()
            ],
            strict=True,
        )
    except ValueError as e:  # a quantized layer config.json describes otherwise than stored
        if not q:
            raise
        raise ModelError(
            f"{model_dir}: the weights do not fit the layers config.json's "
            f"quantization makes ({one_line(e, 200)})"
        ) from None
    note = ""
    if q and mx.default_device() == mx.cpu:
        quantize.dequantize(model, dt)
        note = "dequantized to {} at load: MLX's CPU quantized matmul is slower than BLAS"
    mx.eval(model.parameters())
    manifest = read_manifest(model_dir)
    return LoadedModel(model, tokenizer, model_dir, manifest, dt, q, note, why)
