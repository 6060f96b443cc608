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
