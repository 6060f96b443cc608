"""A model directory's files are read whole: one that is a FIFO, a directory or a socket (after
following links) is refused by name at once, never waited on or taken for a missing file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from mlxbatch.errors import ModelError
from mlxbatch.model.defaults import not_runnable
from mlxbatch.model.files import check_regular_files


def own_model(tiny_model_dir, tmp_path):
    """The test's own model directory: the weights hard-linked, the small files copied."""
    model = tmp_path / "model"
    model.mkdir()
    for f in tiny_model_dir.iterdir():
        (os.link if f.suffix == ".safetensors" else shutil.copy2)(f, model / f.name)
    return model


@pytest.mark.parametrize(
    "name",
    [
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "mlxbatch.json",
    ],
)
def test_a_fifo_in_the_model_directory_is_refused_by_name_without_a_hang(
    name, tiny_model_dir, tmp_path
):
    model = own_model(tiny_model_dir, tmp_path)
    (model / name).unlink(missing_ok=True)
    os.mkfifo(model / name)
    src, out = tmp_path / "in.jsonl", tmp_path / "o.jsonl"
    src.write_text('{"id": 1, "text": "my invoice is wrong"}\n')
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxbatch",
            "classify",
            str(src),
            "--model",
            str(model),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {model / name}: is not a regular file (a FIFO)")
    assert not out.exists()


def test_a_link_to_a_directory_is_refused_and_a_link_to_a_file_is_followed(
    tiny_model_dir, tmp_path
):
    model = own_model(tiny_model_dir, tmp_path)
    (model / "tokenizer_config.json").rename(tmp_path / "real.json")
    (model / "tokenizer_config.json").symlink_to(tmp_path / "real.json")
    check_regular_files(model)  # a link to a regular file is one
    (tmp_path / "dir").mkdir()
    (model / "chat_template.jinja").symlink_to(tmp_path / "dir")
    with pytest.raises(ModelError, match=r"chat_template.jinja: is not a regular file \(a dir"):
        check_regular_files(model)
    assert "is not a regular file" in not_runnable(model)


GOLD = "".join(
    f'{{"id": {i}, "text": "ticket {i} about billing", "intent": "billing"}}\n' for i in range(3)
)


def test_no_output_of_any_command_lands_in_a_model_directory(tiny_model_dir, tmp_path):
    """A new file there becomes part of the model (a `--json m/chat_template.json` is read as
    its template by every later run): refused, by name, before anything is written."""
    from cli_run import invoke, one_line_error

    model = own_model(tiny_model_dir, tmp_path)
    (model / "runs").mkdir()
    before = sorted(p.name for p in model.iterdir())
    src, preds = tmp_path / "in.jsonl", tmp_path / "preds.jsonl"
    src.write_text(GOLD)
    base = ["classify", src, "--model", model]
    assert invoke([*base, "-o", preds], tmp_path).exit_code == 0
    for args in (
        ["eval", src, preds, "--gold-field", "intent", "--json", model / "chat_template.json"],
        [*base, "-o", model / "preds.jsonl"],
        [
            *base,
            "-o",
            tmp_path / "p2.jsonl",
            "--gold-field",
            "intent",
            "--json",
            model / "runs" / "eval.json",
        ],
        ["tickets", "3", "-o", model / "tickets.jsonl"],
    ):
        r = invoke(args, tmp_path)
        one_line_error(r, str(model))
        assert sorted(p.name for p in model.iterdir()) == before
        assert not any((model / "runs").iterdir()) and not (tmp_path / "p2.jsonl").exists()
