"""Read a GGUF file's header: its metadata and its tensor table, checked against the file's size.

GGUF (llama.cpp's format; what Ollama and LM Studio store): the magic `GGUF`, a version (2 or
3), then key/value metadata (the architecture's hyperparameters, the tokenizer's tokens and
merges, the chat template) and one entry per tensor (name, dims innermost first, type, offset
into the data, which starts at the next multiple of `general.alignment`). Values are read with
`struct` over a memory map, so this needs no optional package; the tensors' bytes are read by
gguf_convert.py.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelError

MAGIC = b"GGUF"
# ggml type id: (name, values a block, bytes a block) for the types mlxbatch reads
TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    30: ("BF16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
}
# named in the refusal only
OTHER_TYPES = {
    9: "Q8_1",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    34: "TQ1_0",
    35: "TQ2_0",
    39: "MXFP4",
}
# metadata value types: struct format of the scalars (8 STRING and 9 ARRAY apart)
SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: rows first (the file lists dims innermost first)
    type_id: int
    offset: int  # from the file's start

    @property
    def type_name(self) -> str:
        return TYPES[self.type_id][0]

    @property
    def nbytes(self) -> int:
        _, block, size = TYPES[self.type_id]
        return int(np.prod(self.shape)) // block * size


class CutShort(Exception):
    """The header runs past the end of the file."""


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        try:
            (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise CutShort from None
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise CutShort
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind == 8:
            return self.string()
        if kind == 9:
            inner, n = self.take("<I"), self.take("<Q")
            if inner == 8:
                return [self.string() for _ in range(n)]
            if inner not in SCALARS:
                raise ValueError(f"array of metadata type {inner}")
            fmt = SCALARS[inner]
            size = struct.calcsize(fmt)
            if self.pos + n * size > len(self.buf):
                raise CutShort
            out = np.frombuffer(self.buf, np.dtype(fmt), n, self.pos).tolist()
            self.pos += n * size
            return out
        if kind not in SCALARS:
            raise ValueError(f"metadata type {kind}")
        return self.take(SCALARS[kind])


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict
    tensors: dict[str, TensorInfo]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def types(self) -> dict[str, int]:
        """How many tensors of each type, most first: what `models` and the manifest show."""
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def quantization(self) -> str:
        """The type of most weight matrices (Q4_K, Q8_0, F16, ...): the file's quantization."""
        kinds: dict[str, int] = {}
        for t in self.tensors.values():
            if len(t.shape) == 2:
                kinds[t.type_name] = kinds.get(t.type_name, 0) + int(np.prod(t.shape))
        return max(kinds, key=kinds.get) if kinds else "?"


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def read_gguf(path: str | Path) -> GGUFFile:
    """The header of the GGUF at `path`; a ModelError for a file that is not one, is cut short,
    or holds a tensor type mlxbatch cannot read."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                f.seek(0)
                if f.read(4) != MAGIC:
                    raise ModelError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
                raise ModelError(f"{path}: the GGUF file is cut short ({size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(path, buf, size)
    except OSError as e:
        raise ModelError(f"{path}: cannot be read ({e.strerror or e})") from None


def _parse(path: Path, buf: mmap.mmap, size: int) -> GGUFFile:
    if buf[:4] != MAGIC:
        raise ModelError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    c = _Cursor(buf)
    c.pos = 4
    try:
        version = c.take("<I")
        if version not in (2, 3):
            raise ModelError(f"{path}: GGUF version {version} is not one mlxbatch reads (2, 3)")
        n_tensors, n_kv = c.take("<Q"), c.take("<Q")
        metadata = {}
        for _ in range(n_kv):
            key = c.string()
            metadata[key] = c.value(c.take("<I"))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            dims = [c.take("<Q") for _ in range(c.take("<I"))]
            infos.append((name, tuple(reversed(dims)), c.take("<I"), c.take("<Q")))
    except CutShort:
        raise ModelError(
            f"{path}: the GGUF file is cut short (its header runs past the end, {size} bytes)"
        ) from None
    except ValueError as e:
        raise ModelError(f"{path}: not a valid GGUF header ({e})") from None
    align = int(metadata.get("general.alignment", 32) or 32)
    start = -(-c.pos // align) * align
    tensors = {}
    for name, shape, type_id, offset in infos:
        if type_id not in TYPES:
            what = OTHER_TYPES.get(type_id, f"type {type_id}")
            readable = ", ".join(sorted({t[0] for t in TYPES.values()}))
            raise ModelError(
                f"{path}: tensor {name} is stored as {what}, a type mlxbatch "
                f"cannot read ({readable})"
            )
        t = TensorInfo(name, shape, type_id, start + offset)
        if shape and shape[-1] % TYPES[type_id][1]:
            raise ModelError(
                f"{path}: tensor {name}'s rows ({shape[-1]}) are not whole {t.type_name} blocks"
            )
        if t.offset + t.nbytes > size:
            raise ModelError(
                f"{path}: the GGUF file is cut short: tensor {name} ends at byte "
                f"{t.offset + t.nbytes:,}, the file has {size:,}"
            )
        tensors[name] = t
    return GGUFFile(path, version, metadata, tensors)
