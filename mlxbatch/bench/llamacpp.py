"""llama.cpp as a bench peer: llama.cpp's own converter to GGUF (F32, Q8_0; cached), then
label scoring as a llama.cpp user would write it: the prompt prefix evaluated once, the KV
cache cut back to it for each ticket, a multi-token label's tokens fed behind the prompt and
cut back again for the next label, llama.cpp's defaults otherwise."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runtime.executor import usable_cores
from ..runtime.files import cache_dir

CONVERTER = "convert_hf_to_gguf.py"
SRC_ENV = "MLXBATCH_LLAMA_CPP_SRC"
OUTTYPES = {"llama.cpp-f32": "f32", "llama.cpp-q8_0": "q8_0"}


@dataclass(frozen=True)
class LlamaCppOptions:
    src: Path | None = None  # unpacked llama.cpp or llama-cpp-python sdist (None: $SRC_ENV)
    threads: int | None = None  # None: the cores this process may use
    cache: Path | None = None  # where GGUFs are kept (None: ~/.cache/mlxbatch/gguf)


def find_converter(src: Path | None) -> tuple[Path | None, str]:
    """llama.cpp's converter under `src` (or $MLXBATCH_LLAMA_CPP_SRC), or None and why not."""
    given = src or (Path(os.environ[SRC_ENV]) if os.environ.get(SRC_ENV) else None)
    if given is None:
        return None, (
            f"no llama.cpp converter: give --llama-cpp-src DIR or {SRC_ENV} (an "
            "unpacked llama.cpp, or llama-cpp-python sdist, with convert_hf_to_gguf.py)"
        )
    for d in (given, given / "vendor" / "llama.cpp"):
        if (d / CONVERTER).is_file() and (d / "gguf-py").is_dir():
            return d / CONVERTER, ""
    return None, f"no {CONVERTER} with gguf-py/ in {given} or {given / 'vendor' / 'llama.cpp'}"


def convert_command(converter: Path, model_dir: Path, outtype: str, outfile: Path) -> list[str]:
    """The converter's command line (its bundled gguf-py is used: no NO_LOCAL_GGUF)."""
    return [
        sys.executable,
        str(converter),
        str(model_dir),
        "--outtype",
        outtype,
        "--outfile",
        str(outfile),
    ]


def cache_key(model_dir: Path, converter: Path) -> str:
    """The model (config, weight files' names, sizes and times) and the converter used."""
    h = hashlib.sha256(str(converter.resolve()).encode())
    h.update((model_dir / "config.json").read_bytes())
    for f in sorted(model_dir.glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name} {st.st_size} {st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def gguf_for(model_dir: Path, outtype: str, converter: Path, cache: Path, progress=print) -> Path:
    """The model as GGUF `outtype`, converted once by llama.cpp's converter, then cached."""
    out = cache / f"{model_dir.name}-{cache_key(model_dir, converter)}" / f"model-{outtype}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(f"{out.stem}.part.gguf")  # renamed once whole
    progress(f"  converting {model_dir} to GGUF {outtype} with {converter} ...")
    run = subprocess.run(
        convert_command(converter, model_dir, outtype, part), capture_output=True, text=True
    )
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"{CONVERTER} failed (exit {run.returncode}): {last}")
    part.replace(out)
    return out


