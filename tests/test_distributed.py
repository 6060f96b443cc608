"""Data-parallel classify under `mlx.launch` (ring backend, 2 ranks on localhost): the output
file is byte-for-byte the single-process one; a killed rank fails the job with its rank named,
and --resume completes it identically; uneven shards work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlxbatch.bench.workload import generate, write_jsonl
from mlxbatch.io.sinks import journal_path
from mlxbatch.jobs.distributed import deal
from mlxbatch.runtime.testhold import VARIABLE

LAUNCH = Path(sys.executable).parent / "mlx.launch"
pytestmark = pytest.mark.skipif(not LAUNCH.exists(), reason="mlx.launch is not installed")


def single(model, src, out, *extra):
    cmd = [
        sys.executable,
        "-m",
        "mlxbatch",
        "classify",
        str(src),
        "--model",
        str(model),
        "-o",
        str(out),
        *extra,
    ]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)


def verify_line(text: str) -> str:
    """classify's verification summary ('verify: 100.00% label agreement ... over N items')."""
    lines = [x for x in text.splitlines() if x.startswith("verify:")]
    assert len(lines) == 1, text
    return lines[0].split(", max")[0]


def launched(model, src, out, *extra, wait=True, env=None):
    cmd = [
        str(LAUNCH),
        "-n",
        "2",
        "--backend",
        "ring",
        sys.executable,
        "-m",
        "mlxbatch",
        "classify",
        str(src),
        "--model",
        str(model),
        "-o",
        str(out),
        *extra,
    ]
    if not wait:
        return subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    src = root / "in.jsonl"
    tickets = generate(60, seed=11, mix="heavy-tail")
    tickets[7]["text"] = "   "  # a bad row: an error row under --on-error skip
    tickets[5]["text"] = tickets[20]["text"] = tickets[3]["text"]  # repeats: in and across windows
    write_jsonl(tickets, src)
    return root, src


