"""Each OpenBLAS measured in a probe subprocess (where a build for another CPU dies harmlessly):
speed, kernel family and batch-invariant layouts, cached per machine and install."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import OutputError
from . import cpu, flags
from .cpu import CORETYPE
from .files import cache_dir, write_atomically

_PROBED: dict[str, dict] = {}  # measured() by key where the cache cannot keep them
PROBE = flags.BLAS_PROBE  # set in the probe subprocess: never recurse
ENGINE_ROWS = 4  # bump when model/hostops.py's layouts or model/invariance.py's checks change
TILED = "tiled"  # that layout: journals and calibrations from before it was recorded ran in it
# the host kernels' row layouts (model/hostops.py), fastest first; "tiled" held by every family
LAYOUTS = ("plain", TILED)


@dataclass(frozen=True)
class Candidate:
    """An OpenBLAS this process could load (`library`), or why it cannot (`problem`)."""

    source: str  # "scipy-openblas32" or "system"
    library: str | None
    env: tuple[tuple[str, str], ...] = ()  # OPENBLAS_CORETYPE for Debian's old builds
    problem: str | None = None


_PROBE_CODE = """
import ctypes, json, sys, time
info = {}
if sys.argv[1]:
    lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
    for name in ("config", "corename"):
        fn = getattr(lib, "openblas_get_" + name)
        fn.restype = ctypes.c_char_p
        info[name] = fn().decode()
    info["threads"] = lib.openblas_get_num_threads()
    lib.openblas_set_num_threads(1)  # as the lanes run it (see executor.py)
import mlx.core as mx
a = mx.random.normal((512, 512)); mx.eval(a @ a)
best = 1e9
for _ in range(5):
    t = time.perf_counter(); mx.eval(a @ a); best = min(best, time.perf_counter() - t)
info["gflops"] = 2 * 512**3 / best / 1e9
if sys.argv[1]:
    from mlxbatch.model.invariance import invariant_layouts
    info["layouts"] = invariant_layouts()  # fastest first
    info["invariant"] = bool(info["layouts"])
print(json.dumps(info))
"""


def _probe(library: str, env: tuple[tuple[str, str], ...]) -> dict:
    """An fp32 matmul with `library` loaded first, measured in a subprocess: {"gflops",
    "config", "corename", "threads"}, or {"failure": why}."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE_CODE, library],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **dict(env), PROBE: "1"},
        )
    except subprocess.TimeoutExpired:
        return {"failure": "the probe took over 120 s"}
    except OSError as e:
        return {"failure": f"the probe could not start: {e}"}
    if out.returncode < 0:
        name = signal.Signals(-out.returncode).name
        if -out.returncode in _STOPPED_FROM_OUTSIDE:  # says nothing of the library: not kept
            return {"failure": f"stopped by {name} in the probe", "transient": True}
        hint = " (a build for another CPU)" if name == "SIGILL" else ""
        return {"failure": f"died of {name} in the probe{hint}"}
    try:
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        lines = [x for x in out.stderr.strip().splitlines() if x.strip()]
        return {"failure": (lines[-1] if lines else f"exit {out.returncode}")[:300]}


# Signals another process sends (Ctrl-C, a service manager, the OOM killer), not a library's fault
_STOPPED_FROM_OUTSIDE = {signal.SIGINT, signal.SIGTERM, signal.SIGKILL, signal.SIGHUP}


def env_for(c: Candidate, family: str | None) -> tuple[tuple[str, str], ...]:
    """`c`'s environment with OPENBLAS_CORETYPE set to `family` (as it is when None)."""
    if family is None:
        return c.env
    return (*[e for e in c.env if e[0] != CORETYPE], (CORETYPE, family))


def family_key(library: str, family: str | None) -> str:
    return library if family is None else f"{library}|{family}"


def measured(options: list[Candidate]) -> dict[str, dict]:
    """{library[|family] or "reference": result} of the probes of `options`, cached per machine,
    library and MLX version; a library not batch-invariant is probed again per kernel family."""
    loadable = [_identity(c.library) for c in options if c.library]  # a changed copy: again
    flags = hashlib.sha256(" ".join(sorted(cpu.flags())).encode()).hexdigest()[:16]
    key = json.dumps(
        [
            cpu.model_name(),
            flags,
            loadable,
            importlib.metadata.version("mlx"),
            [
                os.environ.get(k, "")
                for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OPENBLAS_L2_SIZE")
            ],
            ENGINE_ROWS,
        ]
    )
    path = cache_path()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}

    def current(c) -> bool:  # this machine's, and as a probe writes it
        return isinstance(c, dict) and c.get("key") == key and _readable(c.get("probes"), options)

    if not current(cached) and key in _PROBED:
        cached = {"key": key, "probes": _PROBED[key]}  # probed already: the cache kept nothing
    if not current(cached):
        found = {"reference": _probe("", ())}
        for c in options:
            if not c.library:
                continue
            found[c.library] = first = _probe(c.library, c.env)
            if first.get("invariant") is False:
                for family in cpu.families():
                    if family.lower() == str(first.get("corename", "")).lower():
                        continue  # OpenBLAS's own choice: probed just above
                    found[family_key(c.library, family)] = _probe(c.library, env_for(c, family))
        cached = {"key": key, "probes": found}
        if any(r.get("transient") for r in found.values()):
            return found  # probed again by the next run: a probe stopped from outside
        try:  # atomically: ranks starting together never read a half-written cache
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, lambda f: json.dump(cached, f, indent=1))
        except (OSError, OutputError):  # measured again by the next run, not by this one
            _PROBED[key] = found
    return cached["probes"]


def cache_path() -> Path:
    """This install's probe cache: each Python environment (sys.prefix) keeps its own."""
    install = hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:12]
    return cache_dir() / f"blas-{install}.json"


def _readable(found, options: list[Candidate]) -> bool:
    """Whether cached probes read as the probes write them, one for each library."""
    if not isinstance(found, dict) or not all(c.library in found for c in options if c.library):
        return False
    for result in found.values():
        if not isinstance(result, dict):
            return False
        if "failure" in result:
            if not isinstance(result["failure"], str):
                return False
            continue
        rate, layouts = result.get("gflops"), result.get("layouts", [])
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
            return False
        if any(not isinstance(result.get(k, ""), str) for k in ("config", "corename")):
            return False
        if not isinstance(layouts, list) or any(x not in LAYOUTS for x in layouts):
            return False
        if result.get("invariant", bool(layouts)) is not bool(layouts):
            return False
    return True


def _identity(library: str) -> list:
    try:
        st = os.stat(library)
    except OSError:
        return [library]
    return [library, st.st_size, st.st_mtime_ns]
