"""Round ten: what this stop's hostile passes found, each with the case that found it:
`--json -` wrote a file named "-"."""

from __future__ import annotations

import json
import subprocess
import sys

from cli_run import invoke, one_line_error


def _rows(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"ticket {i}", "gold": ["spam", "ham"][i % 2]})
                           + "\n" for i in range(6)))  # fmt: skip
    return src


def _mlxbatch(args, cwd):
    return subprocess.run([sys.executable, "-m", "mlxbatch", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_json_dash_is_standard_output_and_the_text_report_moves_to_stderr(tiny_model_dir,
                                                                         tmp_path):  # fmt: skip
    """`--json -` wrote the report to a file named "-" in the working directory (`-o -` is
    standard output); now it is standard output, whole, and the evaluation's table for people
    goes to standard error, so that `| jq` reads JSON alone."""
    src, out = _rows(tmp_path), tmp_path / "rows.jsonl"
    job = ["classify", src, "--model", tiny_model_dir, "--labels", "spam,ham", "--gold-field",
           "gold"]  # fmt: skip
    r = _mlxbatch([*job, "-o", out, "--json", "-"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["evaluated"] == 6 and "accuracy" in r.stderr
    r = _mlxbatch(["eval", src, out, "--gold-field", "gold", "--json", "-"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["evaluated"] == 6 and "precision" in r.stderr
    assert not (tmp_path / "-").exists()


def test_json_to_the_standard_output_the_rows_take_is_refused(tiny_model_dir, tmp_path):
    """Without -o the rows are standard output: the report appended to them made the JSONL
    unreadable from its last row on."""
    src = _rows(tmp_path)
    for given in ("-", "/dev/stdout"):
        r = invoke(["classify", src, "--model", tiny_model_dir, "--labels", "spam,ham",
                    "--gold-field", "gold", "--json", given], tmp_path)  # fmt: skip
        one_line_error(r, "--json", "standard output holds the rows")
        assert not r.stdout
