"""The names a shared library exports, read from its ELF dynamic symbol table (no binutils)."""

from __future__ import annotations

import struct
from pathlib import Path

_SHT_DYNSYM = 11
_PT_LOAD = 1
_STB_GLOBAL, _STB_WEAK = 1, 2


def exported_symbols(path: str | Path) -> list[str]:
    """The defined global or weak symbols `path` exports; ValueError if not a 64-bit LE ELF."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF library")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    names = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_DYNSYM:
            continue
        strtab = sections[link][4]
        for at in range(offset + entsize, offset + size, entsize):  # entry 0 is the null symbol
            name, info, _, shndx = struct.unpack_from("<IBBH", data, at)
            if shndx != 0 and info >> 4 in (_STB_GLOBAL, _STB_WEAK):
                end = data.index(b"\0", strtab + name)
                names.append(data[strtab + name : end].decode())
    return names


def whole(path: str | Path) -> bool:
    """Whether every loaded segment and the section table of `path` lie inside the file."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            size = f.seek(0, 2)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return False
            phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
            if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
                return False
            f.seek(phoff)
            table = f.read(phnum * phentsize)
    except OSError:
        return False
    for i in range(phnum):
        kind, _, offset, _, _, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if kind == _PT_LOAD and offset + filesz > size:
            return False
    return True
