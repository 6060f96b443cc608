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
    assert f"finished batches are saved in {tmp_path / 'o.jsonl.part'}. Run the same command " \
           "with --resume to continue." in r.stderr  # fmt: skip


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
        return subprocess.run(args, capture_output=True, text=True, timeout=300,
                              preexec_fn=lambda: os.close(closed))  # fmt: skip

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


def test_tickets_dash_o_dash_is_standard_output(tmp_path):
    """`tickets N -o -` wrote a file named `-` (52 MB for 100,000) where classify reads `-o -`
    as standard output."""
    r = invoke(["tickets", "3", "-o", "-"], tmp_path)
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 3, r.output
    assert not (tmp_path / "-").exists()


def test_a_system_prompt_file_saved_on_windows_is_the_prompt_typed(tmp_path):
    """A BOM and CRLF line ends were kept in the prompt: the same words scored otherwise."""
    from mlxbatch.io.promptspec import system_prompt_from

    typed = "You classify tickets.\nAnswer with one label."
    for raw in (typed.encode(), b"\xef\xbb\xbf" + typed.encode(),
                typed.replace("\n", "\r\n").encode() + b"\r\n"):  # fmt: skip
        path = tmp_path / "p.txt"
        path.write_bytes(raw)
        assert system_prompt_from(None, path) == typed, raw


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


def test_a_request_with_numbers_json_does_not_have_is_a_400():
    """`NaN`, `Infinity` and `1e999` were read (Python's json takes them) and answered 200."""
    import pytest

    from mlxbatch.serve.errors import ApiError
    from mlxbatch.serve.limits import Limits, parse_classify

    for body, said in ((b'{"input": "a", "user": NaN}', "NaN is not a JSON number"),
                       (b'{"input": "a", "user": -Infinity}', "-Infinity is not a JSON number"),
                       (b'{"input": "a", "user": 1e999}', "1e999 is past a float's range")):  # fmt: skip
        with pytest.raises(ApiError) as e:
            parse_classify(body, Limits(), ("m",))
        assert e.value.status == 400 and said in str(e.value), str(e.value)
    assert parse_classify(b'{"input": "a", "user": 1.5e3}', Limits(), ("m",)).texts == ["a"]


def test_copies_of_a_few_texts_are_not_priced_at_their_pace():
    """20,000 copies of one text: "~10998.0 s saved at this job's pace" for a 50 s job (the
    one item scored alone carried the job's fixed cost)."""
    from mlxbatch.jobs.result import JobResult

    base = dict(errors=0, padding_overhead=0.0, batch_tokens=1024, peak_memory=0,
                memory_bound=0)  # fmt: skip
    one = JobResult(rows=20_000, scored=20_000, seconds=0.55, duplicates=19_999, **base)
    assert "19999 duplicates scored once (100.0% of the rows)" in one.summary(), one.summary()
    many = JobResult(rows=2_000, scored=2_000, seconds=10.0, duplicates=1_000, **base)
    assert "(50.0% of the rows, ~10.0 s saved at this job's pace)" in many.summary()


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


def test_a_check_disagrees_where_one_answer_abstains():
    """The rule itself, on crafted results (the CLI case above needs a row whose fast score
    falls under its gold one, which the machine's kernels decide)."""
    from mlxbatch.api.verify import Check

    both = Check("billing", "billing", 6e-8, 0.2, (False, False))
    one = Check("billing", "billing", 6e-8, 0.2, (False, True))
    assert both.agrees and not one.agrees
    assert one.answers() == ("billing", "billing (abstains)")
    assert one.disagreement("t1") == {"id": "t1", "gold": "billing", "fast": "billing",
                                      "gold_margin": 0.2, "gold_abstained": False,
                                      "fast_abstained": True}  # fmt: skip


def test_the_python_api_scores_each_distinct_prompt_once(tiny_model_dir, monkeypatch):
    """`clf.classify(["same text"] * 20_000)` took 53 s (every copy scored) where classify's
    file job took 1.1 s; the answers are each text's own, in input order."""
    import pytest

    from mlxbatch.api import classifier
    from mlxbatch.errors import ItemTooLong

    clf = Classifier.load(tiny_model_dir, labels=["spam", "ham"])
    texts = ["buy now", "hello there", "buy now", "meeting at 3", "hello there"] * 40
    alone = {t: clf.classify([t])[0] for t in set(texts)}
    sizes = []
    real = classifier.Scheduler

    def counting(engine, policy, items):
        items = list(items)
        sizes.append(len(items))
        return real(engine, policy, items)

    monkeypatch.setattr(classifier, "Scheduler", counting)
    got = clf.classify(texts)
    assert sizes == [3] and got == [alone[t] for t in texts]
    with pytest.raises(ItemTooLong, match=r"^texts\[1\]: "):  # its first place, as before
        clf.classify(["ok", "word " * 300, "ok", "word " * 300], max_tokens=64)


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


def test_a_drain_that_ends_with_work_cancelled_is_a_warning(caplog):
    """uvicorn logged the documented end of --drain-timeout (those clients got 503) at ERROR."""
    import logging

    from mlxbatch.serve.server import DrainEnded

    log = logging.getLogger("uvicorn.error")
    ended = DrainEnded()
    log.addFilter(ended)
    try:
        with caplog.at_level(logging.INFO, logger="uvicorn.error"):
            log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", 2)
            log.error("Exception in ASGI application")  # any other error stays one
    finally:
        log.removeFilter(ended)
    assert [r.levelname for r in caplog.records] == ["WARNING", "ERROR"]


def test_the_python_api_says_which_texts_it_cut(tiny_model_dir):
    """`truncate=True` cut texts without a word to a Python caller (classify's rows and the
    service name the cut: `truncated`)."""
    clf = Classifier.load(tiny_model_dir, labels=["spam", "ham"])
    long = "word " * 300
    got = clf.classify(["short", long, "short", long], max_tokens=64, truncate=True)
    cut = clf.prepare(long, max_tokens=64, truncate=True).truncated
    assert cut and cut["to_tokens"] <= 64 < cut["from_tokens"]
    assert [p.truncated for p in got] == [None, cut, None, cut]
