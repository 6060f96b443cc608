"""A journal is resumed only on the model that wrote it: its config, weights, every tokenizer
file and the rendered chat template; a model directory edited in place is refused by the name
of the file that changed."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from cli_run import invoke, one_line_error

from mlxbatch.io.sinks import journal_path

GOOD = "".join(f'{{"id": "r{i}", "text": "ticket number {i} about billing"}}\n' for i in range(6))


def own_model(tiny_model_dir, tmp_path):
    """A model directory of the test's own: the weights hard-linked (never written here), the
    small files copied (edited in place by the tests)."""
    model = tmp_path / "model"
    model.mkdir()
    for f in tiny_model_dir.iterdir():
        (os.link if f.suffix == ".safetensors" else shutil.copy2)(f, model / f.name)
    return model


@pytest.fixture
def interrupted(tiny_model_dir, tmp_path, monkeypatch):
    """A journal holding the first batch of a run interrupted after it (model, input, output)."""
    from mlxbatch.runtime import testhold

    model, src, out = (
        own_model(tiny_model_dir, tmp_path),
        tmp_path / "in.jsonl",
        tmp_path / "o.jsonl",
    )
    src.write_text(GOOD)

    def stop(done):
        raise KeyboardInterrupt

    monkeypatch.setattr(testhold, "after_batch", stop)
    r = invoke(["classify", src, "--model", model, "-o", out, "--max-batch", "2"], tmp_path)
    assert r.exit_code == 130, r.output
    monkeypatch.undo()
    return model, src, out


def resume(model, src, out):
    args = ["classify", src, "--model", model, "-o", out, "--max-batch", "2", "--resume"]
    return invoke(args, src.parent)


def _edit_json(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def rope_theta(model):
    _edit_json(model / "config.json", lambda c: c.update(rope_theta=c["rope_theta"] * 2))


def merges(model):
    def drop_last(t):
        t["model"]["merges"] = t["model"]["merges"][:-1]

    _edit_json(model / "tokenizer.json", drop_last)


def template(model):
    def reword(c):  # a comment: the rendering is the same, the file is not
        c["chat_template"] += "{# edited #}"

    _edit_json(model / "tokenizer_config.json", reword)


def template_file(model):  # the same template, now in the file that takes precedence
    source = json.loads((model / "tokenizer_config.json").read_text())["chat_template"]
    (model / "chat_template.jinja").write_text(source)


def special_tokens(model):
    (model / "special_tokens_map.json").write_text('{"eos_token": "<|im_end|>"}')


def vocab_removed(model):
    (model / "vocab.json").unlink()


EDITS = {
    "config.json changed": rope_theta,
    "tokenizer.json changed": merges,
    "tokenizer_config.json changed": template,
    "chat_template.jinja appeared": template_file,
    "special_tokens_map.json appeared": special_tokens,
    "vocab.json was removed": vocab_removed,
}


@pytest.mark.parametrize("said", list(EDITS))
def test_a_resume_on_a_model_edited_in_place_is_refused_naming_the_file(said, interrupted):
    model, src, out = interrupted
    before = journal_path(out).read_bytes()
    EDITS[said](model)
    r = resume(model, src, out)
    one_line_error(r, f"the model's {said} since", "delete the journal", alone=True)
    assert journal_path(out).read_bytes() == before and not out.exists()


def test_the_journal_records_each_model_file(interrupted):
    model, _, out = interrupted
    head = json.loads(journal_path(out).read_text().splitlines()[0])
    files = head["model"]["files"]
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= {
        k for k, v in files.items() if v is not None
    }
    assert files["chat_template.jinja"] is None and head["model"]["path"] == str(model.resolve())


def test_an_unedited_model_resumes_to_an_uninterrupted_runs_output(interrupted, tmp_path):
    model, src, out = interrupted
    os.utime(model / "config.json")  # touched, not changed: the contents decide
    assert resume(model, src, out).exit_code == 0
    ref = tmp_path / "ref.jsonl"
    r = invoke(["classify", src, "--model", model, "-o", ref, "--max-batch", "2"], tmp_path)
    assert r.exit_code == 0 and ref.read_bytes() == out.read_bytes()


def test_a_resume_on_a_copy_of_the_model_names_the_path(interrupted, tmp_path):
    model, src, out = interrupted
    moved = tmp_path / "moved"
    model.rename(moved)
    one_line_error(resume(moved, src, out), "the model's path changed", str(moved), alone=True)


def test_a_journal_that_recorded_no_model_files_is_refused_clearly(interrupted):
    """A journal written before the model's files were recorded cannot say whether they
    changed since: it is refused, not resumed on trust."""
    from mlxbatch.jobs.fingerprint import digest, weights_digest

    model, src, out = interrupted
    lines = journal_path(out).read_text().splitlines(True)
    head = json.loads(lines[0])
    del head["model"]
    parts = dict(w.split("=") for w in head["fingerprint"].split())
    parts["model"] = digest([weights_digest(model), str(model.resolve())])  # as it was hashed
    head["fingerprint"] = " ".join(f"{k}={v}" for k, v in parts.items())
    journal_path(out).write_text(json.dumps(head) + "\n" + "".join(lines[1:]))
    one_line_error(resume(model, src, out), "earlier mlxbatch", "delete it", alone=True)
    assert not out.exists()
