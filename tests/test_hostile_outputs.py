"""Hostile outputs that a table row cannot express: another run's journal or lock, a stream
behind a link, links to files, file modes, a journal edited by hand or cut short."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mlxbatch.io.sinks import Journal
from tests.test_hostile import GOOD, invoke, rows_of, write


def classify(model, src, out, *extra, cwd):
    return invoke(["classify", src, "--model", model, "-o", out, *extra], None, cwd)


def interrupted_journal(model, tmp_path, monkeypatch, data=GOOD + "{nope\n") -> Path:
    """An interrupted run's journal holding the bad row's error line; returns -o."""
    from mlxbatch.engine.engine import Engine

    def interrupt(self, *a, **k):
        raise KeyboardInterrupt
        yield

    src, out = write(tmp_path / "in.jsonl", data), tmp_path / "o.jsonl"
    with monkeypatch.context() as m:
        m.setattr(Engine, "run", interrupt)
        r = classify(model, src, out, "--on-error", "skip", cwd=tmp_path)
    assert r.exit_code == 130 and (tmp_path / "o.jsonl.part").is_file(), r.output
    return out


def test_a_finished_run_removes_only_its_own_journal(tmp_path):
    out = tmp_path / "o.jsonl"
    first = Journal(out, {"fingerprint": "a", "settings": {}}, False)
    os.unlink(tmp_path / "o.jsonl.part")  # deleted by hand while running...
    second = Journal(out, {"fingerprint": "b", "settings": {}}, False)  # ...and a rerun began
    first.append([(0, {"id": "x", "error": "bad"})])
    first.finish(1, ("a", "b"))
    assert (tmp_path / "o.jsonl.part").read_text().startswith('{"mlxbatch_journal"')
    second.close()


def test_an_output_locked_by_another_process_is_refused(tiny_model_dir, tmp_path):
    out = write(tmp_path / "busy.jsonl", "theirs\n")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys\n"
            f"fd = os.open({str(out)!r}, os.O_RDWR)\nfcntl.lockf(fd, fcntl.LOCK_EX)\n"
            "print('ready', flush=True)\nsys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        src = write(tmp_path / "in.jsonl", GOOD)
        r = classify(tiny_model_dir, src, out, cwd=tmp_path)
        assert r.exit_code == 2 and f"locked by another process (pid {holder.pid})" in r.stderr
        assert out.read_text() == "theirs\n"
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("option", ["-o", "--json"])
def test_a_link_to_this_process_stdout_is_written_straight(tiny_model_dir, tmp_path, option):
    """/dev/stdout into a shell redirect (here a link to /proc/self/fd/1, which is what
    /dev/stdout is, so that a regression cannot replace the machine's /dev/stdout)."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    redirect = write(tmp_path / "redirect.txt", "kept\n")
    src = write(tmp_path / "in.jsonl", GOOD.replace("}", ', "gold": "billing"}'))
    args = ["-o", link] if option == "-o" else ["--gold-field", "gold", "--json", link]
    with open(redirect, "a") as f:  # a `>>` redirect: what the file held is kept
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "mlxbatch",
                "classify",
                str(src),
                "--model",
                str(tiny_model_dir),
                *map(str, args),
            ],
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    text = redirect.read_text()
    assert text.startswith("kept\n") and len(text.splitlines()) > 2
    if option == "--json":
        assert "accuracy" in text
    assert not list(tmp_path.glob("*.part")) and not list(Path("/proc/self/fd").glob("*.part"))


