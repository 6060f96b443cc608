"""Round ten: what this stop's hostile passes found, each with the case that found it:
`--json -` wrote a file named "-", a redirect appended the rows to the input, `tickets`
replaced another run's input. (The service's: tests/test_serve_hostile.py.)"""

from __future__ import annotations

import json
import os
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


def test_standard_output_redirected_onto_the_input_is_refused(tiny_model_dir, tmp_path):
    """`classify v.jsonl >> v.jsonl` appended the rows to the input it was reading (exit 0; in
    windows, rows written before "changed while the job read it"); `-o /dev/stdout` there was
    refused. Standard input read from the same file is refused too."""
    src = _rows(tmp_path)
    before = src.read_bytes()
    job = [sys.executable, "-m", "mlxbatch", "classify", "--model", str(tiny_model_dir),
           "--labels", "spam,ham"]  # fmt: skip
    for args, stdin in (([str(src)], None), (["-"], src)):
        with src.open("ab") as out, stdin.open("rb") if stdin else open(os.devnull) as inp:
            r = subprocess.run(job + args, stdout=out, stdin=inp, stderr=subprocess.PIPE,
                               text=True, timeout=300)  # fmt: skip
        assert r.returncode == 2, r.stderr
        first = r.stderr.splitlines()[0]
        assert first.startswith("error: standard output is the input file"), r.stderr
        assert src.name in first and src.read_bytes() == before
    other = tmp_path / "rows.jsonl"
    with other.open("wb") as out:
        r = subprocess.run(job + [str(src)], stdout=out, stderr=subprocess.PIPE, text=True,
                           timeout=300)  # fmt: skip
    assert r.returncode == 0 and len(other.read_text().splitlines()) == 6, r.stderr


def test_tickets_does_not_replace_a_file_another_run_reads(tmp_path):
    """`tickets 5 -o in.jsonl` replaced the input of a running classify (which then failed:
    "changed while the job read it"); classify's own -o refuses that file."""
    from mlxbatch.io.inputs import open_rows

    src = _rows(tmp_path)
    before = src.read_bytes()
    with open_rows(str(src)) as reading:  # another run, reading it as its input
        r = invoke(["tickets", "5", "-o", src], tmp_path)
        one_line_error(r, "is being read by another mlxbatch run")
        next(iter(reading))
    assert src.read_bytes() == before
    assert invoke(["tickets", "5", "-o", src], tmp_path).exit_code == 0  # once it is done
    assert len(src.read_text().splitlines()) == 5
