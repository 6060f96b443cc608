"""A resume never mixes two computations, and a journal is trusted no further than
it can be checked (row range, ids against the input, labels against scores, finite scores)."""

from __future__ import annotations

import json

import pytest
from cli_run import invoke, one_line_error

from mlxbatch.io.sinks import journal_path
from mlxbatch.runtime import testhold

GOOD = "".join(f'{{"id": "r{i}", "text": "ticket number {i} about billing"}}\n' for i in range(6))


@pytest.fixture
def interrupted(tiny_model_dir, tmp_path, monkeypatch):
    """A journal holding the first batch of a run interrupted after it (input, output)."""
    from mlxbatch.runtime import testhold

    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    src.write_text(GOOD)

    def stop(done):
        raise KeyboardInterrupt

    monkeypatch.setattr(testhold, "after_batch", stop)
    r = invoke(
        ["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", "2"], tmp_path
    )
    assert r.exit_code == 130, r.output
    monkeypatch.undo()
    assert len(journal_path(out).read_text().splitlines()) == 3  # header + one batch of 2
    return src, out


def resume(tiny_model_dir, src, out, *extra, env=None):
    args = ["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", "2", "--resume"]
    return invoke([*args, *extra], src.parent, env)


def refused(r, *words):
    one_line_error(r, *words, alone=True)


def test_the_journal_records_the_compute_path(interrupted):
    _, out = interrupted
    head = json.loads(journal_path(out).read_text().splitlines()[0])
    compute = head["compute"]
    assert {"blas", "kernels", "library", "host_kernels", "device", "mlx"} <= set(compute)
    assert "compute=" in head["fingerprint"]
    assert compute["library"] is None or "/" not in compute["library"]  # a name, not a path


def test_resume_without_host_kernels_is_refused(tiny_model_dir, interrupted):
    src, out = interrupted
    before = journal_path(out).read_bytes()
    r = resume(tiny_model_dir, src, out, env={"MLXBATCH_HOST_KERNELS": "0"})
    refused(r, "compute path", "host kernels (MLXBATCH_HOST_KERNELS) on, now off")
    assert journal_path(out).read_bytes() == before and not out.exists()


def test_resume_on_another_blas_kernel_family_is_refused(tiny_model_dir, interrupted, monkeypatch):
    from mlxbatch.jobs import fingerprint

    src, out = interrupted
    real = fingerprint.sgemm_provider()
    # the same library but another family than this CPU's own (a fake of SkylakeX, the family
    # of an AVX-512 CPU, changed nothing on one: CI then saw only the faked version differ)
    other = "Haswell" if real["corename"] == "SkylakeX" else "SkylakeX"
    fake = real | {"corename": other}
    monkeypatch.setattr(fingerprint, "sgemm_provider", lambda: fake)
    r = resume(tiny_model_dir, src, out)
    refused(r, "compute path", "BLAS kernel family", f"now {other}")
    # the journal's header faked instead: the same refusal, naming the recorded family
    monkeypatch.undo()
    lines = journal_path(out).read_text().splitlines(True)
    head = json.loads(lines[0])
    head["compute"]["kernels"] = "Zen"
    fp = dict(w.split("=") for w in head["fingerprint"].split())
    fp["compute"] = fingerprint.digest([head["compute"].get(k) for k in fingerprint.DECIDING])
    head["fingerprint"] = " ".join(f"{k}={v}" for k, v in fp.items())
    journal_path(out).write_text(json.dumps(head) + "\n" + "".join(lines[1:]))
    refused(resume(tiny_model_dir, src, out), "compute path", "BLAS kernel family Zen, now")


def test_a_journal_from_before_the_one_thread_prefix_is_refused(tiny_model_dir, interrupted):
    """Journals written before the shared prefix was computed on one OpenBLAS thread (their
    header has no such entry) held other bits: a resume would mix the two."""
    from mlxbatch.jobs import fingerprint

    src, out = interrupted
    before = journal_path(out).read_text()
    lines = before.splitlines(True)
    head = json.loads(lines[0])
    del head["compute"]["prefix_threads"]
    fp = dict(w.split("=") for w in head["fingerprint"].split())
    old = [k for k in fingerprint.DECIDING if k != "prefix_threads"]  # as 0.2.0's drafts hashed
    fp["compute"] = fingerprint.digest([head["compute"].get(k) for k in old])
    head["fingerprint"] = " ".join(f"{k}={v}" for k, v in fp.items())
    journal_path(out).write_text(json.dumps(head) + "\n" + "".join(lines[1:]))
    try:
        refused(
            resume(tiny_model_dir, src, out),
            "compute path",
            "shared-prefix BLAS threads none, now one",
        )
    finally:
        journal_path(out).write_text(before)