def test_a_link_to_a_file_writes_its_target(tiny_model_dir, tmp_path):
    (tmp_path / "real").mkdir()
    target = write(tmp_path / "real/out.jsonl", "old\n")
    link = tmp_path / "out.jsonl"
    link.symlink_to(target)
    r = classify(tiny_model_dir, write(tmp_path / "in.jsonl", GOOD), link, cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and len(rows_of(target)) == 2
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["out.jsonl"]


def test_modes_follow_the_umask_and_an_existing_file_keeps_its_own(tiny_model_dir, tmp_path):
    src = write(tmp_path / "in.jsonl", GOOD.replace("}", ', "gold": "billing"}'))
    old = os.umask(0o077)
    try:
        r = classify(
            tiny_model_dir,
            src,
            tmp_path / "new.jsonl",
            "--gold-field",
            "gold",
            "--json",
            tmp_path / "new.json",
            cwd=tmp_path,
        )
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.output
    for name in ("new.jsonl", "new.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    kept = write(tmp_path / "kept.jsonl", "old\n")
    kept.chmod(0o640)
    assert classify(tiny_model_dir, src, kept, cwd=tmp_path).exit_code == 0
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and len(rows_of(kept)) == 2


@pytest.mark.parametrize(
    "line",
    [
        '{"row": 0, "result": 5}',
        '{"row": -1, "result": {"id": "a", "error": "x"}}',
        '{"row": 0, "result": {"id": "a", "label": "nope", "scores": {"billing": 1.0, "technical": 0.0}}}',
        '{"row": "0", "result": {"id": "a", "error": "x"}}',
        '{"row": 2, "result": {"id": "c", "error": "again"}}',
    ],
)
def test_a_journal_edited_by_hand_is_refused_by_line(tiny_model_dir, tmp_path, monkeypatch, line):
    out = interrupted_journal(tiny_model_dir, tmp_path, monkeypatch)
    part = tmp_path / "o.jsonl.part"
    before = part.read_text() + line + "\n"
    part.write_text(before)
    r = classify(
        tiny_model_dir, tmp_path / "in.jsonl", out, "--on-error", "skip", "--resume", cwd=tmp_path
    )
    assert r.exit_code == 2 and "line 3" in r.stderr and "Traceback" not in r.output, r.output
    assert part.read_text() == before and not out.exists()


def test_a_journal_cut_short_by_a_full_disk_starts_over(tiny_model_dir, tmp_path, monkeypatch):
    out = interrupted_journal(tiny_model_dir, tmp_path, monkeypatch)
    part = tmp_path / "o.jsonl.part"
    for content in ("", '{"mlxbatch_journal": 1, "finger'):
        for extra in ([], ["--resume"]):
            part.write_text(content)
            r = classify(
                tiny_model_dir,
                tmp_path / "in.jsonl",
                out,
                "--on-error",
                "skip",
                *extra,
                cwd=tmp_path,
            )
            assert r.exit_code == 0, r.output
            assert len(rows_of(out)) == 3 and not part.exists()
            out.unlink()


def test_resume_keeps_zero_blocks_out(tiny_model_dir, tmp_path, monkeypatch):
    out = interrupted_journal(tiny_model_dir, tmp_path, monkeypatch)
    part = tmp_path / "o.jsonl.part"
    part.write_bytes(part.read_bytes() + b"\0" * 100 + b"\n")  # blocks a crash left unwritten
    r = classify(
        tiny_model_dir, tmp_path / "in.jsonl", out, "--on-error", "skip", "--resume", cwd=tmp_path
    )
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()][:2] == ["a", "b"]


def test_resume_names_the_part_that_differs(tiny_model_dir, tmp_path, monkeypatch):
    """Weights replaced under an unchanged manifest (size and mtime kept by `cp -p`-like
    copying) mixed two models' rows; the weights are now sampled, and the refusal names them."""
    import shutil

    from mlxbatch.model.convert import init_random

    model, other = tmp_path / "model", tmp_path / "other"
    shutil.copytree(tiny_model_dir, model)
    init_random(other, preset="tiny", seed=1, dtype="float32")
    monkeypatch.chdir(tmp_path)
    out = interrupted_journal(model, tmp_path, monkeypatch)
    weights = model / "model.safetensors"
    st = weights.stat()
    shutil.copyfile(other / "model.safetensors", weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.stat().st_size == st.st_size
    src = tmp_path / "in.jsonl"
    r = classify(model, src, out, "--on-error", "skip", "--resume", cwd=tmp_path)
    assert r.exit_code == 2 and "the model's model.safetensors changed" in r.stderr, r.output
    shutil.copyfile(tiny_model_dir / "model.safetensors", weights)  # the first model back
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = classify(
        model, src, out, "--on-error", "skip", "--resume", "--system-prompt", "Sort.", cwd=tmp_path
    )
    assert r.exit_code == 2 and "different system prompt or examples;" in r.stderr, r.output
    assert classify(model, src, out, "--on-error", "skip", "--resume", cwd=tmp_path).exit_code == 0


def test_eval_counts_predictions_outside_the_label_set(tiny_model_dir, tmp_path):
    """--labels with a subset of the predicted labels dropped the others from the matrix
    (accuracy 66.7% beside a macro-F1 of 1.000)."""
    gold = write(
        tmp_path / "g.jsonl",
        "".join(
            f'{{"id": "{i}", "text": "x", "gold": "{g}"}}\n'
            for i, g in enumerate(["billing", "technical", "billing"])
        ),
    )
    pred = write(
        tmp_path / "p.jsonl",
        "".join(  # each label its row's top score, as classify's
            json.dumps(
                {
                    "id": str(i),
                    "label": p,
                    "scores": {
                        k: 0.5 if k == p else 0.25 for k in ("billing", "technical", "account")
                    },
                }
            )
            + "\n"
            for i, p in enumerate(["billing", "technical", "account"])
        ),
    )
    r = invoke(
        [
            "eval",
            gold,
            pred,
            "--gold-field",
            "gold",
            "--labels",
            "billing,technical",
            "--json",
            tmp_path / "m.json",
        ],
        None,
        tmp_path,
    )
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["accuracy"] == pytest.approx(2 / 3) and m["per_class"]["billing"]["recall"] == 0.5
    assert m["macro_f1"] == pytest.approx((2 / 3 + 1) / 2)
    assert m["confusion"]["matrix"] == [[1, 0, 1], [0, 1, 0]] and "'account'" in r.stdout


def test_plot_without_matplotlib_is_refused_before_computing(tiny_model_dir, tmp_path, monkeypatch):
    import importlib.util

    from mlxbatch.engine.engine import Engine

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    monkeypatch.setattr(Engine, "run", lambda *a, **k: pytest.fail("computed before refusing"))
    src = write(tmp_path / "in.jsonl", GOOD.replace("}", ', "gold": "billing"}'))
    r = classify(
        tiny_model_dir, src, tmp_path / "o.jsonl", "--gold-field", "gold", "--plot", cwd=tmp_path
    )
    assert r.exit_code == 2 and "--plot needs matplotlib" in r.stderr, r.output


def test_a_plot_of_many_labels_is_capped(tmp_path):
    from mlxbatch.api.evaluate import evaluate, plot_confusion

    labels = [f"label {i}" for i in range(120)]
    m = evaluate(labels[1:] + labels[:1], labels, labels)
    plot_confusion(m, tmp_path / "c.png")
    header = (tmp_path / "c.png").read_bytes()[16:24]
    width, height = int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")
    assert 0 < width <= 4800 and 0 < height <= 4800


def test_sigterm_keeps_the_journal_and_prints_the_resume_hint(tiny_model_dir, tmp_path):
    import os
    import signal

    from mlxbatch.runtime.testhold import VARIABLE

    src = write(
        tmp_path / "in.txt", "".join(f"ticket {i} was charged twice\n" for i in range(20000))
    )
    out, part = tmp_path / "o.jsonl", tmp_path / "o.jsonl.part"
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlxbatch",
            "classify",
            str(src),
            "--model",
            str(tiny_model_dir),
            "-o",
            str(out),
            "--max-batch",
            "8",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, VARIABLE: "1"},
    )
    seen = []  # the job holds for good after its first journaled batch: it cannot finish first
    for line in job.stderr:
        seen.append(line)
        if f"({VARIABLE})" in line:
            break
    else:
        raise AssertionError(f"the job ended (exit {job.wait()}) before its hold point: {seen}")
    assert part.read_text().count("\n") > 2, seen
    job.send_signal(signal.SIGTERM)
    err = "".join(seen) + job.communicate(timeout=300)[1]
    assert job.returncode == 143, err
    assert "--resume" in err and "Traceback" not in err and part.exists() and not out.exists()
    r = invoke(
        ["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", 8, "--resume"],
        None,
        tmp_path,
    )
    assert r.exit_code == 0, r.output
    assert len(rows_of(out)) == 20000


