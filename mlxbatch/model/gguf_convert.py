"""A GGUF file as an mlxbatch model directory: written once into a cache, then loaded as any.

`--model FILE.gguf` converts the file into `~/.cache/mlxbatch/gguf-models/<digest>/`
(safetensors + config.json + tokenizer files + mlxbatch.json), keyed by a digest of the file's
content, and runs that directory; `mlxbatch convert FILE.gguf OUT` writes the same directory
where asked. The weights:

- A file whose every tensor MLX reads itself (F32, F16, BF16, Q4_0, Q4_1, Q8_0) is read by
  `mx.load`; its Q4_0/Q4_1/Q8_0 matrices stay quantized in MLX's affine format (groups of 32,
  scales and biases kept in float32 so the CPU's dequantization at load is exact), which the
  quantized-checkpoint path runs as it is on a GPU and dequantizes once on the CPU.
- Any other file (K-quants: Q4_K_M, Q5_K, Q6_K, ...; Q5_0/Q5_1) is dequantized to float32 by
  the `gguf` package (llama.cpp's own reader: pip install 'mlxbatch[gguf]').

What llama.cpp's converter changed in the values is undone: Llama's Q/K rows permuted for its
rotary layout (Qwen2, Qwen3, Gemma 3 and Phi-3 are written as they are), Gemma's norms stored
as 1 + w.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import ModelError
from ..runtime.files import cache_dir
from . import gguf_config
from .convert import _write as write_model_dir
from .convert import check_destination
from .gguf_file import GGUFFile, TensorInfo, read_gguf
from .gguf_tokenizer import write_tokenizer

MLX_TYPES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"}
QUANTIZED = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
INSTALL = "pip install 'mlxbatch[gguf]'"
DIGEST_VERSION = 1  # bump when the directory written for the same file changes


def digest(path: Path) -> str:
    """The file's cache key: sha256 of its size, its first and last 4 MiB and 64 samples of
    64 KiB spread between (the whole file below 12 MiB). The same bytes get the same key
    under any name (a path, Ollama's blob); reading ~12 MiB keeps a 5 GB file's lookup fast."""
    size = path.stat().st_size
    h = hashlib.sha256(f"{DIGEST_VERSION}:{size}:".encode())
    with open(path, "rb") as f:
        if size <= 12 << 20:
            h.update(f.read())
        else:
            spots = [0, size - (4 << 20)] + [int(size * k / 65) for k in range(1, 65)]
            for at in spots:
                f.seek(at)
                h.update(f.read(4 << 20 if at in spots[:2] else 64 << 10))
    return h.hexdigest()[:32]


def cached_model_dir(path: str | Path) -> Path:
    """The converted directory of the GGUF at `path`, converted now if the cache has none."""
    path = Path(path)
    out = cache_dir() / "gguf-models" / digest(path)
    if (out / "mlxbatch.json").is_file():
        return out
    gguf = read_gguf(path)
    try:
        write_directory(gguf, out)
    except ModelError:
        if (out / "mlxbatch.json").is_file():  # another process converted it first
            return out
        raise
    return out


def convert_gguf(path: str | Path, out: str | Path, force: bool = False) -> dict:
    """`mlxbatch convert FILE.gguf OUT`: the directory `--model FILE.gguf` runs, at `out`."""
    check_destination(Path(out), force, Path(path))
    return write_directory(read_gguf(path), Path(out), force)


def write_directory(gguf: GGUFFile, out: Path, force: bool = False) -> dict:
    source = str(gguf.path)
    arch = gguf_config.architecture(gguf.metadata, source)
    weights = {n: t for n, t in gguf.tensors.items() if n not in gguf_config.CONFIG_TENSORS}
    unknown = [n for n in weights if gguf_config.hf_name(arch, n) is None]
    if unknown:
        raise ModelError(f"{source}: tensor {unknown[0]} is not one mlxbatch knows for {arch}")
    native = all(t.type_name in MLX_TYPES for t in gguf.tensors.values())
    factors = {
        n: _dense(gguf, t) for n, t in gguf.tensors.items() if n in gguf_config.CONFIG_TENSORS
    }
    config = gguf_config.config(
        gguf.metadata, {n: t.shape for n, t in weights.items()}, factors, source
    )
    tensors = _mlx_tensors(gguf) if native else _dequantized(gguf, weights)
    tensors = {k: v for k, v in tensors.items() if _base(k) not in gguf_config.CONFIG_TENSORS}
    hf = {}
    for name, t in tensors.items():
        base = _base(name)
        target = gguf_config.hf_name(arch, base)
        if name != base:  # the scales or biases of a quantized weight
            target = target.removesuffix(".weight") + name[len(base) - len(".weight") :]
        hf[target] = _undo(arch, base, t, config)
    bits = (
        sorted(
            {
                QUANTIZED[t.type_name]
                for t in weights.values()
                if t.type_name in QUANTIZED and len(t.shape) == 2
            }
        )
        if native
        else []
    )
    if bits:  # per-layer bits are read off the shapes at load (mlx-lm's infer_quant_config)
        config["quantization"] = {"group_size": 32, "bits": bits[0], "mode": "affine"}
    meta = {
        "source": str(gguf.path.resolve()),
        "synthetic": False,
        "gguf": {
            "architecture": arch,
            "quantization": gguf.quantization(),
            "types": gguf.types(),
            "weights": "kept quantized (MLX affine, groups of 32)"
            if bits
            else "dequantized to float32 by the gguf package"
            if not native
            else "dense",
        },
    }
    with tempfile.TemporaryDirectory() as tok_dir:
        write_tokenizer(gguf.metadata, Path(tok_dir), source)
        return write_model_dir(out, hf, config, Path(tok_dir), meta, force)


def _base(name: str) -> str:
    """`blk.0.attn_q.scales` -> `blk.0.attn_q.weight` (mx.load's names for a quantized one)."""
    for suffix in (".scales", ".biases"):
        if name.endswith(suffix):
            return name[: -len(suffix)] + ".weight"
    return name


def _undo(arch: str, name: str, t: mx.array, config: dict) -> mx.array:
    """Undo what llama.cpp's converter did to this tensor's values (see the module docstring)."""
    family = gguf_config.family(arch)
    if family.gguf_permuted_qk and (".attn_q." in name or ".attn_k." in name):
        heads = config["num_attention_heads" if ".attn_q." in name else "num_key_value_heads"]
        rows = t.shape[0]  # its rows are (head, pair, 2) where Hugging Face has (head, 2, pair)
        t = t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).swapaxes(1, 2)
        return t.reshape(rows, *t.shape[3:])
    if family.norm_offset and name.endswith("norm.weight"):  # stored as 1 + w
        return t - 1
    return t


def _mlx_tensors(gguf: GGUFFile) -> dict[str, mx.array]:
    try:
        tensors = mx.load(str(gguf.path), format="gguf")  # an Ollama blob has no suffix
    except (ValueError, RuntimeError) as e:
        raise ModelError(f"{gguf.path}: MLX cannot read the GGUF ({e})") from None
    # float32 scales and biases: the CPU's dequantization then computes in float32, as
    # llama.cpp's and the gguf package's do
    return {
        k: v.astype(mx.float32) if k.endswith((".scales", ".biases")) else v
        for k, v in tensors.items()
    }


def _raw(gguf: GGUFFile, t: TensorInfo) -> np.ndarray:
    rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
    data = np.memmap(gguf.path, np.uint8, "r", t.offset, (t.nbytes,))
    return data.reshape(rows, t.nbytes // rows)


def _dense(gguf: GGUFFile, t: TensorInfo) -> np.ndarray:
    """A tensor's values as float32, dequantized by the gguf package where they are packed."""
    raw = _raw(gguf, t)
    if t.type_name == "F32":
        out = raw.view(np.float32)
    elif t.type_name == "F16":
        out = raw.view(np.float16).astype(np.float32)
    elif t.type_name == "BF16":
        out = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        try:
            from gguf import GGMLQuantizationType, dequantize
        except ImportError:
            raise ModelError(
                f"{gguf.path}: its {t.type_name} tensors are dequantized by the gguf "
                f"package: {INSTALL}"
            ) from None
        out = dequantize(raw, GGMLQuantizationType[t.type_name])
    return np.asarray(out, np.float32).reshape(t.shape)


def _dequantized(gguf: GGUFFile, weights: dict[str, TensorInfo]) -> dict[str, mx.array]:
    return {n: mx.array(_dense(gguf, t)) for n, t in weights.items()}


def gguf_path(spec: str | Path) -> Path | None:
    """`spec` as a GGUF file, if it names one (by suffix or by its magic)."""
    path = Path(spec).expanduser()
    if path.is_file() and (path.suffix.lower() == ".gguf" or _magic(path)):
        return path
    return None


def _magic(path: Path) -> bool:
    from .gguf_file import is_gguf

    return is_gguf(path)


def describe_gguf(path: Path) -> dict | None:
    """What `mlxbatch models` shows of a GGUF file, or None if it is not one mlxbatch runs."""
    try:
        g = read_gguf(path)
        gguf_config.architecture(g.metadata, str(path))
    except ModelError:
        return None
    meta = g.metadata
    arch = g.architecture
    return {
        "path": str(path),
        "kind": "gguf",
        "gguf": True,
        "synthetic": False,
        "quantization": g.quantization(),
        "family": gguf_config.MODEL_TYPES[arch],
        "size": f"{meta.get(f'{arch}.embedding_length')} x "
        f"{meta.get(f'{arch}.block_count')} layers, "
        f"{os.path.getsize(path) / 1e6:,.0f} MB",
    }
