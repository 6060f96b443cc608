"""The dtype a model runs in: the one asked for, else the device's and the checkpoint's own.

On the CPU, float32: MLX's float16/bfloat16 matmuls there are far slower than float32 BLAS
(~5 GFLOP/s). On a GPU (Metal, CUDA), the checkpoint's own dtype, as mlx-lm runs it (its
convert reads `torch_dtype` and keeps float32 as float32; its load keeps the stored dtype):
config.json's `dtype` (transformers >= 5) or `torch_dtype`, the language model's for a
vision-language checkpoint. Gemma 3 and the other bfloat16-trained checkpoints overflow in
float16, so float16 is used only where the checkpoint says so, where config.json names no dtype
(mlxbatch's GPU default before), or where it is asked for.
"""

from __future__ import annotations

import mlx.core as mx

from ..errors import ModelError

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
CPU_DEFAULT = "the CPU's default"


def name(dtype: mx.Dtype) -> str:
    return str(dtype).split(".")[-1]


def checkpoint_dtype(config: dict) -> tuple[str, str] | None:
    """(the dtype config.json names, the key naming it), or None where it names none of
    DTYPES."""
    text = config.get("text_config")
    for cfg, where in ((config, ""), (text, "text_config.")):
        for key in ("dtype", "torch_dtype"):  # transformers >= 5 writes `dtype`
            if isinstance(cfg, dict) and isinstance(cfg.get(key), str) and cfg[key] in DTYPES:
                return cfg[key], where + key
    return None


def resolve_dtype(asked: str | None, config: dict, gpu: bool) -> tuple[mx.Dtype, str]:
    """The run's dtype and, in words, where it comes from (for the model summary and
    `doctor`). `asked`: a name of DTYPES, or None / "auto" for the default."""
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