def test_models_marks_a_broken_directory(tiny_model_dir, tmp_path, monkeypatch):
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "w/good")
    shutil.copytree(tiny_model_dir, tmp_path / "w/bad")
    cfg = json.loads((tmp_path / "w/bad/config.json").read_text()) | {"num_hidden_layers": 10**9}
    (tmp_path / "w/bad/config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("MLXBATCH_WEIGHTS", str(tmp_path / "w"))
    r = invoke(["models", "--json"], None, tmp_path)
    assert r.exit_code == 0, r.output
    found = {m["name"]: m["broken"] for m in json.loads(r.stdout)}
    assert found["good"] is None and "num_hidden_layers" in found["bad"]


@pytest.mark.parametrize(
    ("edit", "listed"),
    [
        ({"model_type": ["qwen2"]}, None),  # a TypeError (unhashable) took the listing down
        ({"quantization": {"group_size": 64}}, "quantization"),  # a KeyError ('bits')
        ({"quantization": {"bits": -4, "group_size": 64}}, "-4 bits"),  # were listed runnable
        ({"quantization": {"bits": 4, "group_size": 0}}, "group_size 0"),  # (0: SIGFPE in MLX)
    ],
)
def test_one_bad_config_does_not_take_the_model_listing_down(
    tiny_model_dir, tmp_path, monkeypatch, edit, listed
):
    """`mlxbatch models` lists the rest when one directory's config.json has a list for
    model_type or a quantization without bits (no traceback, exit 0)."""
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "w/good")
    shutil.copytree(tiny_model_dir, tmp_path / "w/bad")
    cfg = json.loads((tmp_path / "w/bad/config.json").read_text()) | edit
    (tmp_path / "w/bad/config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("MLXBATCH_WEIGHTS", str(tmp_path / "w"))
    r = invoke(["models", "--json"], None, tmp_path)
    assert r.exit_code == 0, r.output
    found = {m["name"]: m["broken"] for m in json.loads(r.stdout)}
    assert found["good"] is None
    if listed is None:
        assert "bad" not in found  # not a model of a family mlxbatch runs
    else:
        assert listed in found["bad"], found
    assert invoke(["models"], None, tmp_path).exit_code == 0


@pytest.mark.parametrize("target", ["model.safetensors", "tokenizer.json", "notes.txt"])
@pytest.mark.parametrize("command", ["classify", "tickets"])
def test_a_link_onto_a_file_no_output_is_named_is_refused(
    tiny_model_dir, tmp_path, command, target
):
    """`-o out.jsonl`, a link onto another model's model.safetensors (or its tokenizer.json, or
    a notes.txt), is refused: the link's target is judged, not only its name."""
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "other")
    victim = tmp_path / "other" / target
    if not victim.exists():
        write(victim, "my notes\n")
    before = victim.read_bytes()
    link = tmp_path / "out.jsonl"
    link.symlink_to(victim)
    if command == "classify":
        r = classify(tiny_model_dir, write(tmp_path / "in.jsonl", GOOD), link, cwd=tmp_path)
    else:
        r = invoke(["tickets", "3", "-o", link], None, tmp_path)
    assert r.exit_code == 2, r.output
    assert f"links to {victim}" in r.output and "Traceback" not in r.output
    assert victim.read_bytes() == before and link.is_symlink()


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "eval.json"])
def test_json_never_replaces_a_file_of_a_model(tiny_model_dir, tmp_path, name):
    """`eval ... --json other/config.json` never replaces another model's config (it begins
    with "{", as a report does): a model's JSON files, and any file beside its config and
    weights, are not reports."""
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "other")
    path = tmp_path / "other" / name
    if not path.exists():
        write(path, "{}\n")
    before = path.read_bytes()
    src = write(tmp_path / "in.jsonl", GOOD.replace('"}', '", "intent": "billing"}'))
    preds = tmp_path / "preds.jsonl"
    assert classify(tiny_model_dir, src, preds, cwd=tmp_path).exit_code == 0
    r = invoke(["eval", src, preds, "--gold-field", "intent", "--json", path], None, tmp_path)
    assert r.exit_code == 2 and "a file of a model" in r.output, r.output
    assert path.read_bytes() == before
    r = invoke(
        ["eval", src, preds, "--gold-field", "intent", "--json", tmp_path / "e.json"],
        None,
        tmp_path,
    )
    assert r.exit_code == 0, r.output
    r = invoke(
        ["eval", src, preds, "--gold-field", "intent", "--json", tmp_path / "e.json"],
        None,
        tmp_path,
    )
    assert r.exit_code == 0, r.output  # a report is replaced by the next one


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (",,", "empty label"),
        ("billing,billing", "duplicate label(s): 'billing'"),
        ("billing", "at least two labels"),
        (" ,billing", "empty label"),
    ],
)
def test_eval_takes_labels_as_classify_does(tiny_model_dir, tmp_path, labels, message):
    """`eval --labels` is checked as classify's: ",,", a label twice or one label is refused.
    (Labels the predictions score outside the set are counted:
    test_eval_counts_predictions_outside_the_label_set.)"""
    src = write(tmp_path / "in.jsonl", GOOD.replace('"}', '", "intent": "billing"}'))
    preds = tmp_path / "preds.jsonl"
    r = classify(tiny_model_dir, src, preds, "--labels", "billing,technical", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    r = invoke(["eval", src, preds, "--gold-field", "intent", "--labels", labels], None, tmp_path)
    assert r.exit_code == 2 and message in r.output and len(r.output.splitlines()) == 1, r.output
    r = invoke(
        ["eval", src, preds, "--gold-field", "intent", "--labels", "technical, billing"],
        None,
        tmp_path,
    )
    assert r.exit_code == 0 and "accuracy" in r.output, r.output  # another order: its table's
