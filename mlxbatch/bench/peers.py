"""Peers for the benchmark on the same weights and prompt tokens, what a user would pick
instead: mlx-lm (one at a time, `batch_generate`), transformers fp32/bf16 with the same sorted
batches, and llama.cpp; each reports seconds, items/s and agreement with our gold loop."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import numpy as np

from ..engine.planner import plan_batches
from ..runtime import cpu
from .isolated import run_isolated
from .llamacpp import OUTTYPES, LlamaCppOptions, llamacpp_peer


def _agreement(labels: list[int], gold: list[int]) -> float:
    return float(np.mean(np.array(labels) == np.array(gold)))


def native_bf16() -> str | None:
    """The CPU's native bf16 matmul instructions, if any (what makes PyTorch bf16 fast)."""
    flags = cpu.flags()
    found = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return ", ".join(found) or None


def _mlx_lm_model(model_dir: Path, dtype=None):
    import mlx.core as mx
    from mlx_lm import load

    model, tokenizer = load(str(model_dir))
    if dtype is not None:
        model.set_dtype(dtype)
    elif mx.default_device() == mx.cpu:
        model.set_dtype(mx.float32)  # as ours: fp16/bf16 matmuls are very slow on the CPU
    return model, tokenizer


def mlx_lm_single_peer(
    model_dir: Path,
    prompts: list[list[int]],
    label_ids: list[int],
    gold: list[int],
    fp16: bool = False,
) -> dict:
    """mlx-lm one ticket at a time: its model's forward, label logits at the last position."""
    import mlx.core as mx

    model, _ = _mlx_lm_model(model_dir, mx.float16 if fp16 else None)
    ids = mx.array(label_ids)
    picked = []
    t = time.perf_counter()
    for p in prompts:
        logits = model(mx.array([p]))[0, -1]
        picked.append(int(mx.argmax(logits[ids]).item()))
    seconds = time.perf_counter() - t
    name = "mlx-lm one at a time" + (" (fp16)" if fp16 else "")
    return {
        "name": name,
        "seconds": seconds,
        "items_per_s": len(prompts) / seconds,
        "agreement": _agreement(picked, gold),
    }


def mlx_lm_peer(
    model_dir: Path, prompts: list[list[int]], label_ids: list[int], gold: list[int], batch: int
) -> dict:
    """mlx-lm's `batch_generate`, one new token, logits masked to the label tokens."""
    import mlx.core as mx

    gen = importlib.import_module("mlx_lm.generate")
    model, tokenizer = _mlx_lm_model(model_dir)
    allowed = np.full(model.args.vocab_size, -np.inf, np.float32)
    allowed[label_ids] = 0.0
    bias = mx.array(allowed)

    def only_labels(tokens, logits):
        return logits + bias

    t = time.perf_counter()
    out = gen.batch_generate(
        model,
        tokenizer,
        prompts,
        max_tokens=1,
        return_token_ids=True,
        logits_processors=[only_labels],
        completion_batch_size=batch,
        prefill_batch_size=batch,
    )
    seconds = time.perf_counter() - t
    picked = [
        label_ids.index(ids[0]) if ids and ids[0] in label_ids else -1 for ids in out.token_ids
    ]
    return {
        "name": f"mlx-lm batch_generate (batch {batch})",
        "seconds": seconds,
        "items_per_s": len(prompts) / seconds,
        "agreement": _agreement(picked, gold),
    }


