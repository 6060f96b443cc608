"""Round eight: what this stop's hostile pass found open in a journal (a truncation edited into
a run that does not truncate) and in the output checks (a new file under /proc), each with the
case that found it. The service's findings are in
tests/test_serve_hostile.py and tests/test_scheduler.py (the drain)."""

from __future__ import annotations

import pytest
from cli_run import invoke, one_line_error
from test_hostile_round_six import _edit_rows, _interrupted

from mlxbatch.io.sinks import journal_path
from mlxbatch.runtime import testhold


def _cut(result):
    result["truncated"] = {"from_tokens": 900, "to_tokens": 64}


def test_a_truncation_edited_into_a_run_that_does_not_truncate_is_refused(tiny_model_dir,
                                                                         tmp_path, monkeypatch):  # fmt: skip
    # under --too-long error no row is ever cut: an edited "truncated" reached the output
    args = _interrupted(tiny_model_dir, tmp_path, monkeypatch)
    out = tmp_path / "o.jsonl"
    before = _edit_rows(out, _cut)
    r = invoke([*args, "--resume"], tmp_path)
    one_line_error(r, "line 2", "is truncated where this run's --too-long does not truncate",
                   alone=True)  # fmt: skip
    assert journal_path(out).read_bytes() == before and not out.exists()


def test_a_run_that_truncates_resumes_its_own_truncated_rows(tiny_model_dir, tmp_path,
                                                            monkeypatch):  # fmt: skip
    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    words = " ".join(f"word{k}" for k in range(40))
    src.write_text("".join(f'{{"id": "r{i}", "text": "{words} ticket {i}"}}\n' for i in range(6)))

    def stop(done):
        raise KeyboardInterrupt

    monkeypatch.setattr(testhold, "after_batch", stop)
    args = ["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", "2",
            "--too-long", "truncate", "--max-tokens", "24"]  # fmt: skip
    assert invoke(args, tmp_path).exit_code == 130
    monkeypatch.undo()
    rows = journal_path(out).read_text().splitlines()[1:]
    assert rows and all('"truncated"' in x for x in rows)  # the run's own cut rows
    r = invoke([*args, "--resume"], tmp_path)
    assert r.exit_code == 0, r.output
    assert len(out.read_text().splitlines()) == 6


@pytest.mark.parametrize("option, path", [("-o", "/proc/mlxbatch-new.jsonl"),
                                          ("--json", "/sys/mlxbatch-new.json")])  # fmt: skip
def test_a_new_file_under_proc_or_sys_is_refused_before_the_model_loads(option, path,
                                                                        tmp_path):  # fmt: skip
    # as root the folder's access check passed: the journal failed once the input was scanned
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "hello", "g": "billing"}\n')
    extra = ["-o", tmp_path / "o.jsonl", "--gold-field", "g"] if option == "--json" else []
    r = invoke(["classify", src, "--model", tmp_path / "no-model", option, path, *extra],
               tmp_path)  # fmt: skip
    one_line_error(r, option, "holds no new files", alone=True)