@pytest.mark.parametrize("mode", ["sorted", "naive"])
def test_two_ranks_write_the_single_process_file(tiny_model_dir, inputs, mode):
    root, src = inputs
    extra = ["--mode", mode, "--on-error", "skip", "--max-batch", "4"]
    single(tiny_model_dir, src, root / f"one-{mode}.jsonl", *extra)
    r = launched(tiny_model_dir, src, root / f"two-{mode}.jsonl", *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (root / f"two-{mode}.jsonl").read_bytes() == (root / f"one-{mode}.jsonl").read_bytes()
    assert "rank 1" in r.stdout + r.stderr and "2 ranks:" in r.stdout + r.stderr


def test_two_ranks_stream_in_windows_and_verify_every_item(tiny_model_dir, inputs):
    """Windows of 7 rows (a bad row and a repeat inside the first, a repeat of it in the
    third): every rank plans the same windows; each rank verifies the items it scored."""
    root, src = inputs
    extra = ["--on-error", "skip", "--max-batch", "4", "--window-rows", "7", "--verify"]
    one = single(tiny_model_dir, src, root / "one-w.jsonl", *extra)
    r = launched(tiny_model_dir, src, root / "two-w.jsonl", *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (root / "two-w.jsonl").read_bytes() == (root / "one-w.jsonl").read_bytes()
    assert verify_line(r.stdout + r.stderr) == verify_line(one.stdout + one.stderr)
    assert "100.00% label agreement" in verify_line(r.stdout + r.stderr)
    assert "1 duplicates scored once" in r.stdout + r.stderr  # row 5; row 20 is in window 3


def test_fewer_batches_than_ranks(tiny_model_dir, tmp_path):
    src = tmp_path / "one.jsonl"
    write_jsonl(generate(1, seed=2), src)
    single(tiny_model_dir, src, tmp_path / "a.jsonl")
    r = launched(tiny_model_dir, src, tmp_path / "b.jsonl")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_batches_are_dealt_by_padded_tokens():
    from mlxbatch.engine.planner import Batch

    batches = [Batch((0,), 100), Batch((1, 2), 30), Batch((3, 4, 5), 10), Batch((6,), 40)]
    shares = deal(batches, 2)
    loads = [sum(b.padded_tokens for b in s) for s in shares]
    assert sorted(loads) == [100, 130] and sum(len(s) for s in shares) == 4  # 100 | 60+40 (+30)
    assert deal(batches[:1], 3)[1:] == [[], []]


def rank_pid(rank: int, marker: str) -> int | None:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if f"MLX_RANK={rank}".encode() in env and marker.encode() in cmd and b"mlxbatch" in cmd:
            return int(d.name)
    return None


def test_a_killed_rank_fails_the_job_and_resume_completes_it(tiny_model_dir, tmp_path):
    src = tmp_path / "in.jsonl"
    write_jsonl(generate(240, seed=5), src)
    extra = [
        "--max-batch",
        "2",
        "--planner",
        "greedy",
        "--batch-tokens",
        "1024",
        "--window-rows",
        "100",
    ]
    ref = single(tiny_model_dir, src, tmp_path / "ref.jsonl", *extra, "--verify")
    out = tmp_path / "killed.jsonl"
    # rank 0 holds for good after journaling 3 rounds of the first window (50 batches of its
    # 100 rows, in rounds of at most 8 a rank: at least 4 rounds), and rank 1 waits for it in
    # round 4: both are alive to the kill
    proc = launched(tiny_model_dir, src, out, *extra, wait=False, env={**os.environ, VARIABLE: "3"})
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if f"({VARIABLE})" in line:
            break
    else:
        raise AssertionError(f"the job ended (exit {proc.wait()}) before its hold point: {seen}")
    assert len(journal_path(out).read_bytes().split(b"\n")) > 3
    pid = rank_pid(1, str(out))
    assert pid is not None, "rank 1 not found"
    os.kill(pid, signal.SIGKILL)
    text = "".join(seen) + proc.communicate(timeout=300)[0]
    assert "rank 1" in text and "--resume" in text, text
    assert not out.exists() and journal_path(out).exists()
    r = launched(tiny_model_dir, src, out, *extra, "--resume", "--verify")
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.read_bytes() == (tmp_path / "ref.jsonl").read_bytes()
    # the rows the killed run journaled are verified too (read back from the journal)
    assert verify_line(r.stdout + r.stderr) == verify_line(ref.stdout + ref.stderr)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 240 and np.all([abs(sum(x["scores"].values()) - 1) < 1e-5 for x in rows])


def test_distributed_flag_without_a_launcher_fails_clearly(tiny_model_dir, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("hello\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxbatch",
            "classify",
            str(src),
            "--model",
            str(tiny_model_dir),
            "--distributed",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "mlx.launch" in r.stderr and "Traceback" not in r.stderr


def test_two_ranks_answer_questions_as_one_process(tiny_model_dir, inputs):
    """Questions: each rank scores whole texts (all their questions); the file is the single
    process's, and each rank verifies the items it scored."""
    import json

    root, src = inputs
    q = root / "q.json"
    q.write_text(
        json.dumps(
            {
                "questions": [
                    {
                        "name": "intent",
                        "ask": "Which team?",
                        "labels": ["billing", "technical", "account"],
                    },
                    {"name": "tags", "multi_label": ["refund", "login"]},
                ]
            }
        )
    )
    extra = ["--on-error", "skip", "--max-batch", "4", "--questions", str(q), "--verify"]
    single(tiny_model_dir, src, root / "one-q.jsonl", *extra)
    r = launched(tiny_model_dir, src, root / "two-q.jsonl", *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (root / "two-q.jsonl").read_bytes() == (root / "one-q.jsonl").read_bytes()
    assert "100.00% label agreement" in verify_line(r.stdout + r.stderr)
