"""mlxbatch: batch text classification with small Qwen2/2.5 models in MLX."""

from __future__ import annotations

__all__ = ["Classifier", "Prediction"]


def __getattr__(name: str):
    # Lazy, so `mlxbatch` can pick the BLAS before mlx is first imported (see blas.py).
    if name in __all__:
        from .runtime import blas

        if not blas.activate_in_process() and blas.warning():
            import warnings

            warnings.warn(blas.warning(), RuntimeWarning, stacklevel=2)
        from .jobs import classifier

        return getattr(classifier, name)
    raise AttributeError(name)
