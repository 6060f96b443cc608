"""Hostile command lines: absurd option values, help, progress lines, warnings printed only
where they matter."""

from __future__ import annotations

import pytest
from cli_run import invoke, one_line_error

GOOD = '{"id": "a", "text": "I was charged twice"}\n{"id": "b", "text": "the app crashes"}\n'


# nan and inf pass click's FloatRange (nan < 0 is false): --max-body-mb inf was a traceback,
# --max-wait-ms nan a classify request that never returned, --verify-sample nan a 500 on
# /v1/models; a window past sys.maxsize an islice traceback that left a journal behind.
ABSURD = [
    (["classify", "in.jsonl", "--collective-timeout", "nan"], "--collective-timeout"),
    (["classify", "in.jsonl", "--verify-sample", "nan"], "--verify-sample"),
    (["classify", "in.jsonl", "--min-confidence", "inf"], "--min-confidence"),
    (["classify", "in.jsonl", "--window-rows", "99999999999999999999"], "--window-rows"),
    (["serve", "--max-body-mb", "inf"], "--max-body-mb"),
    (["serve", "--max-body-mb", "nan"], "--max-body-mb"),
    (["serve", "--max-wait-ms", "nan"], "--max-wait-ms"),
    (["serve", "--max-wait-ms", "1e300"], "--max-wait-ms"),
    (["serve", "--timeout-header", "nan"], "--timeout-header"),
    (["serve", "--timeout-body", "inf"], "--timeout-body"),
    (["serve", "--timeout-keep-alive", "nan"], "--timeout-keep-alive"),
    (["serve", "--drain-timeout", "nan"], "--drain-timeout"),
    (["serve", "--verify-sample", "nan"], "--verify-sample"),
]


def test_the_blas_warning_is_for_commands_that_compute(tiny_model_dir, tmp_path, monkeypatch):
    from mlxbatch.runtime import blas

    monkeypatch.setattr(blas, "warning", lambda: "warning: the reference BLAS (test)")
    for args in (
        ["--help"],
        ["--version"],
        ["classify", "--help"],
        ["models"],
        ["eval", "--help"],
        ["tickets", "3", "-o", tmp_path / "t.jsonl"],
    ):
        r = invoke(args, tmp_path, obj={"warn_blas": True})  # as `main` runs it
        assert r.exit_code == 0 and "reference BLAS" not in r.stderr, (args, r.output)
    src = tmp_path / "in.jsonl"
    src.write_text(GOOD)
    r = invoke(["classify", src, "--model", tiny_model_dir], tmp_path, obj={"warn_blas": True})
    assert r.exit_code == 0 and r.stderr.startswith("warning: the reference BLAS (test)")


def test_classify_help_names_every_output_format(tmp_path):
    text = " ".join(invoke(["classify", "--help"], tmp_path).stdout.split())
    assert "Output file: .jsonl, .csv or .tsv, each optionally .gz" in text


def test_progress_off_a_terminal_is_a_line_every_few_seconds(monkeypatch, capsys):
    from mlxbatch.runtime import progress

    clock = iter([0.0, 4.0, 11.0, 12.0, 25.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    bar = progress.bar(100, "classify", 0, lines_every=10.0)  # capsys: stderr is no terminal
    for _ in range(4):
        bar.update(10)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "classify: 20/100 items, 0:11 elapsed, ETA 0:44",
        "classify: 40/100 items, 0:25 elapsed, ETA 0:38",
    ]
    assert not isinstance(progress.bar(5, "x"), progress.Lines)  # only where asked for


def test_the_demo_asks_for_progress_lines(tiny_model_dir, tmp_path, monkeypatch):
    from mlxbatch.bench import demo

    seen = []

    def fake_run_job(clf, rows, spec, *a, **k):
        seen.append(spec.progress_every)
        raise SystemExit(0)

    monkeypatch.setattr(demo, "run_job", fake_run_job)
    try:
        demo.run_demo(4, tiny_model_dir, tmp_path)
    except SystemExit:
        pass
    assert seen and 0 < seen[0] <= 10


@pytest.mark.parametrize("args,option", ABSURD, ids=[" ".join(a[0][-2:]) for a in ABSURD])
def test_an_absurd_option_value_is_one_line(args, option, tmp_path):
    (tmp_path / "in.jsonl").write_text(GOOD)
    r = invoke([*args, "-o", "out.jsonl"] if args[0] == "classify" else args, tmp_path)
    one_line_error(r, option)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no journal left
