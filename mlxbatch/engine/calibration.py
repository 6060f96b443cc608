"""The planner's cost model for this model on this machine: timed on a few batch shapes, fitted
by least squares and cached (~/.cache/mlxbatch/planner.json), or defaulted from FLOP counts."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import OutputError
from ..model import hostops
from ..runtime import blas, cpu
from ..runtime.executor import usable_cores
from ..runtime.files import cache_dir, cache_problem, write_atomically
from .engine import Engine
from .planner import CostModel

# (rows, width) of one lane's batch: short, medium and long rows at several batch sizes
SHAPES = ((1, 16), (4, 16), (16, 16), (2, 64), (8, 64), (16, 48), (1, 192), (4, 192), (2, 128))
# Bumped whenever the engine's speed changes shape, so older calibrations are measured again
ENGINE_REVISION = 3


def cache_key(engine: Engine) -> str:
    a = engine.lm.model.args
    fast = engine.scorers["fast"]
    lanes, host_kernels = fast.executor.lanes, fast.host_kernels
    shape = asdict(a)
    shape.pop("vision_language")  # where the weights came from: the same decoder computes
    parts = [
        shape,
        str(engine.lm.dtype),
        lanes,
        host_kernels,
        str(mx.default_device()),
        mx.device_info().get("device_name", "?"),
        cpu.model_name(),
        mx.__version__,
        blas.ACTIVE.get("source", "none"),
        blas.ACTIVE.get("corename"),
        engine.lm.quantization,
        ENGINE_REVISION,
    ]
    if hostops.LAYOUT != blas.TILED:  # the layout calibrations before it was keyed ran in
        parts.append(hostops.LAYOUT)
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _cache() -> dict:
    try:
        data = json.loads((cache_dir() / "planner.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cached_entry(engine: Engine) -> dict | None:
    """This machine's cache entry for `engine` as saved (the model and what was measured)."""
    entry = _cache().get(cache_key(engine))
    return entry if isinstance(entry, dict) else None


def cached(engine: Engine) -> CostModel | None:
    """This machine's calibration for `engine`; None where there is none or it is unreadable."""
    return model_of(cached_entry(engine))


def model_of(entry: dict | None) -> CostModel | None:
    """A cache entry's cost model (`cached`), None where it holds no readable one."""
    try:
        return CostModel.from_dict(entry["model"]) if entry else None
    except (TypeError, KeyError, ValueError):
        return None


def cached_entries() -> list[dict]:
    """What `doctor` shows: every cached calibration."""
    return [{"key": k, **v} for k, v in _cache().items() if isinstance(v, dict)]


def default_model(engine: Engine) -> CostModel:
    """Constants from FLOP counts and a nominal rate, for when nothing was measured."""
    a, fp = engine.lm.model.args, engine.footprint
    lanes = engine.lanes
    dense, attn = a.flops_per_token, a.flops_per_token_key
    gpu = mx.default_device() == mx.gpu
    rate = 5e12 if gpu else 0.6e9 * (blas.ACTIVE.get("gflops") or 50.0) / lanes  # one core's
    per_batch = fp.weight_bytes / (200e9 if gpu else 20e9) + 0.005
    return CostModel(per_batch, dense / rate, 3 * attn / rate, lanes, "default")


