"""GGUF files other tools already keep: Ollama's store (`--model ollama:NAME[:TAG]`) and LM
Studio's models folder, found for `mlxbatch models`.

Ollama (`$OLLAMA_MODELS`, else `~/.ollama/models`): a manifest's layer of mediaType
`application/vnd.ollama.image.model` names its GGUF blob by digest; a bare name is
`registry.ollama.ai/library/<name>`, the tag `latest` unless given.
LM Studio keeps plain `.gguf` files under `~/.lmstudio/models` (or the `downloadsFolder` its
settings.json names, or `~/.cache/lm-studio/models`), one folder a publisher/model.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..errors import ModelError

PREFIX = "ollama:"
MODEL_LAYER = "application/vnd.ollama.image.model"
REGISTRY = "registry.ollama.ai"
NAME = re.compile(r"^[\w.-]+(/[\w.-]+){0,2}(:[\w.-]+)?$")


def ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def _manifest_path(name: str) -> Path:
    base, _, tag = name.partition(":")
    parts = base.split("/")
    if len(parts) == 1:
        parts = [REGISTRY, "library", *parts]
    elif len(parts) == 2:
        parts = [REGISTRY, *parts]
    return ollama_root().joinpath("manifests", *parts, tag or "latest")


def ollama_blob(spec: str) -> Path:
    """The GGUF blob `ollama:NAME[:TAG]` names in Ollama's store."""
    name = spec[len(PREFIX) :]
    if not NAME.match(name):
        raise ModelError(f"{spec}: not an Ollama model name (ollama:NAME or ollama:NAME:TAG)")
    path = _manifest_path(name)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(
            f"{spec}: Ollama has no such model ({path} not found; `ollama pull {name}` fetches it)"
        ) from None
    except (OSError, ValueError) as e:
        raise ModelError(f"{spec}: the Ollama manifest {path} cannot be read ({e})") from None
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    model = [x for x in layers or [] if isinstance(x, dict) and x.get("mediaType") == MODEL_LAYER]
    digest = model[0].get("digest") if model else None
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ModelError(
            f"{spec}: the Ollama manifest {path} names no model layer "
            f"({MODEL_LAYER} with a sha256 digest)"
        )
    blob = ollama_root() / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise ModelError(
            f"{spec}: the Ollama store lacks the model's blob {blob} "
            f"(`ollama pull {name}` fetches it again)"
        )
    return blob


def ollama_models() -> list[tuple[str, Path]]:
    """(`ollama:NAME:TAG`, blob) for each model in Ollama's store with a GGUF blob."""
    root = ollama_root() / "manifests"
    out = []
    for path in sorted(root.glob("*/*/*/*")) if root.is_dir() else []:
        host, space, name, tag = path.relative_to(root).parts
        short = (
            name
            if (host, space) == (REGISTRY, "library")
            else (f"{space}/{name}" if host == REGISTRY else f"{host}/{space}/{name}")
        )
        try:
            out.append((f"{PREFIX}{short}:{tag}", ollama_blob(f"{PREFIX}{short}:{tag}")))
        except ModelError:
            continue
    return out


def lmstudio_roots() -> list[Path]:
    home = Path.home()
    roots = [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    try:
        settings = json.loads((home / ".lmstudio" / "settings.json").read_text())
        if isinstance(settings, dict) and isinstance(settings.get("downloadsFolder"), str):
            roots.insert(0, Path(settings["downloadsFolder"]).expanduser())
    except (OSError, ValueError):
        pass  # no settings file: the default folders
    seen, out = set(), []
    for r in roots:
        if r.is_dir() and r.resolve() not in seen:
            seen.add(r.resolve())
            out.append(r)
    return out


def lmstudio_models() -> list[tuple[str, Path]]:
    """(publisher/model/file.gguf, path) for each GGUF in LM Studio's folders."""
    return [
        (str(p.relative_to(root)), p)
        for root in lmstudio_roots()
        for p in sorted(root.rglob("*.gguf"))
        if p.is_file()
    ]
