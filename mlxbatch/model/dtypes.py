"""The dtype a model runs in: the one asked for, else the device's and the checkpoint's own.

On the CPU, float32: MLX's half-precision matmuls there are far slower than float32 BLAS.
On a GPU, the checkpoint's own dtype (config.json's `dtype` or `torch_dtype`), as mlx-lm runs
it; bfloat16-trained checkpoints overflow in float16, so float16 only where the checkpoint
says so, names no dtype, or where it is asked for.
"""

from __future__ import annotations

import mlx.core as mx

from ..errors import ModelError

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
CPU_DEFAULT = "the CPU's default"


def name(dtype: mx.Dtype) -> str:
    return str(dtype).split(".")[-1]


def checkpoint_dtype(config: dict) -> tuple[str, str] | None:
    """(the dtype config.json names, the key naming it), or None."""
    text = config.get("text_config")
    for cfg, where in ((config, ""), (text, "text_config.")):
        for key in ("dtype", "torch_dtype"):  # transformers >= 5 writes `dtype`
            if isinstance(cfg, dict) and isinstance(cfg.get(key), str) and cfg[key] in DTYPES:
                return cfg[key], where + key
    return None


def resolve_dtype(asked: str | None, config: dict, gpu: bool) -> tuple[mx.Dtype, str]:
    """The run's dtype and where it comes from, in words; `asked`: a name, or None / "auto"."""
    if asked not in (None, "auto"):
        if asked not in DTYPES:
            raise ModelError(f"dtype {asked!r} is not one of {', '.join(DTYPES)} or auto")
        return DTYPES[asked], "asked for"
    if not gpu:
        return mx.float32, CPU_DEFAULT
    found = checkpoint_dtype(config)
    if found is None:
        return mx.float16, "config.json names no dtype"
    return DTYPES[found[0]], f"config.json's {found[1]}"


def on_gpu() -> bool:
    return mx.default_device() == mx.gpu
