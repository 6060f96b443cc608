"""Round ten: what this stop's hostile passes found, each with the case that found it:
`--json -` wrote a file named "-", a redirect appended the rows to the input, `tickets`
replaced another run's input. (The service's: tests/test_serve_hostile.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cli_run import invoke, one_line_error


def _rows(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"ticket {i}", "gold": ["spam", "ham"][i % 2]})
                           + "\n" for i in range(6)))  # fmt: skip
    return src


def _mlxbatch(args, cwd):
    return subprocess.run([sys.executable, "-m", "mlxbatch", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_json_dash_is_standard_output_and_the_text_report_moves_to_stderr(tiny_model_dir,
                                                                         tmp_path):  # fmt: skip
    """`--json -` wrote the report to a file named "-" in the working directory (`-o -` is
    standard output); now it is standard output, whole, and the evaluation's table for people
    goes to standard error, so that `| jq` reads JSON alone."""
    src, out = _rows(tmp_path), tmp_path / "rows.jsonl"
    job = ["classify", src, "--model", tiny_model_dir, "--labels", "spam,ham", "--gold-field",
           "gold"]  # fmt: skip
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
        r = invoke(["classify", src, "--model", tiny_model_dir, "--labels", "spam,ham",
                    "--gold-field", "gold", "--json", given], tmp_path)  # fmt: skip
        one_line_error(r, "--json", "standard output holds the rows")
        assert not r.stdout


def test_standard_output_redirected_onto_the_input_is_refused(tiny_model_dir, tmp_path):
    """`classify v.jsonl >> v.jsonl` appended the rows to the input it was reading (exit 0; in
    windows, rows written before "changed while the job read it"); `-o /dev/stdout` there was
    refused. Standard input read from the same file is refused too."""
    src = _rows(tmp_path)
    before = src.read_bytes()
    job = [sys.executable, "-m", "mlxbatch", "classify", "--model", str(tiny_model_dir),
           "--labels", "spam,ham"]  # fmt: skip
    for args, stdin in (([str(src)], None), (["-"], src)):
        with src.open("ab") as out, stdin.open("rb") if stdin else open(os.devnull) as inp:
            r = subprocess.run(job + args, stdout=out, stdin=inp, stderr=subprocess.PIPE,
                               text=True, timeout=300)  # fmt: skip
        assert r.returncode == 2, r.stderr
        first = r.stderr.splitlines()[0]
        assert first.startswith("error: standard output is the input file"), r.stderr
        assert src.name in first and src.read_bytes() == before
    other = tmp_path / "rows.jsonl"
    with other.open("wb") as out:
        r = subprocess.run(job + [str(src)], stdout=out, stderr=subprocess.PIPE, text=True,
                           timeout=300)  # fmt: skip
    assert r.returncode == 0 and len(other.read_text().splitlines()) == 6, r.stderr
    # both streams on one device (a terminal, /dev/null) write into nothing that is read: the
    # first cut of this check refused them (samefile of /dev/stdout and /dev/stdin)
    r = subprocess.run(job + ["-"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 2 and "empty input" in r.stderr and "standard output" not in r.stderr


def test_tickets_does_not_replace_a_file_another_run_reads(tmp_path):
    """`tickets 5 -o in.jsonl` replaced the input of a running classify (which then failed:
    "changed while the job read it"); classify's own -o refuses that file."""
    from mlxbatch.io.inputs import open_rows

    src = _rows(tmp_path)
    before = src.read_bytes()
    with open_rows(str(src)) as reading:  # another run, reading it as its input
        r = invoke(["tickets", "5", "-o", src], tmp_path)
        one_line_error(r, "is being read by another mlxbatch run")
        next(iter(reading))
    assert src.read_bytes() == before
    assert invoke(["tickets", "5", "-o", src], tmp_path).exit_code == 0  # once it is done
    assert len(src.read_text().splitlines()) == 5


