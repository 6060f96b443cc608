"""Round nine: what this stop's hostile pass found, each with the case that found it: an
abstention the gold loop would not make passed `--verify`. (Long texts held a window's tokens
at once: tests/test_windows.py.)"""

from __future__ import annotations

import json

import numpy as np
from cli_run import invoke

from mlxbatch import Classifier
from mlxbatch.bench.workload import generate, write_jsonl


def test_verify_fails_where_the_fast_path_abstains_and_the_gold_loop_answers(tiny_model_dir,
                                                                            tmp_path):  # fmt: skip
    """`--min-confidence` at a gold-loop top score: a fast score a few ulps under it abstained
    in the output, the gold loop answered, and --verify said 100% and exited 0."""
    rows = generate(50, seed=0)
    src = tmp_path / "t.jsonl"
    write_jsonl(rows, src)
    clf = Classifier.load(tiny_model_dir)
    texts = [r["text"] for r in rows]
    fast = np.array([[p.scores[n] for n in clf.labels.names] for p in clf.classify(texts)])
    gold = np.stack([clf.engine.score_gold(clf.engine.prompt(t)) for t in texts])
    under = np.flatnonzero(fast.max(1) < gold.max(1))
    assert len(under), "no row's fast top score is below its gold one: pick other tickets"
    threshold = float(gold[under[0]].max())  # the gold loop answers (not below), fast abstains
    out = tmp_path / "o.jsonl"
    r = invoke(["classify", src, "--model", tiny_model_dir, "--min-confidence", threshold,
                "--verify", "-o", out])  # fmt: skip
    assert r.exit_code == 1, r.output
    written = json.loads(out.read_text().splitlines()[int(under[0])])
    assert written["abstained"] and written["label"] is None
    lines = [x for x in r.stderr.splitlines() if x.startswith("  disagreement: ")]
    found = [json.loads(x.split(": ", 1)[1]) for x in lines]
    assert {"gold_abstained": False, "fast_abstained": True}.items() <= found[0].items(), found


def test_ctrl_c_before_the_journal_promises_none(tiny_model_dir, tmp_path, monkeypatch):
    """Ctrl-C once the model had loaded said "finished batches are saved in OUT.part" before
    the job had made its journal: there was none."""
    from mlxbatch.jobs import classify

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(classify, "run_job", interrupted)
    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    src.write_text('{"text": "hello"}\n')
    r = invoke(["classify", src, "--model", tiny_model_dir, "-o", out])
    assert r.exit_code == 130 and "interrupted" in r.stderr, r.output
    assert ".part" not in r.stderr and "--resume" not in r.stderr
    assert not out.exists() and not (tmp_path / "o.jsonl.part").exists()


def test_closed_standard_streams_never_take_a_files_place(tiny_model_dir, tmp_path):
    """`>&-`: the rows went nowhere with a traceback (Python's stdout was None), and the next
    file opened would have been descriptor 1; `2>&-`: exit 1 and no output; `<&-` with
    INPUT `-`: a traceback. Now: a refusal, a normal run, an empty input."""
    import os
    import subprocess
    import sys

    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    cmd = [sys.executable, "-m", "mlxbatch", "classify", str(src), "--model", str(tiny_model_dir)]

    def run(args, closed: int):  # the stream closed in the child, after the pipes are set
        return subprocess.run(args, capture_output=True, text=True, timeout=300,
                              preexec_fn=lambda: os.close(closed))  # fmt: skip

    r = run(cmd, 1)
    assert r.returncode == 2 and "standard output is closed" in r.stderr, r.stderr
    out = tmp_path / "o.jsonl"
    r = run([*cmd, "-o", str(out)], 2)
    assert r.returncode == 0 and out.read_text().count("\n") == 1
    assert not (tmp_path / "o.jsonl.part").exists()
    r = run([*cmd[:4], "-", *cmd[5:], "-o", "-"], 0)
    assert r.returncode == 2 and "empty input" in r.stderr, r.stderr


def test_tickets_dash_o_dash_is_standard_output(tmp_path):
    """`tickets N -o -` wrote a file named `-` (52 MB for 100,000) where classify reads `-o -`
    as standard output."""
    r = invoke(["tickets", "3", "-o", "-"], tmp_path)
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 3, r.output
    assert not (tmp_path / "-").exists()
