"""A job's fingerprint: `part=digest` words over everything that changes a row's scores or
errors, so `--resume` continues only the run that wrote the journal and a refusal names the
part that differs."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import mlx.core as mx

from ..api.classifier import Classifier
from ..api.spec import Settings
from ..model import hostops
from ..model.files import CONFIG, INDEX, TOKENIZER_FILES, read_regular, weight_paths
from ..runtime.blas import TILED
from ..runtime.sgemm import sgemm_provider

SAMPLES, SAMPLE_BYTES = 16, 1 << 16  # 1 MiB read per weight file: milliseconds, at any size


def weights_digest(model_dir: Path) -> list:
    """Per weight file its name, size, mtime and a hash of 16 samples of 64 KiB spread over it
    (the first holds the header): what it misses is in docs/guarantees.md."""
    out = []
    for path in weight_paths(model_dir):
        st, h = path.stat(), hashlib.sha256()
        step = max(SAMPLE_BYTES, st.st_size // SAMPLES)
        with open(path, "rb") as f:
            for offset in sorted({*range(0, st.st_size, step), max(0, st.st_size - SAMPLE_BYTES)}):
                h.update(os.pread(f.fileno(), SAMPLE_BYTES, offset))
        out.append([path.name, st.st_size, st.st_mtime_ns, h.hexdigest()])
    return out


def model_record(clf: Classifier) -> dict:
    """What of the model decides a row's bits, file by file, so a refusal can name the file
    that changed; and the chat template as rendered around a fixed prompt."""
    model_dir = Path(clf.lm.path)
    files = {name: digest(entry) for name, *entry in weights_digest(model_dir)}
    for name in (CONFIG, *TOKENIZER_FILES, INDEX):
        data = read_regular(model_dir / name)
        files[name] = None if data is None else hashlib.sha256(data).hexdigest()[:16]
    tok = clf.lm.tokenizer
    f = tok.frame("A fixed system prompt.", (("an example", "a label"),))
    rendered = digest([f.head, f.lead, f.trail, f.tail, f.trim, tok.answer])
    return {"path": str(model_dir.resolve()), "files": files, "template": rendered}


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def compute_path(clf: Classifier) -> dict:
    """What decides a score's bits besides the model and inputs (BLAS, host kernels, device,
    MLX): a run resumed on another path would mix two computations in one output."""
    blas = sgemm_provider()
    config = (blas["config"] or "").split()
    if blas["library"]:
        name = Path(blas["library"]).name if blas["library"].startswith("/") else blas["library"]
    else:
        name = "reference BLAS (bundled with MLX)" if platform.system() == "Linux" else None
    try:
        mlx = version("mlx")
    except PackageNotFoundError:
        mlx = None
    return {
        "blas": " ".join(config[:2]) or name,  # "OpenBLAS 0.3.28": its name and version
        "kernels": blas["corename"],  # OpenBLAS's kernel family on this CPU ("Haswell")
        "library": name,
        "host_kernels": hostops.available(clf.lm.dtype),
        "layout": hostops.LAYOUT,  # the host kernels' row layout, which the BLAS decides
        "device": str(mx.default_device()),
        "mlx": mlx,
        # the shared prefix's cache runs OpenBLAS on one thread (engine/scorers.py)
        "prefix_threads": "one",
    }


# what the compute part hashes (the library's name is recorded only); the layout where not tiled
DECIDING = ("blas", "kernels", "host_kernels", "device", "mlx", "prefix_threads")


def fingerprint(input_digest: str, clf: Classifier, s: Settings, compute: dict, model: dict) -> str:
    """`model=… dtype=… input=… …` (16 hex digits a part): `--resume` names those that differ."""
    o = s.spec
    parts = {
        "model": digest(model),
        "dtype": digest(str(clf.lm.dtype)),
        "input": input_digest,
        "labels": digest([list(s.labels), [list(t) for t in clf.labels.tokens]]),
        "prompt": digest(
            [s.system_prompt, [list(e) for e in s.examples]]
            + ([clf.questions.record()] if hasattr(clf, "questions") else [])
        ),
        "settings": digest(
            [o.mode, clf.engine.prefix_cache, o.too_long, o.max_tokens, o.on_error, o.planner]
        ),
        "adjustment": digest(
            [clf.adjust.p_cf, clf.adjust.prior, clf.adjust.min_confidence] + _per_question(clf)
        ),
        "shape": digest(s.resume_record()),  # a resume's is the journal's: an edited one differs
        "compute": digest(
            [compute.get(k) for k in DECIDING]
            + [x for x in [compute.get("layout", TILED)] if x != TILED]
        ),
    }
    return " ".join(f"{k}={v}" for k, v in parts.items())


def _per_question(clf: Classifier) -> list:
    """With questions, each prompt's adjustment and the tag threshold; else nothing."""
    if not hasattr(clf, "questions"):
        return []
    weighed = any(a.prior is not None for a in clf.adjusts)  # as before where no prior is
    return [
        [[a.p_cf, a.min_confidence, *([a.prior] if weighed else [])] for a in clf.adjusts],
        clf.tag_threshold,
    ]