def test_a_partial_rotary_factor_is_read_only_by_the_family_that_rotates_part_of_a_head(tmp_path):
    """transformers' Qwen2 (Llama, Qwen3, Gemma 3) rotates the whole head whatever
    `partial_rotary_factor` says; mlxbatch rotated half of it (max logit diff 7e-3)."""
    import mlx.core as mx
    import numpy as np
    import torch
    import transformers
    from conftest import save_randomised

    from mlxbatch.model.load import load_model

    cfg = transformers.Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=96,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   num_hidden_layers=2, partial_rotary_factor=0.5)  # fmt: skip
    torch.manual_seed(0)
    path = save_randomised(transformers.AutoModelForCausalLM.from_config(cfg).float(),
                           tmp_path / "qwen2")  # fmt: skip
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    lm = load_model(path)
    tokens = lm.tokenizer.prompt("Classify.", "the app crashes when I log in " * 4)
    ours = np.array(lm.model.head(lm.model(mx.array([tokens])))[0])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([tokens])).logits[0].numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4)


def test_gemma_configs_whose_attention_mlxbatch_does_not_run_are_refused():
    """EmbeddingGemma's `use_bidirectional_attention` (max logit diff 1.16 against
    transformers, and --verify at 100%: the gold loop shares the forward) and a rope scaling
    of the sliding layers (0.71) were read past in silence."""
    import pytest

    from mlxbatch.errors import ModelError
    from mlxbatch.model.config import ModelArgs

    base = dict(model_type="gemma3_text", hidden_size=64, intermediate_size=96,
                num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                head_dim=16, vocab_size=300)  # fmt: skip
    ModelArgs.from_dict(base)
    for extra, said in (
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "linear", "factor": 4.0,
                                                    "rope_theta": 1e4}}},
         "rope_parameters.sliding_attention: rope scaling 'linear'"),
    ):  # fmt: skip
        with pytest.raises(ModelError, match=said):
            ModelArgs.from_dict(base | extra)
    vision = {"model_type": "gemma3", "text_config": base | {"use_bidirectional_attention": True}}
    with pytest.raises(ModelError, match="use_bidirectional_attention"):
        ModelArgs.from_dict(vision)


def test_a_checkpoint_whose_weights_file_is_cut_is_not_the_default_model(tiny_model_dir,
                                                                        tmp_path, monkeypatch):  # fmt: skip
    """A model folder with a 2-byte model.safetensors was taken as runnable: `models` did not
    mark it BROKEN and classify with no --model chose it, then failed ("truncated safetensors
    file"). Its tensor table is read now (headers alone)."""
    import shutil

    from mlxbatch.model.defaults import default_model_dir, not_runnable

    weights = tmp_path / "w"
    cut = shutil.copytree(tiny_model_dir, weights / "a-cut")
    (cut / "model.safetensors").write_bytes(b"\x00\x01")
    good = shutil.copytree(tiny_model_dir, weights / "b-good")
    for d in (cut, good):  # converted checkpoints, not synthetic ones (passed over)
        manifest = json.loads((d / "mlxbatch.json").read_text()) | {"synthetic": False}
        (d / "mlxbatch.json").write_text(json.dumps(manifest))
    assert "truncated safetensors file" in not_runnable(cut)
    assert not_runnable(good) is None
    monkeypatch.setenv("MLXBATCH_WEIGHTS", str(weights))
    said = []
    assert default_model_dir(said.append) == good
    assert "passing over" in said[0] and "a-cut" in said[0] and "truncated" in said[0]
    listed = json.loads(invoke(["models", "--json"], tmp_path).stdout)
    assert "truncated" in {m["name"]: m["broken"] for m in listed}["a-cut"]


def test_per_layer_quantization_that_contradicts_the_weights_is_one_line(tmp_path):
    """A converted 2-bit model whose config.json gives one layer an entry of its own (false,
    8 bits in groups of 32, a string): a traceback, exit 1 ("Received 2 parameters not in
    model", "Expected shape", "class_predicate must return a bool")."""
    import shutil

    from conftest import make_hf_checkpoint

    from mlxbatch.model.convert import convert_hf

    q2 = tmp_path / "q2"
    convert_hf(make_hf_checkpoint(tmp_path / "hf", "tied_gqa"), q2, q_bits=2, q_group_size=32)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "charged twice"}) + "\n")
    layer = "model.layers.0.mlp.down_proj"
    for n, entry in enumerate((False, {"bits": 8, "group_size": 32}, "weird")):
        model = shutil.copytree(q2, tmp_path / f"m{n}")
        cfg = json.loads((model / "config.json").read_text())
        cfg["quantization"][layer] = entry
        (model / "config.json").write_text(json.dumps(cfg))
        r = invoke(["classify", src, "--model", model, "--labels", "spam,ham"], tmp_path)
        one_line_error(r, "quantization")