def test_an_uninterrupted_resume_matches(tiny_model_dir, interrupted, tmp_path):
    src, out = interrupted
    assert resume(tiny_model_dir, src, out).exit_code == 0
    ref = tmp_path / "ref.jsonl"
    r = invoke(
        ["classify", src, "--model", tiny_model_dir, "-o", ref, "--max-batch", "2"], tmp_path
    )
    assert r.exit_code == 0 and ref.read_bytes() == out.read_bytes()


def _edit_row(line: str, edit) -> str:
    entry = json.loads(line)
    edit(entry)
    return json.dumps(entry) + "\n"


def _swap_label(e):
    scores = e["result"]["scores"]
    e["result"]["label"] = min(scores, key=scores.get)


def _set_score(value):
    def edit(e):
        first = next(iter(e["result"]["scores"]))
        e["result"]["scores"][first] = value

    return edit


def _scale_scores(e):
    e["result"]["scores"] = {k: v / 2 for k, v in e["result"]["scores"].items()}


BAD_ROWS = {
    "row index 1e15": (lambda e: e.update(row=10**15), "names row 1000000000000000"),
    "row index as a float": (lambda e: e.update(row=1e15), "names row 1000000000000000.0"),
    "row index past the input": (lambda e: e.update(row=6), "not a row of the input (0 to 5)"),
    "score 1e999": (_set_score(float("inf")), "not a finite probability"),
    "score NaN": (_set_score(float("nan")), "not a finite probability"),
    "score 5.0": (_set_score(5.0), "not a finite probability"),
    "label not its top score": (_swap_label, "where its top score is"),
    "scores of other labels": (
        lambda e: e["result"].update(scores={"x": 0.5, "y": 0.5}),
        "not one per label",
    ),
    "id not its input row's": (
        lambda e: e["result"].update(id="r5"),
        "holds id 'r5' for input row 1, whose id is 'r0'",
    ),
    "id of another type": (lambda e: e["result"].update(id=0), "holds id 0 for input row 1"),
    "scores that do not sum to 1": (_scale_scores, "has scores that sum to 0.5, not 1"),
    "an error for a row this run scores": (
        lambda e: e.update(result={"id": "r0", "line": 1, "error": "made up"}),
        "holds the error 'made up' for input row 1, which this run scores",
    ),
}


@pytest.mark.parametrize("name", list(BAD_ROWS))
def test_a_bad_journal_row_is_refused_naming_the_line(name, tiny_model_dir, interrupted):
    src, out = interrupted
    edit, message = BAD_ROWS[name]
    path = journal_path(out)
    lines = path.read_text().splitlines(True)
    text = _edit_row(lines[1], edit)
    if "1e999" in name:
        text = text.replace("Infinity", "1e999")
    path.write_text(lines[0] + text + lines[2])
    for extra in ((), ("--verify",)):
        refused(resume(tiny_model_dir, src, out, *extra), str(path), "line 2", message)
    assert not out.exists()


def test_a_result_journaled_for_a_row_this_run_refuses_is_refused(
    tiny_model_dir, tmp_path, monkeypatch
):
    """An error row edited into a result would have gone into the output as the row's answer."""
    from mlxbatch.runtime import testhold

    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    src.write_text('{"id": "r0", "text": ""}\n' + GOOD.split("\n", 1)[1])

    def stop(done):
        raise KeyboardInterrupt

    monkeypatch.setattr(testhold, "after_batch", stop)
    skip = ("--on-error", "skip")
    r = invoke(
        ["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", "2", *skip], tmp_path
    )
    assert r.exit_code == 130, r.output
    monkeypatch.undo()
    path = journal_path(out)
    lines = path.read_text().splitlines(True)
    at = next(n for n, x in enumerate(lines) if n and "error" in json.loads(x)["result"])
    good = next(json.loads(x)["result"] for x in lines[1:] if '"scores"' in x)
    lines[at] = _edit_row(lines[at], lambda e: e.update(result={**good, "id": "r0"}))
    path.write_text("".join(lines))
    refused(
        resume(tiny_model_dir, src, out, *skip),
        str(path),
        f"line {at + 1}",
        "holds a result for input row 1, which this run refuses",
    )
    assert not out.exists()


