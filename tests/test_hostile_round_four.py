"""Issue 27 ("round four"): inputs, outputs, the Python API and messages, each class with
the case that found it."""

from __future__ import annotations

from cli_run import invoke, one_line_error

from mlxbatch.io.inputs import open_rows
from mlxbatch.io.sinks import journal_path

GOOD = '{"id": "a", "text": "I was charged twice"}\n{"id": "b", "text": "the app crashes"}\n'


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


def test_the_default_model_is_the_first_runnable_one(tiny_model_dir, tmp_path, monkeypatch):
    import json
    import shutil

    from mlxbatch.model.defaults import default_model_dir, not_runnable

    weights = tmp_path / "w"
    (weights / "a-broken").mkdir(parents=True)
    shutil.copyfile(tiny_model_dir / "config.json", weights / "a-broken" / "config.json")
    good = shutil.copytree(tiny_model_dir, weights / "b-good")
    manifest = json.loads((good / "mlxbatch.json").read_text()) | {"synthetic": False}
    (good / "mlxbatch.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("MLXBATCH_WEIGHTS", str(weights))
    said = []
    assert default_model_dir(said.append) == good
    assert "passing over" in said[0] and "a-broken" in said[0] and "no *.safetensors" in said[0]
    assert said[1].startswith(f"default model (no --model given): {good}")  # not a 2nd "model:"
    assert not_runnable(weights / "a-broken") == "no *.safetensors weights"
    listed = invoke(["models", "--json"], tmp_path)  # the same check, in the listing
    broken = {m["name"]: m["broken"] for m in json.loads(listed.stdout)}
    assert broken.get("a-broken", "no *.safetensors weights") == "no *.safetensors weights"
    assert broken.get("b-good") is None
    r = invoke(["classify", "-", "--labels", "billing,technical"], tmp_path, input=GOOD)
    assert r.exit_code == 0 and "b-good" in r.stderr, r.output


def test_the_python_api_takes_only_what_it_can_use(tiny_model_dir):
    import pytest

    from mlxbatch import Classifier
    from mlxbatch.errors import UsageError

    labels = ["billing", "technical"]
    pairs = [("I was charged twice", "billing"), ("the app crashes", "technical")]
    listed = Classifier.load(tiny_model_dir, labels=labels, examples=pairs)
    streamed = Classifier.load(tiny_model_dir, labels=labels, examples=(p for p in pairs))
    assert streamed.examples == listed.examples == tuple(pairs)  # a generator, read once
    with pytest.raises(UsageError, match="examples: expected"):
        Classifier.load(tiny_model_dir, labels=labels, examples=5)
    for flag in ("no", 1, None):
        with pytest.raises(UsageError, match="truncate: expected True or False"):
            listed.classify(["hello"], truncate=flag)
    for empty in ("", "  \n"):
        with pytest.raises(UsageError, match=r"texts\[1\] is empty \(as classify refuses"):
            listed.classify(["hello", empty])
    assert listed.classify(["hello"], truncate=False)[0].label in labels


def test_a_classifier_in_a_forked_child_fails_instead_of_hanging(tiny_model_dir):
    import multiprocessing

    from mlxbatch import Classifier

    clf = Classifier.load(tiny_model_dir, labels=["billing", "technical"])
    clf.classify(["warm"])
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def child():
        try:
            clf.classify(["in the child"])
            queue.put("classified")
        except Exception as e:  # the refusal, sent back
            queue.put(str(e))

    proc = ctx.Process(target=child)
    proc.start()
    try:
        said = queue.get(timeout=120)
        proc.join(60)
        assert "forked child" in said and "spawn" in said, said
        assert proc.exitcode == 0  # the child ended, not hung in MLX or OpenBLAS
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


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


def test_peak_memory_is_never_negative(tiny_model_dir, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a"}\n{"id": "b", "text": "  "}\n')  # nothing to score
    r = invoke(["classify", src, "--model", tiny_model_dir, "--on-error", "skip", "-o",
                tmp_path / "o.jsonl"], tmp_path)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "(0 scored, 2 errors)" in r.stderr and "peak memory -" not in r.stderr, r.stderr


def test_the_blas_warning_is_for_commands_that_compute(tiny_model_dir, tmp_path, monkeypatch):
    from mlxbatch.runtime import blas

    monkeypatch.setattr(blas, "warning", lambda: "warning: the reference BLAS (test)")
    for args in (["--help"], ["--version"], ["classify", "--help"], ["models"], ["eval", "--help"],
                 ["tickets", "3", "-o", tmp_path / "t.jsonl"]):  # fmt: skip
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
    assert lines == ["classify: 20/100 items, 0:11 elapsed, ETA 0:44",
                     "classify: 40/100 items, 0:25 elapsed, ETA 0:38"]  # fmt: skip
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


def test_a_jobs_input_stays_locked_until_the_job_ends(tiny_model_dir, tmp_path, monkeypatch):
    """A hostile pass found: a one-window job read its input in its first seconds and then
    released it, so another run's -o could replace it while the job scored (its journal was
    then for an input that no longer existed). The input is held for the whole job."""
    from mlxbatch.io.sources import read_by_a_run
    from mlxbatch.runtime import testhold

    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    src.write_text("".join(f'{{"text": "ticket number {i}"}}\n' for i in range(8)))
    seen = []
    monkeypatch.setattr(testhold, "after_batch", lambda n: seen.append(read_by_a_run(src)))
    r = invoke(["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", "1"],
               tmp_path)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert seen and all(seen), seen  # every batch: another run's -o would be refused
    assert not read_by_a_run(src)  # released once the job is done


def test_the_python_api_refuses_odd_priors_flags_and_counts(tiny_model_dir):
    """A hostile pass found: a list as `prior` was an AttributeError, "0.5" or True as a
    weight passed as 0.5 and 1, `calibrate="no"` calibrated, `max_batch=None` was a TypeError
    deep in the planner, and NumPy's integers were refused as not whole numbers."""
    import numpy as np
    import pytest

    from mlxbatch import Classifier
    from mlxbatch.errors import UsageError

    for prior, words in (([0.5, 0.5], "prior: expected {label: weight}"),
                         ({"a": "0.5", "b": 0.5}, "prior['a']: expected a number, got str"),
                         ({"a": True, "b": 0.5}, "prior['a']: expected a number, got bool")):  # fmt: skip
        with pytest.raises(UsageError, match=words.replace("[", r"\[").replace("{", r"\{")):
            Classifier.load(tiny_model_dir, labels=["a", "b"], prior=prior)
    with pytest.raises(UsageError, match="calibrate: expected True or False"):
        Classifier.load(tiny_model_dir, labels=["a", "b"], calibrate="no")
    clf = Classifier.load(tiny_model_dir, labels=["a", "b"], prior={"a": 1, "b": 3.0})
    with pytest.raises(UsageError, match="max_batch must be a positive whole number, not None"):
        clf.classify(["hi"], max_batch=None)
    for probs in (np.ones(2), np.ones((1, 3)), np.ones((1, 1, 2))):
        with pytest.raises(UsageError, match=r"probs: expected an \(N, 2\) array"):
            clf.predictions(probs)
    same = clf.classify(["hi there"], batch_tokens=np.int64(512), max_batch=np.int32(4))
    assert same == clf.classify(["hi there"], batch_tokens=512, max_batch=4)


def test_a_relative_xdg_cache_home_is_ignored(monkeypatch, tmp_path):
    """A hostile pass found: XDG_CACHE_HOME=relative/dir made a cache under the folder the
    run started from; the XDG spec says a relative path is to be ignored."""
    from mlxbatch.runtime.files import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")
    assert cache_dir() == tmp_path / ".cache" / "mlxbatch"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "abs"))
    assert cache_dir() == tmp_path / "abs" / "mlxbatch"


