"""What a run tells its user besides the rows: a model of random weights named once per load
in Python (the CLI names it on its own lines), and where a file job wrote its rows."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
from cli_run import invoke

from mlxbatch import Classifier
from mlxbatch.errors import SyntheticWeights


def test_loading_random_weights_warns_a_python_caller(tiny_model_dir):
    with pytest.warns(SyntheticWeights, match="SYNTHETIC random weights") as caught:
        Classifier.load(tiny_model_dir, labels=["spam", "ham"])
    assert len(caught) == 1 and str(tiny_model_dir.resolve()) in str(caught[0].message)


def test_loading_a_converted_checkpoint_warns_of_nothing(tied_pair):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SyntheticWeights)
        Classifier.load(tied_pair[1], labels=["spam", "ham"])


def test_the_command_line_names_random_weights_without_a_python_warning(tiny_model_dir, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "hello"}) + "\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxbatch",
            "classify",
            str(src),
            "--model",
            str(tiny_model_dir),
            "--labels",
            "spam,ham",
            "-o",
            str(tmp_path / "o.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "SYNTHETIC" in r.stderr and "SyntheticWeights" not in r.stderr, r.stderr


def test_a_file_job_names_its_output_and_standard_output_needs_no_name(tiny_model_dir, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("a", "b")))
    out = tmp_path / "rows.jsonl"
    r = invoke(["classify", src, "--model", tiny_model_dir, "--labels", "spam,ham", "-o", out])
    assert r.exit_code == 0 and f"output: {out}" in r.stderr.splitlines(), r.output
    r = invoke(["classify", src, "--model", tiny_model_dir, "--labels", "spam,ham"])
    assert r.exit_code == 0 and not any(x.startswith("output: ") for x in r.stderr.splitlines())