def test_resume_without_a_journal_says_so(tiny_model_dir, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    src.write_text(GOOD)
    r = resume(tiny_model_dir, src, out)
    assert r.exit_code == 0, r.output
    assert "note: --resume: no journal" in r.stderr and "starting afresh" in r.stderr
    assert len(out.read_text().splitlines()) == 6


def _edit_settings(out, edit) -> None:
    lines = journal_path(out).read_text().splitlines(True)
    head = json.loads(lines[0])
    edit(head["settings"])
    journal_path(out).write_text(json.dumps(head) + "\n" + "".join(lines[1:]))


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda s: s.update(batch_tokens=float("inf")), "batch_tokens inf"),
        (lambda s: s.update(batch_tokens=-5), "batch_tokens -5"),
        (lambda s: s.update(max_batch=0), "max_batch 0"),
        (lambda s: s.update(window=-3), "window -3"),
        (lambda s: s.update(window=0), "window 0"),
        (lambda s: s.update(window=10**30), "window 1000"),
        (lambda s: s.update(item_limit="4096"), "item_limit '4096'"),
        (lambda s: s.update(item_limit=[float("inf"), "x"]), "item_limit inf"),
        (
            lambda s: s.update(cost_model={"per_batch": "x", "per_token": 1, "per_key": 0}),
            "cost_model",
        ),
        (
            lambda s: s.update(
                cost_model={"per_batch": 1, "per_token": 1, "per_key": 0, "lanes": "two"}
            ),
            "cost_model lanes 'two'",
        ),
        (lambda s: s.clear(), "'item_limit'"),
    ],
)
def test_recorded_settings_a_run_cannot_write_are_refused_by_name(
    tiny_model_dir, interrupted, edit, words
):
    src, out = interrupted
    _edit_settings(out, edit)
    before = journal_path(out).read_bytes()
    refused(resume(tiny_model_dir, src, out), "recorded settings are unreadable", words)
    assert journal_path(out).read_bytes() == before and not out.exists()


def test_an_edited_recorded_shape_is_refused_not_followed(tiny_model_dir, interrupted):
    """A limit a run could have written, but this one did not: the fingerprint covers the
    recorded shape (followed, it turned rows into error rows beside scored ones)."""
    src, out = interrupted
    _edit_settings(out, lambda s: s.update(item_limit=[3, "hand"]))
    refused(resume(tiny_model_dir, src, out), "batch shape")


def test_resume_in_another_host_kernel_layout_is_refused(tiny_model_dir, interrupted, monkeypatch):
    """The plain layout (chosen where the BLAS probe finds it invariant, SkylakeX's kernels)
    and the tiled one may sum a row in other orders: a journal of one does not resume in the
    other."""
    from mlxbatch.model import hostops

    src, out = interrupted
    before = journal_path(out).read_bytes()
    here = hostops.LAYOUT
    assert json.loads(before.splitlines()[0])["compute"]["layout"] == here
    other = "tiled" if here == "plain" else "plain"
    monkeypatch.setattr(hostops, "LAYOUT", other)
    r = resume(tiny_model_dir, src, out)
    refused(r, "compute path", f"host-kernel layout (MLXBATCH_HOST_LAYOUT) {here}, now {other}")
    assert ("MLXBATCH_HOST_LAYOUT=tiled resumes it" in r.stderr) == (here == "tiled")
    assert journal_path(out).read_bytes() == before and not out.exists()


def test_a_journal_from_before_the_layout_was_recorded_resumes_in_the_tiled_one(
    tiny_model_dir, interrupted, tmp_path, monkeypatch
):
    """Journals written before the layout was recorded were all tiled: their header has no
    layout and their compute digest hashes DECIDING alone; they resume in the tiled layout."""
    from mlxbatch.jobs import fingerprint
    from mlxbatch.model import hostops

    src, out = interrupted
    whole = tmp_path / "whole.jsonl"
    args = ["classify", src, "--model", tiny_model_dir, "-o", whole, "--max-batch", "2"]
    assert invoke(args, tmp_path).exit_code == 0  # in this process's layout, as the journal
    lines = journal_path(out).read_text().splitlines(True)
    head = json.loads(lines[0])
    del head["compute"]["layout"]
    fp = dict(w.split("=") for w in head["fingerprint"].split())
    fp["compute"] = fingerprint.digest([head["compute"].get(k) for k in fingerprint.DECIDING])
    head["fingerprint"] = " ".join(f"{k}={v}" for k, v in fp.items())
    journal_path(out).write_text(json.dumps(head) + "\n" + "".join(lines[1:]))
    monkeypatch.setattr(hostops, "LAYOUT", "tiled")  # what the fingerprint records (the
    r = resume(tiny_model_dir, src, out)  # products stay this process's: the journal's bits)
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == whole.read_bytes()
    monkeypatch.setattr(hostops, "LAYOUT", "plain")  # and is refused in the plain one
    journal_path(out).write_text(json.dumps(head) + "\n" + "".join(lines[1:]))
    out.unlink()
    refused(resume(tiny_model_dir, src, out), "host-kernel layout", "tiled, now plain")


