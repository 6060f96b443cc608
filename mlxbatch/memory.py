"""Memory: what is available, what a batch budget costs, and the default budget."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass

from .config import ModelArgs

MAX_BUDGET = 16384  # the largest default budget memory can justify
MIN_BUDGET = 64
# The preferred padded-token budget per batch. On the 2-core CPU of BENCHMARKS.md, 4096 beat
# 512 and 1024 (bigger lanes amortise per-batch work despite more padding); GPUs want rows too.
PREFERRED_BUDGET = 4096


def available_bytes() -> int:
    """Memory this process can use now: MemAvailable on Linux, unified memory on a Mac."""
    if platform.system() == "Linux":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
    if platform.system() == "Darwin":
        try:
            import mlx.core as mx

            info = mx.device_info()
            if "max_recommended_working_set_size" in info:
                return int(info["max_recommended_working_set_size"])
        except Exception:  # no Metal device: fall back to physical memory
            pass
        out = subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True)
        if out.returncode == 0:
            return int(out.stdout.strip())
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class BudgetCost:
    kv_cache: int
    activations: int

    @property
    def total(self) -> int:
        return self.kv_cache + self.activations


def batch_cost(
    args: ModelArgs, dtype_bytes: int, batch_tokens: int, max_batch: int, context: int,
    n_labels: int, label_len: int,
) -> BudgetCost:  # fmt: skip
    """Upper bound on the transient bytes of one batch (weights not included).

    `context` is the longest key length a row can have (prefix + item + label tokens).
    KV: every row holds `context` slots (x labels for the multi-token label pass).
    Activations: the largest per-layer working set of a forward over `batch_tokens` tokens:
    MLP gate/up/product, attention scores, mask and probabilities (fp32), a few hidden copies.
    """
    rows = max_batch * (n_labels if label_len > 1 else 1)
    kv = 2 * args.num_hidden_layers * rows * args.num_key_value_heads * args.head_dim
    kv *= context * dtype_bytes
    t = batch_tokens
    mlp = 3 * t * args.intermediate_size * dtype_bytes
    attn = 3 * t * args.num_attention_heads * context * 4 + 5 * t * context  # + the masks
    hidden = 8 * t * args.hidden_size * dtype_bytes
    head = max_batch * n_labels * max(label_len - 1, 0) * args.vocab_size * 4
    return BudgetCost(kv, mlp + attn + hidden + head)


def default_budget(
    args: ModelArgs, dtype_bytes: int, max_batch: int, context: int, n_labels: int,
    label_len: int, available: int | None = None, share: float = 0.5,
) -> int:  # fmt: skip
    """The largest power-of-two budget whose cost fits `share` of the available memory."""
    avail = (available if available is not None else available_bytes()) * share
    budget = MAX_BUDGET
    while budget > MIN_BUDGET:
        if (
            batch_cost(args, dtype_bytes, budget, max_batch, context, n_labels, label_len).total
            <= avail
        ):
            break
        budget //= 2
    return budget
