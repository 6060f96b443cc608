"""Safetensors checkpoints: find, check (headers, names, shapes, finiteness) and load them."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import mlx.core as mx

from ..errors import ModelError
from .config import ModelArgs
from .vision_language import text_tensor

_DTYPE_BYTES = {
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F64": 8,
    "I64": 8,
    "I32": 4,
    "U32": 4,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
# the float dtypes MLX reads from safetensors (not F64: "unsupported dtype F64")
FLOAT_DTYPES = ("F32", "F16", "BF16")
# Tensors a Hugging Face Qwen2 checkpoint may carry that the forward pass derives itself.
DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)


def weight_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files: the index's shards, or every *.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            if not all(
                isinstance(x, str) and "/" not in x and x not in ("", ".", "..") for x in shards
            ):
                raise ValueError("shard names must be plain file names")
        except (ValueError, KeyError, AttributeError, TypeError, OSError, RecursionError) as e:
            raise ModelError(f"{index}: not a valid safetensors index ({e})") from None
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise ModelError(f"{index}: shard file(s) missing: {', '.join(missing)}")
        return [model_dir / s for s in shards]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in model_dir.glob("*.bin")) + sorted(
            p.name for p in model_dir.glob("*.pt*")
        )
        hint = (
            f" (found {', '.join(pickled)}: pickled PyTorch weights are never loaded; "
            "re-save them with safe_serialization=True)"
            if pickled
            else ""
        )
        raise ModelError(f"{model_dir}: no *.safetensors weight files{hint}")
    return files


def read_header(path: Path) -> dict[str, dict]:
    """The tensor table of a safetensors file, checked against the file's real size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ModelError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8 or n > 100_000_000:
                raise ModelError(f"{path}: corrupt safetensors header (claims {n} bytes)")
            text = f.read(n)
    except OSError as e:
        raise ModelError(f"{path}: cannot be read ({e.strerror})") from None
    try:
        header = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ModelError(f"{path}: corrupt safetensors header ({str(e)[:100]})") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path}: corrupt safetensors header (a JSON {type(header).__name__})")
    header.pop("__metadata__", None)
    data_size = size - 8 - n
    spans = []
    for name, t in header.items():
        start, end = _check_entry(path, name, t)
        numel = 1
        for s in t["shape"]:
            numel *= s
        want = numel * _DTYPE_BYTES[t["dtype"]]
        if end - start != want:
            raise ModelError(f"{path}: tensor {name} has {end - start} bytes, shape needs {want}")
        if end > data_size:
            raise ModelError(
                f"{path}: truncated: tensor {name} ends at byte {end} of a {data_size}-byte "
                "data section (incomplete download or copy?)"
            )
        spans.append((start, end, name))
    spans.sort()
    for (_, a_end, a), (b_start, _, b) in zip(spans, spans[1:]):
        if b_start < a_end:
            raise ModelError(f"{path}: corrupt safetensors header (tensors {a} and {b} overlap)")
    return header


