"""mlxbatch: batch text classification with small instruction models in MLX."""

from __future__ import annotations

__all__ = ["Classifier", "Prediction", "PromptSpec", "evaluate"]
_HOMES = {
    "Classifier": "classifier",
    "Prediction": "classifier",
    "PromptSpec": "classifier",
    "evaluate": "evaluate",
}


def __getattr__(name: str):
    # Lazy, so `mlxbatch` can pick the BLAS before mlx is first imported (see runtime/blas.py).
    if name in __all__:
        import importlib

        from .errors import UsageError
        from .runtime import blas

        if why := blas.startup_problem():
            raise UsageError(why)
        if not blas.activate_in_process() and blas.warning():
            import warnings

            warnings.warn(blas.warning(), RuntimeWarning, stacklevel=2)
        return getattr(importlib.import_module(f".api.{_HOMES[name]}", __name__), name)
    raise AttributeError(name)
