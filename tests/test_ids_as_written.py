"""JSON ids are echoed exactly as the input wrote them, and told apart as written: `1e2`, `1.0`
and `-0.0` are not rewritten, nor taken as duplicates of `100`, `1` and `0`."""

from __future__ import annotations

import json

from cli_run import invoke

IDS = ["1e2", "100", "1.0", "1", "-0.0", "0", "2.50", '"x"']


def test_ids_come_back_as_written_through_the_journal(tiny_model_dir, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(f'{{"id": {i}, "text": "ticket {n}"}}\n' for n, i in enumerate(IDS)))
    r = invoke(["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", "2"])
    assert r.exit_code == 0, r.output
    lines = out.read_text().splitlines()
    assert [line.split(",")[0].removeprefix('{"id": ') for line in lines] == IDS
    assert all(json.loads(line)["label"] for line in lines)


def test_a_repeated_id_as_written_is_still_a_duplicate(tiny_model_dir, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"id": 1e2, "text": "a"}\n{"id": 1e2, "text": "b"}\n')
    r = invoke(["classify", src, "--model", tiny_model_dir, "-o", out])
    assert r.exit_code != 0 or "duplicate" in out.read_text()
    assert "duplicate" in (r.output + (out.read_text() if out.exists() else ""))