EDITS = {
    "an empty line": (lambda lines: [lines[0], "\n", *lines[1:]], "line 2 is not a row"),
    "an extra field": (
        lambda lines: [
            lines[0],
            _edit_row(lines[1], lambda e: e["result"].update(note="mine")),
            *lines[2:],
        ],
        "line 2 has fields ['note'] that mlxbatch does not write",
    ),
    "an edited truncation": (
        lambda lines: [
            lines[0],
            _edit_row(lines[1], lambda e: e["result"].update(truncated={"x": 1})),
            *lines[2:],
        ],
        "line 2 has a truncation that mlxbatch did not write",
    ),
    "an abstention with a label": (
        lambda lines: [
            lines[0],
            _edit_row(lines[1], lambda e: e["result"].update(abstained=True)),
            *lines[2:],
        ],
        "line 2 has an abstention that mlxbatch did not write",
    ),
    "an error row with a field more": (
        lambda lines: [
            lines[0],
            json.dumps({"row": 0, "result": {"id": "r0", "error": "x", "why": 1}}) + "\n",
            *lines[2:],
        ],
        "line 2 is not a row",
    ),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_an_edited_journal_is_refused_not_cut_short(name, tiny_model_dir, interrupted):
    """An edited journal is refused by line: an empty line is not taken for the zeros a crash
    leaves (the rows after it dropped silently), and a field the run never writes
    ("truncated": {"x": 1}) never reaches the output."""
    src, out = interrupted
    edit, message = EDITS[name]
    path = journal_path(out)
    before = "".join(edit(path.read_text().splitlines(True)))
    path.write_text(before)
    refused(resume(tiny_model_dir, src, out), str(path), message)
    assert path.read_text() == before and not out.exists()  # the journal is left as it was


def test_a_resume_with_another_mode_names_the_settings_not_an_edit(tiny_model_dir, interrupted):
    """`--resume --mode naive` after a sorted run names the changed setting, not an edit of the
    journal: the batch shape follows the settings."""
    src, out = interrupted
    r = resume(tiny_model_dir, src, out, "--mode", "naive")
    refused(r, "was written for a different setting (one of --mode")
    assert "edited" not in r.output and "batch shape" not in r.output


def _interrupted(tiny_model_dir, tmp_path, monkeypatch, *extra):
    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    src.write_text(GOOD)

    def stop(done):
        raise KeyboardInterrupt

    monkeypatch.setattr(testhold, "after_batch", stop)
    args = ["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", "2", *extra]
    assert invoke(args, tmp_path).exit_code == 130
    monkeypatch.undo()
    return args


def _edit_rows(out, edit):
    lines = journal_path(out).read_text().splitlines()
    rows = [json.loads(x) for x in lines[1:]]
    for row in rows:
        edit(row["result"])
    journal_path(out).write_text("\n".join([lines[0], *map(json.dumps, rows)]) + "\n")
    return journal_path(out).read_bytes()


def _abstain(result):
    result["label"], result["abstained"] = None, True


def _label(result):
    scores = result["scores"]
    result.pop("abstained", None)
    result["label"] = max(scores, key=scores.get)


def _cut(result):
    result["truncated"] = {"from_tokens": 900, "to_tokens": 64}


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


@pytest.mark.parametrize(
    "floor,edit,words",
    [
        (None, _abstain, "abstains where this run's --min-confidence (none) does not"),
        ("0.99", _label, "has a label where this run's --min-confidence 0.99 abstains"),
    ],
)
def test_an_abstention_forged_in_a_journal_is_refused(
    floor, edit, words, tiny_model_dir, tmp_path, monkeypatch
):
    # a run without --min-confidence resumed rows edited to abstain, and wrote them as its own
    extra = ["--min-confidence", floor] if floor else []
    args = _interrupted(tiny_model_dir, tmp_path, monkeypatch, *extra)
    out = tmp_path / "o.jsonl"
    before = _edit_rows(out, edit)
    r = invoke([*args, "--resume"], tmp_path)
    one_line_error(r, "line 2", words, alone=True)
    assert journal_path(out).read_bytes() == before and not out.exists()


@pytest.mark.parametrize("floor", [None, "0.99"])
def test_a_journal_with_the_run_s_own_abstentions_resumes(
    floor, tiny_model_dir, tmp_path, monkeypatch
):
    extra = ["--min-confidence", floor] if floor else []
    args = _interrupted(tiny_model_dir, tmp_path, monkeypatch, *extra)
    r = invoke([*args, "--resume"], tmp_path)
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(("abstained" in x) == bool(floor) for x in rows)


def test_a_truncation_edited_into_a_run_that_does_not_truncate_is_refused(
    tiny_model_dir, tmp_path, monkeypatch
):
    # under --too-long error no row is ever cut: an edited "truncated" reached the output
    args = _interrupted(tiny_model_dir, tmp_path, monkeypatch)
    out = tmp_path / "o.jsonl"
    before = _edit_rows(out, _cut)
    r = invoke([*args, "--resume"], tmp_path)
    one_line_error(
        r, "line 2", "is truncated where this run's --too-long does not truncate", alone=True
    )
    assert journal_path(out).read_bytes() == before and not out.exists()


def test_a_run_that_truncates_resumes_its_own_truncated_rows(tiny_model_dir, tmp_path, monkeypatch):
    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    words = " ".join(f"word{k}" for k in range(40))
    src.write_text("".join(f'{{"id": "r{i}", "text": "{words} ticket {i}"}}\n' for i in range(6)))

    def stop(done):
        raise KeyboardInterrupt

    monkeypatch.setattr(testhold, "after_batch", stop)
    args = [
        "classify",
        src,
        "--model",
        tiny_model_dir,
        "-o",
        out,
        "--max-batch",
        "2",
        "--too-long",
        "truncate",
        "--max-tokens",
        "24",
    ]
    assert invoke(args, tmp_path).exit_code == 130
    monkeypatch.undo()
    rows = journal_path(out).read_text().splitlines()[1:]
    assert rows and all('"truncated"' in x for x in rows)  # the run's own cut rows
    r = invoke([*args, "--resume"], tmp_path)
    assert r.exit_code == 0, r.output
    assert len(out.read_text().splitlines()) == 6


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
    monkeypatch.undo()  # once a batch is journaled, the hint is given, naming the journal
    from mlxbatch.runtime import testhold

    def stop(done):
        raise KeyboardInterrupt

    monkeypatch.setattr(testhold, "after_batch", stop)
    src.write_text("".join(f'{{"text": "ticket {i}"}}\n' for i in range(6)))
    r = invoke(["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", "2"])
    assert r.exit_code == 130 and (tmp_path / "o.jsonl.part").exists(), r.output
    assert (
        f"finished batches are saved in {tmp_path / 'o.jsonl.part'}. Run the same command "
        "with --resume to continue." in r.stderr
    )


def test_a_job_refused_before_its_first_row_leaves_no_journal(tiny_model_dir, tmp_path):
    """A naive batch refused for memory, after the scan, left a journal holding only its
    header: the run the refusal advised (a lower --max-batch) was refused ("holds an
    interrupted run: add --resume"), and with --resume it ran the shape the journal recorded,
    the one just refused, unchecked as a resumed plan."""
    import subprocess
    import sys

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [{"text": f"ticket {i} about a refund"} for i in range(24)]
    rows[3]["text"] = " ".join(f"word{i}" for i in range(600))  # ~2,600 tokens: under the limit
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**__import__("os").environ, "MLXBATCH_MEMORY_LIMIT": "3G"}

    def classify(*extra):
        return subprocess.run(
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
                str(out),
                "--mode",
                "naive",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )

    r = classify()
    assert r.returncode == 2 and "one batch needs about" in r.stderr, r.stderr[-2000:]
    assert not out.exists() and not (tmp_path / "out.jsonl.part").exists()
    r = classify("--max-batch", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(out.read_text().splitlines()) == 24


def test_two_names_of_one_output_share_one_journal_and_its_lock(tmp_path):
    from mlxbatch.errors import UsageError
    from mlxbatch.io.sinks import Journal, journal_path

    out, alias = tmp_path / "out.jsonl", tmp_path / "alias.jsonl"
    out.write_text("")
    alias.symlink_to(out)
    assert journal_path(alias) == journal_path(out)
    first = Journal(out, {"fingerprint": "f"}, resume=False)
    try:
        try:
            Journal(alias, {"fingerprint": "f"}, resume=False)
            raise AssertionError("a second run through a link was let in")
        except UsageError as e:  # another process is told its pid; this one, the journal
            assert "another run is writing" in str(e) or "holds an interrupted run" in str(e)
    finally:
        first.close()