def test_parity_says_in_one_line_when_transformers_cannot_run_a_checkpoint(tied_pair,
                                                                          monkeypatch):  # fmt: skip
    """transformers' own crash (a Qwen2 config with sliding layers and no window; Gemma with a
    partial rotary factor) was a traceback, exit 1, where mlx-lm's is one line, exit 2; the
    mlx-lm comparison still runs and is printed."""
    from mlxbatch.bench import parity

    def crashes(*args):
        raise TypeError("unsupported operand type(s) for -: 'NoneType' and 'int'")

    monkeypatch.setattr(parity, "hf_logits", crashes)
    hf, mlx = tied_pair
    r = invoke(["parity", hf, "--mlx", mlx])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "mlx-lm" in r.stdout and "PASS" in r.stdout
    last = r.stderr.splitlines()[-1]
    assert last.startswith("error: parity: transformers could not run the checkpoint (TypeError: ")
    assert "--no-mlx-lm" not in last


def test_a_truncation_that_keeps_none_of_the_text_is_refused(tiny_model_dir):
    """Where the prompt's suffix left room for the marker and nothing else, every row became
    the bare " […] ": one label for all, "59 duplicates scored once", --verify at 100%."""
    from mlxbatch import Classifier
    from mlxbatch.api.limits import MARK, Limit, prepare, tokenized, truncate

    engine = Classifier.load(tiny_model_dir).engine
    bare = len(engine.fed(tokenized(engine, MARK)))
    text = "the app crashes when I log in " * 10
    one = len(engine.fed(tokenized(engine, text[0] + MARK)))
    assert one > bare  # else this limit would not be the case
    assert truncate(engine, text, bare) is None
    said = prepare(engine, text, Limit(bare, "--max-tokens"), truncating=True)
    assert isinstance(said, str) and "too few tokens remain to truncate into" in said
    cut, n = truncate(engine, text, one)
    assert cut.startswith("t") and MARK in cut and n <= one  # one character or more of it


def test_the_python_api_gives_no_label_for_scores_that_are_not_finite(tiny_model_dir, tmp_path):
    """`predictions` of NaN scores answered the first label (argmax reads NaN first), and
    `classify` on a model with NaN weights answered it for every text, where classify's rows
    are error rows."""
    import shutil

    import mlx.core as mx
    import numpy as np
    import pytest

    from mlxbatch import Classifier
    from mlxbatch.errors import ModelError

    clf = Classifier.load(tiny_model_dir, labels=["spam", "ham", "eggs"])
    (said,) = clf.predictions(np.full((1, 3), np.nan, np.float32))
    assert said.label is None and not said.abstained
    model = shutil.copytree(tiny_model_dir, tmp_path / "nan")
    t = mx.load(str(model / "model.safetensors"))
    t["model.norm.weight"] = mx.full(t["model.norm.weight"].shape, float("nan"))
    mx.save_safetensors(str(model / "model.safetensors"), t)
    with pytest.raises(ModelError, match=r"^texts\[0\]: the model gave non-finite scores"):
        Classifier.load(model, labels=["spam", "ham"]).classify(["charged twice"])


def test_python_api_numbers_past_a_float_are_short_refusals(tiny_model_dir):
    """A prior weight of 10**400 raised a bare OverflowError; a min_confidence of 10**400 was
    refused with its 401 digits in the message."""
    import pytest

    from mlxbatch import Classifier
    from mlxbatch.errors import LabelError

    with pytest.raises(LabelError, match="past a float's range"):
        Classifier.load(tiny_model_dir, labels=["spam", "ham"], prior={"spam": 10**400, "ham": 1})
    with pytest.raises(LabelError) as e:
        Classifier.load(tiny_model_dir, labels=["spam", "ham"], min_confidence=10**400)
    assert len(str(e.value)) < 120 and "not between 0 and 1" in str(e.value)


