"""Hostile `--verify` and `parity` runs: abstentions on one side, checkpoints a reference
cannot run."""

from __future__ import annotations

import json

import numpy as np
from cli_run import invoke

from mlxbatch import Classifier
from mlxbatch.bench.workload import generate, write_jsonl


def test_verify_fails_where_the_fast_path_abstains_and_the_gold_loop_answers(
    tiny_model_dir, tmp_path
):
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
    r = invoke(
        [
            "classify",
            src,
            "--model",
            tiny_model_dir,
            "--min-confidence",
            threshold,
            "--verify",
            "-o",
            out,
        ]
    )
    assert r.exit_code == 1, r.output
    written = json.loads(out.read_text().splitlines()[int(under[0])])
    assert written["abstained"] and written["label"] is None
    lines = [x for x in r.stderr.splitlines() if x.startswith("  disagreement: ")]
    found = [json.loads(x.split(": ", 1)[1]) for x in lines]
    assert {"gold_abstained": False, "fast_abstained": True}.items() <= found[0].items(), found


def test_a_check_disagrees_where_one_answer_abstains():
    """The rule itself, on crafted results (the CLI case above needs a row whose fast score
    falls under its gold one, which the machine's kernels decide)."""
    from mlxbatch.api.verify import Check

    both = Check("billing", "billing", 6e-8, 0.2, (False, False))
    one = Check("billing", "billing", 6e-8, 0.2, (False, True))
    assert both.agrees and not one.agrees
    assert one.answers() == ("billing", "billing (abstains)")
    assert one.disagreement("t1") == {
        "id": "t1",
        "gold": "billing",
        "fast": "billing",
        "gold_margin": 0.2,
        "gold_abstained": False,
        "fast_abstained": True,
    }


def test_parity_says_in_one_line_when_mlx_lm_cannot_run_a_checkpoint(tied_pair, monkeypatch):
    """mlx-lm's Gemma 3 indexes its cache at layer 6: on a smaller checkpoint `parity` ended in
    a traceback after the transformers line, exit 1 (the code of a parity failure)."""
    from mlxbatch.bench import parity

    def crashes(*args):
        return [][5]  # what mlx-lm raised: IndexError

    monkeypatch.setattr(parity, "_mlx_lm_logits", crashes)
    hf, mlx = tied_pair
    r = invoke(["parity", hf, "--mlx", mlx])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "transformers" in r.stdout and "PASS" in r.stdout
    last = r.stderr.splitlines()[-1]  # (transformers' loading bar comes before it)
    assert last.startswith("error: parity: mlx-lm could not run the checkpoint (IndexError: ")
    assert "--no-mlx-lm compares with transformers alone" in r.stderr


def test_parity_says_in_one_line_when_transformers_cannot_run_a_checkpoint(tied_pair, monkeypatch):
    """transformers' own crash (a Qwen2 config with sliding layers and no window; Gemma with a
    partial rotary factor) was a traceback, exit 1, where mlx-lm's is one line, exit 2; the
    mlx-lm comparison still runs and is printed."""
    from mlxbatch.bench import parity

    def crashes(*args):
        raise TypeError("unsupported operand type(s) for -: 'NoneType' and 'int'")

    monkeypatch.setattr(parity, "hf_logits", crashes)
    hf, mlx = tied_pair
    r = invoke(["parity", hf, "--mlx", mlx])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "mlx-lm" in r.stdout and "PASS" in r.stdout
    last = r.stderr.splitlines()[-1]
    assert last.startswith("error: parity: transformers could not run the checkpoint (TypeError: ")
    assert "--no-mlx-lm" not in last
