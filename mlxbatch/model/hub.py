"""Where `--model` points: a local directory (any of mlxbatch's, transformers' or mlx-lm's), a
GGUF file (a path or `ollama:NAME[:TAG]`, converted once into the cache), or a Hugging Face
hub id resolved as mlx-lm resolves it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..errors import ModelError
from .families import FAMILIES
from .files import check_regular_files
from .gguf_convert import cached_model_dir, describe_gguf
from .gguf_file import is_gguf
from .local_stores import PREFIX, lmstudio_models, ollama_blob, ollama_models
from .vision_language import is_vision_language, text_config

ALLOW_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
]
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_cache() -> str:
    """The Hugging Face hub cache, read from the environment now (HF_HUB_CACHE, HF_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return os.path.join(home, "hub")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve(spec: str | Path) -> Path:
    """A local model directory for `spec`: a path, or a hub id (cached or downloaded)."""
    if not str(spec).strip():  # Path("") is the working directory; a script's unset $MODEL
        raise ModelError(
            f"the model is named by an empty string ({spec!r}): give a model directory or a hub id"
        )
    if str(spec).startswith(PREFIX):  # a GGUF in Ollama's store
        return cached_model_dir(ollama_blob(str(spec)))
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file() and (path.suffix.lower() == ".gguf" or is_gguf(path)):
            return cached_model_dir(path)  # converted once, into mlxbatch's cache
        if not path.is_dir():
            raise ModelError(f"{spec}: not a model directory nor a GGUF file")
        return path
    text = str(spec)
    if not REPO_ID.match(text) or text.startswith((".", "/", "~")):
        raise ModelError(f"{spec}: model directory not found")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelError(
            f"{spec}: not a local directory, and huggingface_hub is not "
            "installed to look it up on the hub"
        ) from None
    try:
        found = snapshot_download(
            text, allow_patterns=ALLOW_PATTERNS, cache_dir=hub_cache(), local_files_only=offline()
        )
    except Exception as e:  # huggingface_hub raises many types; each means "not available"
        how = (
            "HF_HUB_OFFLINE is set and the local Hugging Face cache has no snapshot of it"
            if offline()
            else f"not in the local cache and could not be downloaded ({type(e).__name__})"
        )
        raise ModelError(
            f"{spec}: {how}; download it with `hf download {text}` or give a local directory"
        ) from None
    if not (Path(found) / "config.json").is_file():  # an empty refs/main: "snapshots/" itself
        raise ModelError(
            f"{spec}: the Hugging Face cache's snapshot {found} holds no "
            f"config.json (is its refs/main empty, or naming no snapshot?); "
            f"download it again with `hf download {text}`"
        )
    return Path(found)


def describe_dir(path: Path) -> dict | None:
    """What `mlxbatch models` shows of a directory, or None if mlxbatch cannot run it."""
    try:
        check_regular_files(path)  # a FIFO would block the listing: refused by `models` BROKEN
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError, ModelError):
        return None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model_type"), str):
        return None  # not a config mlxbatch can read
    try:
        text = text_config(cfg, str(path / "config.json"))  # a vision-language model's own
    except ModelError:
        return None
    if text["model_type"] not in FAMILIES:
        return None
    if not (path / "tokenizer.json").is_file() or not any(path.glob("*.safetensors")):
        return None
    q = cfg.get("quantization")
    if (path / "mlxbatch.json").is_file():
        kind = "mlxbatch"
    elif q or "mlx" in json.dumps(cfg.get("quantization_config", "")):
        kind = "mlx-lm"
    else:
        kind = "hugging face"
    return {
        "path": str(path),
        "kind": kind,
        "synthetic": bool(cfg.get("mlxbatch_synthetic")),
        "quantization": f"{q.get('bits')}-bit, group {q.get('group_size')}"
        if isinstance(q, dict)
        else None,
        "family": FAMILIES[text["model_type"]].name
        + (" (with vision)" if is_vision_language(cfg) else ""),
        "size": f"{text.get('hidden_size')} x {text.get('num_hidden_layers')} layers",
    }


def list_models(weights_dir: Path) -> list[dict]:
    """Runnable models under `weights_dir`, in Ollama's and LM Studio's stores and the HF cache."""
    out = []
    if weights_dir.is_dir():
        for d in sorted(weights_dir.iterdir()):
            info = (
                describe_dir(d) if d.is_dir() else describe_gguf(d) if d.suffix == ".gguf" else None
            )
            if info:
                out.append(info | {"name": d.name})
    for name, path in ollama_models() + lmstudio_models():
        info = describe_gguf(path)
        if info:
            out.append(
                info | {"name": name, "kind": "ollama" if name.startswith(PREFIX) else "lm studio"}
            )
    try:
        from huggingface_hub import scan_cache_dir

        cache = scan_cache_dir(hub_cache())
    except Exception:  # no cache directory yet, or an unreadable one: nothing to list
        return out
    for repo in sorted(cache.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            info = describe_dir(Path(rev.snapshot_path))
            if info:
                out.append(
                    info
                    | {
                        "name": repo.repo_id,
                        "revision": rev.commit_hash[:8],
                        "main": "main" in rev.refs,
                    }
                )
    return out