def test_an_empty_chat_template_is_refused_not_read_as_none(tiny_model_dir, tmp_path):
    """`"chat_template": ""` in tokenizer_config.json (or an empty chat_template.jinja) was read
    as no template, and ChatML ran in its place; an empty chat_template.json was refused."""
    import shutil

    import pytest

    from mlxbatch import Classifier
    from mlxbatch.errors import ModelError

    for n, where in enumerate(("tokenizer_config.json", "chat_template.jinja")):
        model = shutil.copytree(tiny_model_dir, tmp_path / f"m{n}")
        if where == "tokenizer_config.json":
            cfg = json.loads((model / where).read_text())
            (model / where).write_text(json.dumps(cfg | {"chat_template": "  \n"}))
        else:
            (model / where).write_text("")
        with pytest.raises(ModelError, match=f"{where}.*an empty template"):
            Classifier.load(model, labels=["spam", "ham"])


def test_a_yaml_label_read_as_a_boolean_says_to_quote_it(tmp_path):
    """`yes:` / `no:` keys failed with "label True is not a non-empty string" and no hint."""
    import pytest

    from mlxbatch.errors import LabelError
    from mlxbatch.io.prompts import read_labels_file

    path = tmp_path / "labels.yaml"
    path.write_text("yes: the customer agrees\nno: the customer refuses\n")
    with pytest.raises(LabelError, match="label True is not a non-empty string .*quote the label"):
        read_labels_file(path)
    path.write_text('"yes": the customer agrees\n"no": the customer refuses\n')
    assert list(read_labels_file(path)) == ["yes", "no"]


def test_the_service_answers_non_finite_scores_with_its_json_500(tiny_model_dir):
    """A reply holding NaN scores failed in the JSON encoder: a text/plain 500 and a traceback
    in the log, after the request was counted a 200."""
    from pathlib import Path

    import numpy as np
    import pytest

    from mlxbatch import Classifier
    from mlxbatch.api.limits import Limit, prepare
    from mlxbatch.serve.errors import ApiError
    from mlxbatch.serve.service import ServeSpec, Service

    svc = Service(ServeSpec(model=Path(tiny_model_dir), name="m", labels=("spam", "ham")))
    svc.clf = Classifier.load(tiny_model_dir, labels=["spam", "ham"])
    items = [prepare(svc.clf.engine, t, Limit(512, "x"), False, i) for i, t in enumerate("ab")]
    probs = np.array([[0.4, 0.6], [np.nan, np.nan]], np.float32)
    with pytest.raises(ApiError) as e:
        svc._reply("r", items, probs)
    assert e.value.status == 500 and e.value.message.startswith(
        "input[1]: the model gave non-finite"
    )
    svc.close()


def test_json_dash_into_a_socket_is_written_to_the_open_stream(tiny_model_dir, tmp_path):
    """`--json -` opened /dev/stdout again, which Linux refuses on a socket (ENXIO), after the
    whole job had run."""
    import socket

    src, out = _rows(tmp_path), tmp_path / "rows.jsonl"
    assert invoke(["classify", src, "--model", tiny_model_dir, "--labels", "spam,ham",
                   "-o", out], tmp_path).exit_code == 0  # fmt: skip
    ours, theirs = socket.socketpair()
    with ours, theirs:
        r = subprocess.run([sys.executable, "-m", "mlxbatch", "eval", str(src), str(out),
                            "--gold-field", "gold", "--json", "-"], stdout=theirs,
                           stderr=subprocess.PIPE, text=True, timeout=300)  # fmt: skip
        theirs.close()
        got = b""
        while data := ours.recv(65536):
            got += data
    assert r.returncode == 0, r.stderr
    assert json.loads(got)["evaluated"] == 6