def transformers_peer(
    model_dir: Path,
    prompts: list[list[int]],
    label_ids: list[int],
    gold: list[int],
    batch_tokens: int,
    max_batch: int,
    dtype: str = "float32",
) -> dict:
    """PyTorch transformers, length-sorted left-padded batches, label logits only."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).eval()
    batches = plan_batches([len(p) for p in prompts], "greedy", batch_tokens, max_batch)
    picked = [0] * len(prompts)
    head = model.lm_head.weight[label_ids]
    t = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            width = b.width
            ids = torch.zeros((len(b.indices), width), dtype=torch.long)
            att = torch.zeros_like(ids)
            for r, i in enumerate(b.indices):
                ids[r, width - len(prompts[i]) :] = torch.tensor(prompts[i])
                att[r, width - len(prompts[i]) :] = 1
            pos = (att.cumsum(-1) - 1).clamp(min=0)
            h = model.model(input_ids=ids, attention_mask=att, position_ids=pos).last_hidden_state
            logits = h[:, -1] @ head.T
            for r, i in enumerate(b.indices):
                picked[i] = int(logits[r].float().argmax())
    seconds = time.perf_counter() - t
    return {
        "name": f"transformers {dtype} (sorted, budget {batch_tokens})",
        "seconds": seconds,
        "items_per_s": len(prompts) / seconds,
        "agreement": _agreement(picked, gold),
    }


DEFAULT_PEERS = ("mlx-lm", "mlx-lm-batch", "transformers", "transformers-bf16")
PEERS = (*DEFAULT_PEERS, "llama.cpp", *OUTTYPES)  # "llama.cpp": both of its GGUFs


MULTI_TOKEN = (
    "scores each label's first token only; these labels have several (llama.cpp scores them)"
)
PEER_RUN = "mlxbatch.bench.peers:run_peer"  # what each peer's child process calls


def run_peers(
    model_dir: Path,
    prompts: list[list[int]],
    labels: list[list[int]],
    gold: list[int],
    budget: int,
    max_batch: int,
    naive_batch: int,
    names=DEFAULT_PEERS,
    progress=print,
    llama: LlamaCppOptions | None = None,
) -> list[dict]:
    """Every requested peer that can run here, each in a child process of its own (one that
    crashes is reported with its signal); the others say why not. `labels` are the label
    set's token ids, one list a label."""
    import mlx.core as mx

    expanded = (n for name in names for n in (OUTTYPES if name == "llama.cpp" else [name]))
    wanted = list(dict.fromkeys(expanded))
    if mx.default_device() == mx.gpu and "mlx-lm" in wanted:
        wanted.append("mlx-lm-fp16")
    out = []
    for name in wanted:
        if name == "transformers-bf16" and mx.default_device() == mx.cpu and not native_bf16():
            out.append({"name": "transformers bfloat16", "error": "no native bf16 on this CPU"})
            continue
        if name not in OUTTYPES and any(len(t) > 1 for t in labels):
            out.append({"name": name, "error": MULTI_TOKEN})
            continue
        progress(f"running peer {name} ...")
        result = run_isolated(
            PEER_RUN,
            name,
            dict(
                name=name,
                model_dir=Path(model_dir),
                prompts=prompts,
                labels=labels,
                gold=gold,
                budget=budget,
                max_batch=max_batch,
                naive_batch=naive_batch,
                llama=llama or LlamaCppOptions(),
            ),
        )
        if "crashed" in result:
            progress(f"{name}: {result['error']}")
        out.append(result)
    return out


def run_peer(
    name: str,
    model_dir: Path,
    prompts: list[list[int]],
    labels: list[list[int]],
    gold: list[int],
    budget: int,
    max_batch: int,
    naive_batch: int,
    llama: LlamaCppOptions,
) -> dict:
    """One peer by name, in the process that calls it (run_peers' child)."""
    label_ids = [t[0] for t in labels]  # what the other peers score: checked by run_peers
    runs = {
        "mlx-lm": lambda: mlx_lm_single_peer(model_dir, prompts, label_ids, gold),
        "mlx-lm-batch": lambda: mlx_lm_peer(model_dir, prompts, label_ids, gold, naive_batch),
        "transformers": lambda: transformers_peer(
            model_dir, prompts, label_ids, gold, budget, max_batch
        ),
        "transformers-bf16": lambda: transformers_peer(
            model_dir, prompts, label_ids, gold, budget, max_batch, "bfloat16"
        ),
        "mlx-lm-fp16": lambda: mlx_lm_single_peer(model_dir, prompts, label_ids, gold, True),
    }
    for key in OUTTYPES:
        runs[key] = lambda key=key: llamacpp_peer(
            key, model_dir, prompts, labels, gold, llama, _say
        )
    try:
        result = runs[name]()
    except ImportError as e:
        result = {"name": name, "error": f"not installed ({e.name})"}
    if name == "transformers-bf16":
        result["cpu_bf16"] = native_bf16()
    return result


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
