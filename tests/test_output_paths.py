"""Where a run writes, under hostile paths: files other runs read, standard output and pipes
that close or loop back onto the input, folders, /proc, reports and --force."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_run import invoke, one_line_error
from click.testing import CliRunner

from mlxbatch.bench.workload import generate, write_jsonl
from mlxbatch.cli import cli
from mlxbatch.io.inputs import open_rows
from mlxbatch.io.sinks import journal_path

GOOD = '{"id": "a", "text": "I was charged twice"}\n{"id": "b", "text": "the app crashes"}\n'


def _rows(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(
            json.dumps({"text": f"ticket {i}", "gold": ["spam", "ham"][i % 2]}) + "\n"
            for i in range(6)
        )
    )
    return src


def _mlxbatch(args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "mlxbatch", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def invoke_raising(*args, cwd=None):
    old = os.getcwd()
    if cwd:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)


def test_an_output_another_run_reads_is_not_replaced(tiny_model_dir, tmp_path):
    src, other = tmp_path / "in.jsonl", tmp_path / "other.jsonl"
    src.write_text(GOOD)
    other.write_text(GOOD)
    with open_rows(str(other)) as reading:  # another run, reading it as its input
        r = invoke(["classify", src, "--model", tiny_model_dir, "-o", other], tmp_path)
        one_line_error(r, "is being read by another mlxbatch run")
        next(iter(reading))
    assert other.read_text() == GOOD
    r = invoke(["classify", src, "--model", tiny_model_dir, "-o", other], tmp_path)
    assert r.exit_code == 0, r.output  # once it is done


def test_a_run_that_starts_reading_the_output_mid_job_is_not_stopped(
    tiny_model_dir, tmp_path, monkeypatch
):
    from mlxbatch.runtime import testhold

    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    src.write_text(GOOD * 1)
    out.write_text(GOOD)  # an earlier output, now someone's input
    held = []
    monkeypatch.setattr(testhold, "after_batch", lambda n: held.append(open_rows(str(out))))
    r = invoke(["classify", src, "--model", tiny_model_dir, "-o", out], tmp_path)
    one_line_error(r, "is being read by another mlxbatch run", "--resume")
    assert out.read_text() == GOOD and journal_path(out).exists()
    for stream in held:
        stream.close()
    monkeypatch.undo()
    r = invoke(["classify", src, "--model", tiny_model_dir, "-o", out, "--resume"], tmp_path)
    assert r.exit_code == 0 and len(out.read_text().splitlines()) == 2


def test_a_reader_gone_from_stdout_ends_the_run_quietly_with_141(tiny_model_dir, tmp_path):
    import subprocess
    import sys

    src = tmp_path / "in.jsonl"
    src.write_text(GOOD * 1)
    cmd = [sys.executable, "-m", "mlxbatch", "classify", str(src), "--model", str(tiny_model_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # `| head -0`: gone before the first row
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "error" not in err.lower(), err


def test_a_relative_xdg_cache_home_is_ignored(monkeypatch, tmp_path):
    """XDG_CACHE_HOME=relative/dir is ignored, as the XDG spec says, not a cache under the
    folder the run started from."""
    from mlxbatch.runtime.files import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")
    assert cache_dir() == tmp_path / ".cache" / "mlxbatch"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "abs"))
    assert cache_dir() == tmp_path / "abs" / "mlxbatch"


@pytest.mark.parametrize(
    "option, path", [("-o", "/proc/mlxbatch-new.jsonl"), ("--json", "/sys/mlxbatch-new.json")]
)
def test_a_new_file_under_proc_or_sys_is_refused_before_the_model_loads(option, path, tmp_path):
    # as root the folder's access check passed: the journal failed once the input was scanned
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "hello", "g": "billing"}\n')
    extra = ["-o", tmp_path / "o.jsonl", "--gold-field", "g"] if option == "--json" else []
    r = invoke(["classify", src, "--model", tmp_path / "no-model", option, path, *extra], tmp_path)
    one_line_error(r, option, "holds no new files", alone=True)


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
        return subprocess.run(
            args, capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.close(closed)
        )

    r = run(cmd, 1)
    assert r.returncode == 2 and "standard output is closed" in r.stderr, r.stderr
    r = run([*cmd, "-o", "/dev/stdout"], 1)  # fd 1 is /dev/null by then: rows lost, exit 0
    assert r.returncode == 2 and "-o /dev/stdout: standard output is closed" in r.stderr
    for printing in (["models"], ["--help"]):  # a listing printed into nothing, exit 0
        r = run([sys.executable, "-m", "mlxbatch", *printing], 1)
        assert r.returncode == 2 and r.stderr.startswith("error: standard output is closed")
        assert len(r.stderr.splitlines()) == 1, r.stderr
    out = tmp_path / "o.jsonl"
    r = run([*cmd, "-o", str(out)], 2)
    assert r.returncode == 0 and out.read_text().count("\n") == 1
    assert not (tmp_path / "o.jsonl.part").exists()
    r = run([*cmd[:4], "-", *cmd[5:], "-o", "-"], 0)
    assert r.returncode == 2 and "-: standard input is closed (<&-)" in r.stderr, r.stderr


def test_a_report_into_a_pipe_its_reader_left_is_a_broken_pipe(tmp_path):
    """`eval ... --json /dev/stdout | head -c 10` exited 2 ("cannot write (Broken pipe)"),
    where rows into such a pipe exit 141, as a shell reports a tool its pipe stopped."""
    import os

    import pytest

    from mlxbatch.io.outputs import write_json_report

    read, write = os.pipe()
    os.close(read)
    try:
        with pytest.raises(BrokenPipeError):
            write_json_report(f"/proc/self/fd/{write}", {"accuracy": 1.0})
    finally:
        os.close(write)


def test_an_output_named_as_a_folder_is_refused(tiny_model_dir, tmp_path):
    """`-o newdir/` (no such folder) wrote a regular file named newdir and exited 0."""
    from cli_run import one_line_error

    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    r = invoke(["classify", src, "--model", tiny_model_dir, "-o", f"{tmp_path}/newdir/"])
    one_line_error(r, "names a folder", alone=True)
    r = invoke(["tickets", "3", "-o", f"{tmp_path}/newdir/"])
    one_line_error(r, "names a folder", alone=True)
    assert not (tmp_path / "newdir").exists()


def test_json_dash_is_standard_output_and_the_text_report_moves_to_stderr(tiny_model_dir, tmp_path):
    """`--json -` wrote the report to a file named "-" in the working directory (`-o -` is
    standard output); now it is standard output, whole, and the evaluation's table for people
    goes to standard error, so that `| jq` reads JSON alone."""
    src, out = _rows(tmp_path), tmp_path / "rows.jsonl"
    job = [
        "classify",
        src,
        "--model",
        tiny_model_dir,
        "--labels",
        "spam,ham",
        "--gold-field",
        "gold",
    ]
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
        r = invoke(
            [
                "classify",
                src,
                "--model",
                tiny_model_dir,
                "--labels",
                "spam,ham",
                "--gold-field",
                "gold",
                "--json",
                given,
            ],
            tmp_path,
        )
        one_line_error(r, "--json", "standard output holds the rows")
        assert not r.stdout


def test_standard_output_redirected_onto_the_input_is_refused(tiny_model_dir, tmp_path):
    """`classify v.jsonl >> v.jsonl` appended the rows to the input it was reading (exit 0; in
    windows, rows written before "changed while the job read it"); `-o /dev/stdout` there was
    refused. Standard input read from the same file is refused too."""
    src = _rows(tmp_path)
    before = src.read_bytes()
    job = [
        sys.executable,
        "-m",
        "mlxbatch",
        "classify",
        "--model",
        str(tiny_model_dir),
        "--labels",
        "spam,ham",
    ]
    for args, stdin in (([str(src)], None), (["-"], src)):
        with src.open("ab") as out, stdin.open("rb") if stdin else open(os.devnull) as inp:
            r = subprocess.run(
                job + args, stdout=out, stdin=inp, stderr=subprocess.PIPE, text=True, timeout=300
            )
        assert r.returncode == 2, r.stderr
        first = r.stderr.splitlines()[0]
        assert first.startswith("error: standard output is the input file"), r.stderr
        assert src.name in first and src.read_bytes() == before
    other = tmp_path / "rows.jsonl"
    with other.open("wb") as out:
        r = subprocess.run(
            job + [str(src)], stdout=out, stderr=subprocess.PIPE, text=True, timeout=300
        )
    assert r.returncode == 0 and len(other.read_text().splitlines()) == 6, r.stderr
    # both streams on one device (a terminal, /dev/null) write into nothing that is read: the
    # first cut of this check refused them (samefile of /dev/stdout and /dev/stdin)
    r = subprocess.run(
        job + ["-"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "empty input" in r.stderr and "standard output" not in r.stderr


def test_json_dash_into_a_socket_is_written_to_the_open_stream(tiny_model_dir, tmp_path):
    """`--json -` opened /dev/stdout again, which Linux refuses on a socket (ENXIO), after the
    whole job had run."""
    import socket

    src, out = _rows(tmp_path), tmp_path / "rows.jsonl"
    assert (
        invoke(
            ["classify", src, "--model", tiny_model_dir, "--labels", "spam,ham", "-o", out],
            tmp_path,
        ).exit_code
        == 0
    )
    ours, theirs = socket.socketpair()
    with ours, theirs:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "mlxbatch",
                "eval",
                str(src),
                str(out),
                "--gold-field",
                "gold",
                "--json",
                "-",
            ],
            stdout=theirs,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
        theirs.close()
        got = b""
        while data := ours.recv(65536):
            got += data
    assert r.returncode == 0, r.stderr
    assert json.loads(got)["evaluated"] == 6


def test_a_report_never_replaces_a_file_that_is_not_a_report(tiny_model_dir, tmp_path):
    """eval --plot/--json through a link onto model weights, or onto any file of another kind."""
    src, preds = tmp_path / "t.jsonl", tmp_path / "p.jsonl"
    write_jsonl(generate(6, seed=1), src)
    assert invoke_raising("classify", src, "--model", tiny_model_dir, "-o", preds).exit_code == 0
    weights = tiny_model_dir / "model.safetensors"
    before = weights.read_bytes()
    (tmp_path / "pic.png").symlink_to(weights)
    (tmp_path / "notes.json").write_text("my notes, not JSON\n")
    for option, path in (("--plot", "pic.png"), ("--json", "notes.json")):
        r = invoke_raising("eval", src, preds, "--gold-field", "intent", option, tmp_path / path)
        assert r.exit_code == 2, r.output
        assert "will not replace" in r.output or "writes nothing there" in r.output
    assert weights.read_bytes() == before
    assert (tmp_path / "notes.json").read_text() == "my notes, not JSON\n"
    ok = invoke_raising("eval", src, preds, "--gold-field", "intent", "--json", tmp_path / "r.json")
    again = invoke_raising(
        "eval", src, preds, "--gold-field", "intent", "--json", tmp_path / "r.json"
    )
    assert ok.exit_code == again.exit_code == 0  # its own report is replaced


def test_force_replaces_only_a_model_directory_and_never_the_source(tiny_model_dir, tmp_path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "sub" / "thesis.txt").write_text("years of work")
    r = invoke_raising("init-random", "--preset", "tiny", "--force", docs)
    assert r.exit_code == 2 and "not a model" in r.output
    assert (docs / "sub" / "thesis.txt").read_text() == "years of work"
    box = tmp_path / "box"
    (box / "src").mkdir(parents=True)
    for f in tiny_model_dir.iterdir():
        if f.is_file():
            (box / "src" / f.name).write_bytes(f.read_bytes())
    (box / "notes.txt").write_text("keep")
    for out in (box, box / "src" / "inner"):  # a directory holding the source, or inside it
        r = invoke_raising("convert", box / "src", out, "--force")
        assert r.exit_code == 2 and "source checkpoint" in r.output, r.output
    assert (box / "notes.txt").exists() and (box / "src" / "config.json").exists()
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    r = invoke_raising("init-random", "--preset", "tiny", "--force", tmp_path / "link")
    assert r.exit_code == 2 and "is a link" in r.output and (tmp_path / "link").is_symlink()
    model = tmp_path / "m"
    assert invoke_raising("init-random", "--preset", "tiny", model).exit_code == 0
    assert invoke_raising("init-random", "--preset", "tiny", "--force", model).exit_code == 0