def _check_entry(path: Path, name: str, t) -> tuple[int, int]:
    """A header entry's dtype, shape and offsets, each of the right type."""
    if not isinstance(t, dict):
        raise ModelError(f"{path}: corrupt safetensors header (entry {name} is not an object)")
    if t.get("dtype") not in _DTYPE_BYTES:
        raise ModelError(f"{path}: tensor {name} has unknown dtype {t.get('dtype')!r}")
    shape, offsets = t.get("shape"), t.get("data_offsets")
    if not isinstance(shape, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape
    ):
        raise ModelError(f"{path}: tensor {name} has an invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise ModelError(f"{path}: tensor {name} has invalid data_offsets {offsets!r}")
    return offsets[0], offsets[1]


def check_checkpoint(model_dir: Path, args: ModelArgs) -> list[Path]:
    """Fail with one clear message unless the files hold exactly the tensors `args` needs."""
    files = weight_files(model_dir)
    found: dict[str, tuple[tuple[int, ...], Path]] = {}
    dtypes: dict[str, str] = {}
    for path in files:
        for stored, t in read_header(path).items():
            name = text_tensor(stored) if args.vision_language else stored
            if name is None:  # a vision tower's (vision_language.py)
                continue
            if name in found:  # the later file's values would win, whatever an index says
                raise ModelError(
                    f"{path}: tensor {name} is also in {found[name][1]}; a "
                    "checkpoint holds each tensor once"
                )
            if not name.endswith(DERIVED_SUFFIXES):
                found[name], dtypes[name] = (tuple(t["shape"]), path), t["dtype"]
    expected = args.expected_shapes()
    if args.tie_word_embeddings:
        found.pop("lm_head.weight", None)  # some tied checkpoints still carry the copy
    for name in [n for n in found if n.endswith(".scales")]:  # quantized layers: MLX's format
        _check_quantized(name[: -len(".scales")], expected, found, model_dir)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing:
        hint = ""
        if "lm_head.weight" in missing:
            hint = (
                f" (tie_word_embeddings is false: config.json's, or transformers' default "
                f"for {args.family.name} where it is absent)"
            )
        raise ModelError(
            f"{model_dir}: {len(missing)} tensor(s) missing from the checkpoint, e.g. "
            f"{', '.join(missing[:3])}{hint}"
        )
    if extra:
        raise ModelError(
            f"{model_dir}: {len(extra)} unexpected tensor(s) for this config, e.g. "
            f"{', '.join(extra[:3])}"
        )
    for name, shape in expected.items():
        got, path = found[name]
        if got != shape:
            raise ModelError(f"{path}: tensor {name} has shape {got}, config.json implies {shape}")
        quantized = name.removesuffix(".weight") + ".scales" in dtypes  # packed uint32
        if dtypes[name] not in FLOAT_DTYPES and not quantized:  # integers: not a dense weight
            raise ModelError(
                f"{path}: tensor {name} has dtype {dtypes[name]}; a dense weight "
                f"must be one of {', '.join(FLOAT_DTYPES)}"
            )
    return files


QUANT_BITS = (2, 3, 4, 5, 6, 8)


def _check_quantized(base: str, expected: dict, found: dict, model_dir: Path) -> None:
    """A quantized layer: packed weight, scales and biases agreeing with the dense shape;
    replaces the three entries by the dense one so the generic check passes."""
    dense = expected.get(base + ".weight")
    w, s, b = (found.get(f"{base}.{k}") for k in ("weight", "scales", "biases"))
    if dense is None or len(dense) != 2 or w is None or s is None or b is None:
        raise ModelError(
            f"{model_dir}: quantized tensor {base}.scales has no matching layer, "
            "packed weight or biases"
        )
    out_dim, in_dim = dense
    (wo, wi), (so, si) = w[0], s[0]
    bits = wi * 32 // in_dim if wi * 32 % in_dim == 0 else 0
    group = in_dim // si if si and in_dim % si == 0 else 0
    if (wo, so) != (out_dim, out_dim) or bits not in QUANT_BITS or group < 1 or b[0] != s[0]:
        raise ModelError(
            f"{w[1]}: quantized {base} has weight {w[0]}, scales {s[0]}, biases "
            f"{b[0]}: not a quantization of {dense}"
        )
    found[base + ".weight"] = (dense, w[1])
    del found[base + ".scales"], found[base + ".biases"]


def load_tensors(
    files: list[Path], check_finite: bool = False, vision_language: bool = False
) -> dict[str, mx.array]:
    """The checkpoint's tensors by the decoder's parameter names (`vision_language`: its LM's)."""
    tensors: dict[str, mx.array] = {}
    for path in files:
        try:
            tensors.update(mx.load(str(path)))
        except Exception as e:  # MLX raises RuntimeError/ValueError with terse texts
            raise ModelError(f"{path}: cannot be read as safetensors ({e})") from None
    if vision_language:
        named = ((text_tensor(k), v) for k, v in tensors.items())
        tensors = {k: v for k, v in named if k is not None}
    tensors = {k: v for k, v in tensors.items() if not k.endswith(DERIVED_SUFFIXES)}
    if check_finite:
        for name, t in tensors.items():
            if not mx.all(mx.isfinite(t)).item():
                raise ModelError(f"tensor {name} holds NaN or infinite values")
    return tensors


def resolve_head(args: ModelArgs, tensors: dict[str, mx.array], source: Path) -> ModelArgs:
    """The head as transformers loads it: tied unless the checkpoint holds an lm_head.weight
    with other values (then `args` untied); a tied head's lm_head.weight is dropped here."""
    head, embed = tensors.get("lm_head.weight"), tensors.get("model.embed_tokens.weight")
    if not args.tie_word_embeddings or head is None:
        return args
    if embed is not None and "model.embed_tokens.scales" not in tensors:
        if head.shape != embed.shape:
            raise ModelError(
                f"{source}: tensor lm_head.weight has shape {tuple(head.shape)}, "
                f"config.json implies {tuple(embed.shape)}"
            )
        if not mx.array_equal(head, embed).item():
            return dataclasses.replace(args, tie_word_embeddings=False)
    del tensors["lm_head.weight"]
    return args
