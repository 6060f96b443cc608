"""The files of a model directory that decide what a run computes (config, weights, every
tokenizer file), each checked to be a regular file before anything opens it (a FIFO blocks)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import ModelError

CONFIG = "config.json"
# every file a tokenizer or its chat template may be read from, whether or not mlxbatch's own
# loader reads it: one appearing, disappearing or changing may change a prompt's tokens
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
)
INDEX = "model.safetensors.index.json"
MANIFEST = "mlxbatch.json"
NAMED = (CONFIG, *TOKENIZER_FILES, INDEX, MANIFEST)

KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFDIR: "a directory",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def weight_paths(model_dir: Path) -> list[Path]:
    return sorted(Path(model_dir).glob("*.safetensors"))


def not_regular(path: Path, mode: int) -> ModelError:
    kind = KINDS.get(stat.S_IFMT(mode), "not a file")
    return ModelError(
        f"{path}: is not a regular file ({kind}); a model's files are read whole, "
        "give it the file itself"
    )


def check_regular_files(model_dir: Path) -> None:
    """Refuse a model directory whose config, weight or tokenizer file is not a regular file."""
    for path in [Path(model_dir) / name for name in NAMED] + weight_paths(model_dir):
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ModelError(f"{path}: cannot be read ({e.strerror or e})") from None
        if not stat.S_ISREG(mode):
            raise not_regular(path, mode)


def read_regular(path: Path) -> bytes | None:
    """A model file's bytes, or None when there is none; never blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ModelError(f"{path}: cannot be read ({e.strerror or e})") from None
    with open(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(path, mode)
        return f.read()
