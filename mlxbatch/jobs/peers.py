"""Peers for the benchmark, on the same weights and prompt tokens: mlx-lm and transformers."""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import numpy as np

from ..engine.planner import plan_batches


def _agreement(labels: list[int], gold: list[int]) -> float:
    return float(np.mean(np.array(labels) == np.array(gold)))


def mlx_lm_peer(
    model_dir: Path, prompts: list[list[int]], label_ids: list[int], gold: list[int], batch: int
) -> dict:
    """mlx-lm's `batch_generate`, one new token, logits masked to the label tokens."""
    import mlx.core as mx
    from mlx_lm import load

    gen = importlib.import_module("mlx_lm.generate")
    model, tokenizer = load(str(model_dir))
    if mx.default_device() == mx.cpu:
        model.set_dtype(mx.float32)  # as ours: fp16/bf16 matmuls are very slow on the CPU
    allowed = np.full(model.args.vocab_size, -np.inf, np.float32)
    allowed[label_ids] = 0.0
    bias = mx.array(allowed)

    def only_labels(tokens, logits):
        return logits + bias

    t = time.perf_counter()
    out = gen.batch_generate(
        model, tokenizer, prompts, max_tokens=1, return_token_ids=True,
        logits_processors=[only_labels], completion_batch_size=batch, prefill_batch_size=batch,
    )  # fmt: skip
    seconds = time.perf_counter() - t
    picked = [
        label_ids.index(ids[0]) if ids and ids[0] in label_ids else -1 for ids in out.token_ids
    ]
    return {"name": f"mlx-lm batch_generate (batch {batch})", "seconds": seconds,
            "items_per_s": len(prompts) / seconds, "agreement": _agreement(picked, gold)}  # fmt: skip


def transformers_peer(
    model_dir: Path, prompts: list[list[int]], label_ids: list[int], gold: list[int],
    batch_tokens: int, max_batch: int,
) -> dict:  # fmt: skip
    """PyTorch transformers, fp32, length-sorted left-padded batches, label logits only."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batches = plan_batches([len(p) for p in prompts], "sorted", batch_tokens, max_batch)
    picked = [0] * len(prompts)
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
            logits = h[:, -1] @ model.lm_head.weight[label_ids].T
            for r, i in enumerate(b.indices):
                picked[i] = int(logits[r].argmax())
    seconds = time.perf_counter() - t
    return {"name": f"transformers fp32 (sorted, budget {batch_tokens})", "seconds": seconds,
            "items_per_s": len(prompts) / seconds, "agreement": _agreement(picked, gold)}  # fmt: skip
