"""Quantization as a transform of the model, in MLX's own format (what mlx-lm writes); on the
CPU a quantized checkpoint is dequantized once at load, MLX's CPU quantized matmul being
slower than fp32 through OpenBLAS."""

from __future__ import annotations

import contextlib
import io

import mlx.core as mx
import mlx.nn as nn

from ..errors import ModelError, one_line


def quantization(config: dict) -> dict | None:
    """The checkpoint's quantization settings, or None for a dense checkpoint."""
    q = config.get("quantization") or config.get("quantization_config")
    if not q:
        return None
    if (
        not isinstance(q, dict)
        or not isinstance(q.get("bits"), int)
        or not isinstance(q.get("group_size"), int)
    ):
        raise ModelError(
            f"config.json: quantization {q!r} is not MLX's format (group_size and bits as integers)"
        )
    if q.get("mode", "affine") != "affine":
        raise ModelError(
            f"config.json: quantization mode {q['mode']!r} is not supported (affine only)"
        )
    # MLX says which bits and group sizes it can run, on one group (a group of 0 would SIGFPE)
    if not 0 < q["group_size"] <= 4096:
        raise ModelError(
            f"config.json: quantization group_size {q['group_size']} is not a "
            "group size MLX can run"
        )
    try:
        mx.quantize(mx.zeros((1, q["group_size"])), group_size=q["group_size"], bits=q["bits"])
    except (ValueError, TypeError, OverflowError) as e:
        raise ModelError(
            f"config.json: quantization with {q['bits']} bits in groups of "
            f"{q['group_size']} is not one MLX can run ({str(e).splitlines()[0]})"
        ) from None
    return q


def apply(model: nn.Module, q: dict, weights: dict[str, mx.array]) -> None:
    """Turn the layers the checkpoint stores quantized into quantized layers, in place."""
    try:
        _apply(model, q, weights)
    except (ValueError, TypeError) as e:
        raise ModelError(f"config.json: quantization: {one_line(e, 200)}") from None


def _apply(model: nn.Module, q: dict, weights: dict[str, mx.array]) -> None:
    from mlx_lm.utils import infer_quant_config

    def predicate(path: str, module: nn.Module):
        if path in q:  # a per-layer entry: parameters, or False for "not quantized"
            return q[path]
        if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
            return False
        return infer_quant_config(path, module, weights)

    nn.quantize(
        model, q["group_size"], q["bits"], mode=q.get("mode", "affine"), class_predicate=predicate
    )


def dequantize(model: nn.Module, dtype: mx.Dtype) -> None:
    """Replace every quantized layer by a dense one holding its dequantized weights."""
    from mlx_lm.utils import dequantize_model

    dequantize_model(model)
    model.set_dtype(dtype)


def quantize_for_saving(model: nn.Module, config: dict, bits: int, group_size: int) -> dict:
    """Quantize `model` in place as mlx-lm does; returns the config to write beside it."""
    from mlx_lm.utils import quantize_model

    with contextlib.redirect_stdout(io.StringIO()):  # its "[INFO] Quantized model with ..."
        _, config = quantize_model(model, config, group_size, bits)
    config["quantization_config"] = config["quantization"]
    return config


def row_weights(layer: nn.Module, rows: mx.array) -> mx.array:
    """Dense rows of an output head (Embedding or Linear weight), dequantized if need be."""
    if isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        return mx.dequantize(
            layer.weight[rows], layer.scales[rows], layer.biases[rows], layer.group_size, layer.bits
        )
    return layer.weight[rows]