def test_eval_reads_every_output_format_classify_writes(tiny_model_dir, tmp_path):
    """A hostile pass found: `eval` read only JSONL, so the CSV and TSV outputs `classify`
    writes were "not a JSONL output of mlxbatch classify". Each format evaluates alike, numeric
    ids included (a table writes them as text)."""
    import json

    src = tmp_path / "gold.jsonl"
    src.write_text("".join(json.dumps({"n": i, "text": f"ticket {i} about {w}", "g": g}) + "\n"
                           for i, (w, g) in enumerate([("money", "a"), ("crash", "b"),
                                                       ("login", "a"), ("refund", "b")] * 3)))  # fmt: skip
    reports = {}
    for name in ("o.jsonl", "o.csv", "o.tsv", "o.csv.gz"):
        r = invoke(["classify", src, "--model", tiny_model_dir, "--labels", "a,b", "--id-field",
                    "n", "-o", tmp_path / name], tmp_path)  # fmt: skip
        assert r.exit_code == 0, r.output
        r = invoke(["eval", src, tmp_path / name, "--gold-field", "g", "--id-field", "n",
                    "--json", tmp_path / f"{name}.json"], tmp_path)  # fmt: skip
        assert r.exit_code == 0, r.output
        reports[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert all(m == reports["o.jsonl"] for m in reports.values()), reports
    (tmp_path / "bad.csv").write_text("id,text\n1,hello\n")
    r = invoke(["eval", src, tmp_path / "bad.csv", "--gold-field", "g"], tmp_path)
    one_line_error(r, "bad.csv: not an output of mlxbatch classify")


def test_an_interrupted_demo_says_how_to_resume_and_resumes(tiny_model_dir, tmp_path, monkeypatch):
    """A newcomer's Ctrl-C during the demo left a journal; the next `mlxbatch demo` told them
    to add --resume, an option the demo did not have, after writing its tickets over the
    interrupted run's input."""
    from mlxbatch.runtime import testhold

    out = tmp_path / "demo"
    args = ["demo", "--tickets", 12, "--model", tiny_model_dir, "--out", out]

    def stop(done):
        raise KeyboardInterrupt

    monkeypatch.setattr(testhold, "after_batch", stop)
    r = invoke(args, tmp_path)
    assert r.exit_code == 130, r.output
    assert "mlxbatch demo --resume" in r.stderr and (out / "predictions.jsonl.part").exists()
    monkeypatch.undo()
    tickets = (out / "tickets.jsonl").read_bytes()
    journal = (out / "predictions.jsonl.part").read_bytes()
    for again in (args, [*args[:2], 13, *args[3:], "--resume"]):  # as it was; other tickets
        one_line_error(invoke(again, tmp_path), "predictions.jsonl.part", alone=True)
        assert (out / "tickets.jsonl").read_bytes() == tickets  # the interrupted run's input
        assert (out / "predictions.jsonl.part").read_bytes() == journal
    r = invoke([*args, "--resume"], tmp_path)
    assert r.exit_code == 0, r.output
    assert "100.0% label agreement" in r.stdout
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 12