def _time(engine: Engine, rows: int, width: int, rng: random.Random) -> float:
    """Seconds of one batch of this shape while every lane runs one (as in a job)."""
    prefix = engine.prefix
    size = engine.lm.model.args.vocab_size  # a small vocabulary (a tiny GGUF's 512) too
    vocab = (min(1000, size // 4), min(30000, size - 1))
    prompts = [prefix + [rng.randint(*vocab) for _ in range(width)] for _ in range(rows)]
    batches = [prompts] * engine.lanes
    engine.score_batches(batches)  # warm: buffers for this batch size
    t = time.perf_counter()
    engine.score_batches(batches)
    return time.perf_counter() - t


def fit(engine: Engine, shapes: list[tuple[int, int]], seconds: list[float]) -> CostModel:
    """Least squares (relative error) for per_batch, per_token and per_key."""
    P = len(engine.prefix)
    X = np.array([[1.0, r * w, r * w * (P + w)] for r, w in shapes])
    y = np.array(seconds)
    active = [0, 1, 2]
    while True:  # drop a term whose coefficient comes out negative, refit
        coef, *_ = np.linalg.lstsq(X[:, active] / y[:, None], np.ones(len(y)), rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(coef)))
    c = np.zeros(3)
    c[active] = np.maximum(coef, 0)
    return CostModel(float(c[0]), float(c[1]), float(c[2]), engine.lanes, "calibrated")


def calibrate(engine: Engine, progress=None, save: bool = True) -> tuple[CostModel, dict]:
    """Measure, fit and (by default) cache; returns the model and the measurements."""
    rng = random.Random(0)
    seconds = []
    t0 = time.perf_counter()
    for r, w in SHAPES:
        seconds.append(_time(engine, r, w, rng))
    model = fit(engine, list(SHAPES), seconds)
    meas = {
        "shapes": [list(s) for s in SHAPES],
        "seconds": seconds,
        "predicted": [float(model.seconds(r, w, len(engine.prefix))) for r, w in SHAPES],
        "took_s": time.perf_counter() - t0,
    }
    if progress:
        progress(f"planner calibrated in {meas['took_s']:.1f} s: {describe(model)}")
    if save:
        _save(engine, model, meas)
    return model, meas


def _save(engine: Engine, model: CostModel, meas: dict) -> None:
    data = _cache()
    data[cache_key(engine)] = {
        "model": model.to_dict(),
        "measured": meas,
        "model_path": str(Path(engine.lm.path).resolve()),
        "dtype": str(engine.lm.dtype),
        "device": str(mx.default_device()),
        "machine": f"{platform.node()} {cpu.model_name()}",
        "at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    path = cache_dir() / "planner.json"
    try:  # a cache: a directory that cannot be written only costs a later re-calibration
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda f: json.dump(data, f, indent=1))
    except (OSError, OutputError):
        pass


CHECK = (1, 16)  # (rows, width) a lane: the batch a first job times against the defaults
OFF_BY = 2.0  # a default prediction further off than this is replaced by a calibration


def cost_model(engine: Engine, notice=None) -> CostModel:
    """The cached calibration; else the defaults, timed on one small batch, cached if within
    OFF_BY, else the engine is calibrated now and `notice` (default: stderr) says so."""
    found = cached(engine)
    if found is not None:
        return found
    model = default_model(engine)
    seconds = _time(engine, *CHECK, random.Random(0))
    predicted = float(model.seconds(*CHECK, len(engine.prefix)))
    off = seconds / max(predicted, 1e-9)
    if 1 / OFF_BY <= off <= OFF_BY:
        _save(engine, model, {"checked": list(CHECK), "seconds": seconds, "predicted": predicted})
        return model
    say = notice or (lambda m: print(m, file=sys.stderr, flush=True))
    say(
        f"planner: the default cost model predicted {predicted:.3f} s for a batch that took "
        f"{seconds:.3f} s here ({off:.2f}x): calibrating it for this machine "
        + (f"(not cached: {why})" if (why := cache_problem()) else "once (cached)")
        + busy()
    )
    return calibrate(engine, say)[0]


def busy() -> str:
    """A warning where other work (the load average) shares the cores a calibration times."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    cores = len(usable_cores())
    if load <= cores:
        return ""
    return (
        f"; the machine is busy (load {load:.1f} on {cores} cores): the constants come out "
        "slow; run `mlxbatch doctor --calibrate` on a quiet machine to measure them again"
    )


def describe(m: CostModel) -> str:
    return f"{m.source}: {m.constants()}; {m.lanes} lane(s) at once"
