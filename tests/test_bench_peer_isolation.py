"""Bench peers each in a child process: one that crashes (llama.cpp's Q8_0 dies of SIGSEGV on
some CPUs) is reported with its signal, and the run goes on to its report and JSON; peers
asked for with --modes lacking the gold loop still get their reference."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from mlxbatch.bench import peers
from mlxbatch.bench.job import BenchOptions, bench_job

FAKE = "tests.test_bench_peer_isolation:fake_peer"
ROOT = str(Path(__file__).resolve().parents[1])


def fake_peer(name: str, gold: list[int], **_) -> dict:
    """llama.cpp's Q8_0 crashing, as it does on some CPUs; every other peer agreeing."""
    if name == "llama.cpp-q8_0":
        os.kill(os.getpid(), signal.SIGSEGV)
    if name == "mlx-lm":
        raise RuntimeError("the weights\nwould not load")
    return {
        "name": name,
        "seconds": 1.0,
        "items_per_s": float(len(gold)),
        "agreement": 1.0,
        "gold": gold,
    }


def test_a_crashing_peer_is_reported_and_the_others_run(monkeypatch, tmp_path):
    monkeypatch.setattr(peers, "PEER_RUN", FAKE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    said = []
    out = peers.run_peers(
        tmp_path, [[1, 2, 3]], [[5], [6]], [1], 4096, 8, 8, ("llama.cpp", "mlx-lm"), said.append
    )
    assert out[0]["name"] == "llama.cpp-f32" and out[0]["gold"] == [1]
    assert out[1] == {"name": "llama.cpp-q8_0", "error": "crashed (SIGSEGV)", "crashed": "SIGSEGV"}
    assert out[2] == {"name": "mlx-lm", "error": "the weights would not load"}
    assert "llama.cpp-q8_0: crashed (SIGSEGV)" in said


def test_the_bench_report_survives_a_crashing_peer_without_gold_in_modes(monkeypatch, tmp_path):
    monkeypatch.setattr(peers, "PEER_RUN", FAKE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    js = tmp_path / "bench.json"
    o = BenchOptions(
        tickets="12",
        modes=("sorted",),
        peers=("llama.cpp",),
        quick=True,
        calibrate=False,
        json_path=js,
    )
    said = []
    result, text = bench_job(o, lambda m: m, progress=said.append)
    assert [m["name"] for m in result["modes"]] == ["sorted (default)"]
    f32, q8 = result["peers"]
    assert len(f32["gold"]) == 12 and f32["agreement"] == 1.0  # the gold loop ran for them
    assert q8["error"] == "crashed (SIGSEGV)"
    assert any("peers' reference" in line for line in said)
    assert "llama.cpp-q8_0" in text and "crashed (SIGSEGV)" in text and "llama.cpp-f32" in text
    assert json.loads(js.read_text())["peers"][1]["crashed"] == "SIGSEGV"
