"""Installs sharing one ~/.cache/mlxbatch (two virtual environments): each keeps its own BLAS
probe results, so neither measures again (5 s against 1.6 s a run) after the other ran."""

from __future__ import annotations

import sys

from mlxbatch.runtime import blas, probe

FOUND = {
    "": {"gflops": 5.0},
    "/a/libopenblas.so": {
        "gflops": 80.0,
        "corename": "Haswell",
        "config": "x",
        "threads": 2,
        "layouts": ["tiled"],
        "invariant": True,
    },
    "/b/libopenblas.so": {
        "gflops": 70.0,
        "corename": "Haswell",
        "config": "x",
        "threads": 2,
        "layouts": ["tiled"],
        "invariant": True,
    },
}


def test_two_installs_keep_their_own_probes(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MLXBATCH_NO_FAST_BLAS", raising=False)
    monkeypatch.setattr(blas.platform, "system", lambda: "Linux")
    probed = []
    monkeypatch.setattr(probe, "_probe", lambda lib, env: probed.append(lib) or FOUND[lib])
    installs = {"/venv/a": "/a/libopenblas.so", "/venv/b": "/b/libopenblas.so"}

    def run(prefix: str) -> blas.BlasPlan:
        monkeypatch.setattr(sys, "prefix", prefix)
        monkeypatch.setattr(
            blas, "candidates", lambda: [blas.Candidate("scipy-openblas32", installs[prefix])]
        )
        return blas.plan()

    assert run("/venv/a").library == "/a/libopenblas.so" and len(probed) == 2
    assert run("/venv/b").library == "/b/libopenblas.so" and len(probed) == 4
    for _ in range(2):  # each run in turn: read back, not measured again
        assert run("/venv/a").gflops == 80.0 and run("/venv/b").gflops == 70.0
    assert len(probed) == 4
    assert len(list((tmp_path / "mlxbatch").glob("blas-*.json"))) == 2


def test_a_probe_stopped_from_outside_is_measured_again_not_cached(monkeypatch, tmp_path):
    """A probe child killed by SIGTERM or SIGINT says nothing of the library: the next run
    measures it again instead of refusing the fast BLAS from then on."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(probe, "_PROBE_CODE", "import os, signal; os.kill(os.getpid(), 15)")
    assert probe._probe("x", ())["transient"] is True
    monkeypatch.setattr(
        probe, "_PROBE_CODE", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"
    )
    assert "transient" not in probe._probe("x", ())  # a crash of the library itself is kept
    results = iter([{"failure": "stopped by SIGTERM in the probe", "transient": True}, FOUND[""]])
    probed = []
    monkeypatch.setattr(
        probe, "_probe", lambda lib, env: probed.append(lib) or next(results, FOUND[lib])
    )
    monkeypatch.setattr(sys, "prefix", "/venv/a")
    options = [blas.Candidate("scipy-openblas32", "/a/libopenblas.so")]
    assert probe.measured(options)["reference"]["transient"] is True
    assert not probe.cache_path().exists()
    assert probe.measured(options)["/a/libopenblas.so"]["gflops"] == 80.0
    assert probe.cache_path().exists() and len(probed) == 4