def shared_prefix_len(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own."""
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return n


def usable_threads() -> int:
    return len(usable_cores())


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Full-vocabulary log-probabilities of one position's logits, in float64."""
    x = logits.astype(np.float64)
    top = x.max()
    return x - top - np.log(np.exp(x - top).sum())


class _Logits:
    """The last evaluated position's logits of a `Llama` made with `logits_all=False`."""

    def __init__(self, llm) -> None:
        import llama_cpp

        self._llm, self._get, self._n = llm, llama_cpp.llama_get_logits_ith, llm.n_vocab()

    def last(self) -> np.ndarray:
        ptr = self._get(self._llm.ctx, -1)  # only the last position of an eval has logits
        return np.ctypeslib.as_array(ptr, shape=(self._n,))


def label_scores(llm, logits: _Logits, prompt_len: int, labels: list[list[int]]) -> np.ndarray:
    """Each label's summed full-vocabulary log-probability behind the prompt just evaluated
    (`prompt_len` tokens in the KV cache): its first token from the prompt's last logits, each
    further one from the logits after feeding the label's earlier tokens, one at a time; the
    cache is cut back to the prompt between labels."""
    first = log_softmax(logits.last())
    scores = np.array([first[t[0]] for t in labels])
    for j, tokens in enumerate(labels):
        for i in range(1, len(tokens)):
            llm.eval(tokens[i - 1 : i])  # the cells past n_tokens were removed by eval
            scores[j] += log_softmax(logits.last())[tokens[i]]
        llm.n_tokens = prompt_len  # the next label starts right after the prompt again
    return scores


def score_gguf(
    gguf: Path, prompts: list[list[int]], labels: list[list[int]], threads: int
) -> tuple[np.ndarray, float]:
    """(N, J) label log-probabilities of each prompt by llama.cpp, reusing the prefix's KV
    cache; and seconds. `labels` are the label set's token ids (one list a label)."""
    import llama_cpp

    P = shared_prefix_len(prompts)
    longest = max(len(t) for t in labels) - 1
    llm = llama_cpp.Llama(
        str(gguf),
        n_ctx=max(len(p) for p in prompts) + longest,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )
    logits = _Logits(llm)
    scores = []
    t = time.perf_counter()
    llm.eval(prompts[0][:P])
    for p in prompts:
        llm.n_tokens = P  # keep the prefix's KV cells; eval removes those past n_tokens
        llm.eval(p[P:])
        scores.append(label_scores(llm, logits, len(p), labels))
    seconds = time.perf_counter() - t
    llm.close()
    return np.array(scores).reshape(len(prompts), len(labels)), seconds


def own_gguf(model_dir: Path) -> tuple[Path, str] | None:
    """(the GGUF file, its quantization) a model directory was converted from, where it still
    exists: `--model FILE.gguf` runs such a directory, and llama.cpp is timed on the file."""
    try:
        meta = json.loads((model_dir / "mlxbatch.json").read_text())
        source, quant = Path(meta["source"]), meta["gguf"]["quantization"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (source, str(quant)) if source.is_file() else None


def llamacpp_peer(
    key: str,
    model_dir: Path,
    prompts: list[list[int]],
    labels: list[list[int]],
    gold: list[int],
    o: LlamaCppOptions,
    progress=print,
) -> dict:
    """One llama.cpp peer (`llama.cpp-f32`, `llama.cpp-q8_0`): GGUF, then timed scoring."""
    outtype = OUTTYPES[key]
    name = f"llama.cpp {outtype.upper()}"
    own = own_gguf(Path(model_dir))
    if own is not None:  # a model given as a GGUF: llama.cpp runs that very file
        gguf, quant = own
        if key != next(iter(OUTTYPES)):
            return {"name": name, "error": f"not run: the model's own {quant} GGUF is timed once"}
        name = f"llama.cpp, the model's own {quant} GGUF"
    try:
        import llama_cpp
    except ImportError:
        return {"name": name, "error": "not installed (pip install 'mlxbatch[llamacpp]')"}
    if own is None:
        converter, why = find_converter(o.src)
        if converter is None:
            return {"name": name, "error": why}
        cache = o.cache or cache_dir() / "gguf"
        try:
            gguf = gguf_for(Path(model_dir), outtype, converter, cache, progress)
        except RuntimeError as e:
            return {"name": name, "error": str(e)}
    threads = o.threads or usable_threads()
    load = os.getloadavg()[0]
    if load > usable_threads():
        progress(
            f"  load average {load:.1f} on {usable_threads()} cores: llama.cpp's threads "
            "spin under load, time it on a quiet machine"
        )
    scores, seconds = score_gguf(gguf, prompts, labels, threads)
    picked = scores.argmax(1)
    threads_text = f"{threads} thread{'s' if threads > 1 else ''}"
    return {
        "name": f"{name} ({threads_text}, prefix reused)",
        "seconds": seconds,
        "items_per_s": len(prompts) / seconds,
        "agreement": float(np.mean(np.array(picked) == np.array(gold))),
        "threads": threads,
        "load_before": load,
        "gguf": str(gguf),
        "llama_cpp_version": llama_cpp.__version__,
    }
