"""The adversarial table: hostile-but-realistic inputs, paths, settings and checkpoints through
the CLI. Each ends in a correct result or in exit code 2 with a one-line `error:` message and
no traceback; none loses data or writes non-JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from click.testing import CliRunner

from mlxbatch.cli import cli

GOOD = '{"id": "a", "text": "I was charged twice"}\n{"id": "b", "text": "the app crashes"}\n'


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def safetensors_with_header(path: Path, header) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 64)


def edit_config(model: Path, **changes) -> None:
    cfg = json.loads((model / "config.json").read_text()) | changes
    (model / "config.json").write_text(json.dumps(cfg))


# Each case: setup(tmp, model) -> (args, stdin or None); then "error" + message, or a check.
def c_in(data, *extra, name="in.jsonl"):
    return lambda tmp, m: (["classify", write(tmp / name, data), "--model", m, *extra], None)


def c_stdin(data, *extra):
    return lambda tmp, m: (["classify", "-", "--model", m, *extra], data)


def c_out(setup_out, *extra, data=GOOD):
    def setup(tmp, m):
        src = write(tmp / "in.jsonl", data)
        return ["classify", src, "--model", m, "-o", setup_out(tmp, src), *extra], None

    return setup


def c_model(breakage):
    def setup(tmp, m):
        dst = tmp / "model"
        shutil.copytree(m, dst)
        breakage(dst)
        return ["classify", write(tmp / "in.jsonl", GOOD), "--model", dst], None

    return setup


def _hardlink(tmp, src):
    os.link(src, tmp / "link.jsonl")
    return tmp / "link.jsonl"


def _symlink(tmp, src):
    (tmp / "sym.jsonl").symlink_to(src)
    return tmp / "sym.jsonl"


def _foreign_part(tmp, src):
    write(tmp / "data.jsonl.part", "my own notes, not a journal\n")
    return tmp / "data.jsonl"


def c_report(*extra, data=GOOD + '{"id": "c", "text": "x", "gold": "billing"}\n'):
    def setup(tmp, m):
        src = write(tmp / "in.jsonl", data)
        args = ["classify", src, "--model", m, "--gold-field", "gold"]
        return args + [
            tmp / x if str(x).endswith((".jsonl", ".part", ".png", ".txt")) else x for x in extra
        ], None

    return setup


def c_eval(predictions: str, *extra):
    def setup(tmp, m):
        src = write(tmp / "in.jsonl", GOOD.replace("}", ', "gold": "billing"}'))
        pred = write(tmp / "pred.jsonl", predictions)
        return ["eval", src, pred, "--gold-field", "gold", *extra], None

    return setup


PRED = (
    '{"id": "a", "label": "billing", "scores": {"billing": 0.7, "technical": 0.3}}\n'
    '{"id": "b", "label": "technical", "scores": {"billing": 0.4, "technical": 0.6}}\n'
)


def c_into_model(option: str, name: str, *extra):
    """An output option pointed at a file of (a copy of) the model the run loads."""

    def setup(tmp, m):
        dst = tmp / "model"
        shutil.copytree(m, dst)
        src = write(tmp / "in.jsonl", GOOD.replace("}", ', "gold": "billing"}'))
        return ["classify", src, "--model", dst, option, dst / name, *extra], None

    return setup


def _input_is_part(tmp, m):
    src = write(tmp / "x.jsonl.part", GOOD)
    return ["classify", src, "--model", m, "-o", tmp / "x.jsonl"], None


def _header_list(m):
    safetensors_with_header(m / "model.safetensors", [1, 2, 3])


def _no_offsets(m):
    safetensors_with_header(
        m / "model.safetensors", {"model.norm.weight": {"dtype": "F32", "shape": [64]}}
    )


def _bad_dtype(m):
    safetensors_with_header(
        m / "model.safetensors",
        {"model.norm.weight": {"dtype": "Q7", "shape": [64], "data_offsets": [0, 256]}},
    )


def _overlap(m):
    safetensors_with_header(
        m / "model.safetensors",
        {
            "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
        },
    )


def _nan_weights(m):
    t = mx.load(str(m / "model.safetensors"))
    t["model.norm.weight"] = mx.full(t["model.norm.weight"].shape, float("nan"))
    mx.save_safetensors(str(m / "model.safetensors"), t)


def _int_weights(m):
    t = mx.load(str(m / "model.safetensors"))
    t["model.norm.weight"] = t["model.norm.weight"].astype(mx.int32)
    mx.save_safetensors(str(m / "model.safetensors"), t)


NESTED = '{"id": "n", "text": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
HUGE_INT = '{"id": "h", "text": ' + "9" * 5000 + "}\n"


def gz(text: str) -> bytes:
    import gzip

    return gzip.compress(text.encode())


def squeezed(kind: str, text: str) -> bytes:
    import bz2
    import lzma

    if kind == "zst":
        import zstandard

        return zstandard.ZstdCompressor().compress(text.encode())
    return {
        "gz": gz,
        "bz2": lambda t: bz2.compress(t.encode()),
        "xz": lambda t: lzma.compress(t.encode()),
    }[kind](text)


MAGIC = {"gz": b"\x1f\x8b", "bz2": b"BZh91AY&SY", "xz": b"\xfd7zXZ\x00", "zst": b"\x28\xb5\x2f\xfd"}
SQUEEZES = ["gz", "bz2", "xz"] + (["zst"] if importlib.util.find_spec("zstandard") else [])


def cut_short_cases() -> dict:
    """Every compression: rows then a member cut short, its magic alone, one member cut short."""
    cases = {}
    for k in SQUEEZES:
        whole = squeezed(k, GOOD)
        cases |= {
            f"{k}: rows, then a member cut short": (
                c_in(whole + squeezed(k, GOOD)[:12], name=f"in.jsonl.{k}"),
                "cut short or corrupt",
            ),
            f"{k}: rows, then its magic alone": (
                c_in(whole + MAGIC[k], name=f"in.jsonl.{k}"),
                "cut short or corrupt",
            ),
            f"{k}: only its magic": (c_in(MAGIC[k], name=f"in.jsonl.{k}"), "cut short or corrupt"),
            f"{k}: cut short on stdin": (c_stdin(whole[:-6]), "cut short or corrupt"),
        }
    return cases


JOURNAL = '{"mlxbatch_journal": 1, "fingerprint": "x", "settings": {}}\n'


def c_cut_journal(content: str, *extra):
    """A journal left without a finished header (a full disk): the run starts over."""

    def setup(tmp, m):
        write(tmp / "o.jsonl.part", content)
        return [
            "classify",
            write(tmp / "in.jsonl", GOOD),
            "--model",
            m,
            "-o",
            "o.jsonl",
            *extra,
        ], None

    return setup


ERRORS = {
    # input files
    "missing input": (
        (lambda t, m: (["classify", t / "nope.jsonl", "--model", m], None)),
        "no such file",
    ),
    "input is a directory": (lambda t, m: (["classify", t, "--model", m], None), "a directory"),
    "empty file": (c_in(""), "empty input"),
    "blank lines only": (c_in("\n  \n\n"), "empty input"),
    "json array": (c_in('[{"text": "a"}, {"text": "b"}]'), "JSON Lines"),
    "invalid json line": (c_in(GOOD + "{nope\n"), "invalid JSON"),
    "deeply nested json": (c_in(GOOD + NESTED), "invalid JSON"),
    "huge integer": (c_in(GOOD + HUGE_INT), "invalid JSON"),
    "not utf-8": (c_in(b'{"text": "caf\xe9"}\n'), "not UTF-8"),
    "csv unterminated quote": (
        c_in('id,text\n1,ok\n2,"never closed\n3,swallowed\n', name="in.csv"),
        "line 3: a quoted field",
    ),
    "csv without text column": (c_in("id,body\n1,x\n", name="in.csv"), "no 'text' column"),
    "csv empty": (c_in("", name="in.csv"), "empty file"),
    "csv wrong field count": (
        c_in("id,text\n1,a,b\n", name="in.csv"),
        "3 fields where the header has 2",
    ),
    "tsv wrong field count": (c_in("id\ttext\n1\ta\tb\n", name="in.tsv"), "3 fields"),
    "duplicate ids": (c_in('{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n'), "duplicate id"),
    "missing id field": (c_in(GOOD, "--id-field", "key"), "missing id field 'key'"),
    "missing text field": (c_in(GOOD, "--text-field", "body"), "missing text field 'body'"),
    "non-string text": (c_in('{"text": 5}\n'), "not a string"),
    "lone surrogate text": (
        c_in(GOOD + '{"id": "s", "text": "half \\ud800"}\n'),
        "line 3: text holds a lone surrogate",
    ),
    "lone surrogate id": (
        c_in(GOOD + '{"id": "\\ud800", "text": "x"}\n'),
        "line 3: id '\\ud800' holds a lone surrogate",
    ),
    "infinite id": (
        c_in(GOOD + '{"id": Infinity, "text": "x"}\n'),
        "line 3: id inf is not a finite number",
    ),
    "binary file": (c_in(bytes(range(256)) * 4, name="in.txt"), "not UTF-8"),
    "utf-16 csv": (c_in("id,text\n1,a\n".encode("utf-16"), name="in.csv"), "UTF-16 text"),
    "xlsx workbook": (c_in(b"PK\x03\x04" + bytes(60), name="in.xlsx"), "zip archive"),
    "csv with semicolons": (c_in("id;text\n1;a\n", name="in.csv"), "separated by ';'"),
    "forced csv on jsonl": (c_in(GOOD, "--input-format", "csv"), "no 'text' column"),
    # endless or runaway files: a cap each, one line (io/caps.py)
    "/dev/zero as the input": (
        lambda t, m: (["classify", "/dev/zero", "--model", m], None),
        "line 1: longer than 32 MiB, the cap on one line",
    ),
    "/dev/zero on stdin": (
        lambda t, m: (["classify", "-", "--model", m], open("/dev/zero", "rb")),
        "line 1: longer than 32 MiB",
    ),
    "a csv field past the row cap": (
        lambda t, m: c_in('id,text\n1,"' + "x\n" * (17 << 20), name="in.csv")(t, m),
        "data row 1 has a field longer than 32 MiB",
    ),
    "/dev/zero as --system-prompt-file": (
        c_in(GOOD, "--system-prompt-file", "/dev/zero"),
        "--system-prompt-file /dev/zero: larger than 1 MiB",
    ),
    "/dev/zero as --labels-file": (
        c_in(GOOD, "--labels-file", "/dev/zero"),
        "--labels-file /dev/zero: larger than 1 MiB",
    ),
    "/dev/zero as --examples": (
        c_in(GOOD, "--examples", "/dev/zero"),
        "line 1: longer than 32 MiB",
    ),
    # each names the file as --examples, and the label
    "empty --examples": (
        lambda t, m: c_in(GOOD, "--examples", write(t / "ex.jsonl", ""))(t, m),
        "error: --examples /",
    ),
    "missing --examples": (
        c_in(GOOD, "--examples", "nope.jsonl"),
        "--examples nope.jsonl: no such file",
    ),
    "an example's label a number": (
        lambda t, m: c_in(GOOD, "--examples", write(t / "ex.jsonl", '{"text": "x", "label": 5}\n'))(
            t, m
        ),
        "line 1: the 'label' field is a number, not a string",
    ),
    "too many examples": (
        lambda t, m: c_in(
            GOOD, "--examples", write(t / "ex.jsonl", '{"text": "x", "label": "billing"}\n' * 1001)
        )(t, m),
        "more than 1000 examples",
    ),
    "/dev/zero as --api-key-file": (
        lambda t, m: (["serve", "--model", m, "--api-key-file", "/dev/zero"], None),
        "--api-key-file /dev/zero: larger than 64 KiB",
    ),
    # labels and prompts
    "duplicate labels": (c_in(GOOD, "--labels", "billing,billing"), "duplicate label"),
    "one label": (c_in(GOOD, "--labels", "billing"), "at least two labels"),
    "empty label": (c_in(GOOD, "--labels", "billing,,x"), "empty label"),
    "blank labels": (c_in(GOOD, "--labels", " , "), "empty label"),
    "label not utf-8 on argv": (
        c_in(GOOD, "--labels", "billing,tech\udcffnical"),
        "holds a lone surrogate",
    ),
    "prompt not utf-8 on argv": (
        c_in(GOOD, "--system-prompt", "Classify \udcff"),
        "--system-prompt holds a lone surrogate",
    ),
    "examples text lone surrogate": (
        lambda t, m: (
            [
                "classify",
                write(t / "in.jsonl", GOOD),
                "--model",
                m,
                "--examples",
                write(t / "ex.jsonl", '{"text": "\\ud800", "label": "billing"}\n'),
            ],
            None,
        ),
        "line 1: text holds a lone surrogate",
    ),
    "labels file lone surrogate": (
        lambda t, m: (
            [
                "classify",
                write(t / "in.jsonl", GOOD),
                "--model",
                m,
                "--labels-file",
                write(t / "l.json", '{"billing": "money \\udfff", "technical": "bugs"}'),
            ],
            None,
        ),
        "description of 'billing' holds a lone surrogate",
    ),
    "prior 1e308": (
        c_in(GOOD, "--prior", "billing=1e308,technical=1,account=1"),
        "is a weight mistyped",
    ),
    "prior sum overflows": (
        c_in(GOOD, "--prior", "billing=1e308,technical=1e308,account=1e308"),
        "beyond a float",
    ),
    "prior named twice": (
        c_in(GOOD, "--prior", "billing=0.2,billing=0.5"),
        "--prior names 'billing' twice",
    ),
    "labels file whitespace twins": (
        lambda t, m: (
            [
                "classify",
                write(t / "in.jsonl", GOOD),
                "--model",
                m,
                "--labels-file",
                write(
                    t / "l.json", '{"billing": "money", "billing ": "cash", "technical": "bugs"}'
                ),
            ],
            None,
        ),
        "'billing ' is given twice",
    ),
    "labels file repeated key": (
        lambda t, m: (
            [
                "classify",
                write(t / "in.jsonl", GOOD),
                "--model",
                m,
                "--labels-file",
                write(t / "l.json", '{"billing": "money", "billing": "cash", "technical": "bugs"}'),
            ],
            None,
        ),
        "'billing' is given twice",
    ),
    "prefix labels": (c_in(GOOD, "--labels", "account,account access"), "token prefix"),
    "two system prompts": (
        lambda t, m: (
            [
                "classify",
                write(t / "in.jsonl", GOOD),
                "--model",
                m,
                "--system-prompt",
                "x",
                "--system-prompt-file",
                write(t / "p.txt", "y"),
            ],
            None,
        ),
        "not both",
    ),
    "missing prompt file": (
        c_in(GOOD, "--system-prompt-file", "/nonexistent/p.txt"),
        "cannot read the system prompt",
    ),
    "non-utf8 prompt file": (
        lambda t, m: (
            [
                "classify",
                write(t / "in.jsonl", GOOD),
                "--model",
                m,
                "--system-prompt-file",
                write(t / "p.txt", b"\xff\xfe"),
            ],
            None,
        ),
        "cannot read the system prompt",
    ),
    # outputs
    "-o is the input": (c_out(lambda t, s: s), "is the input file"),
    "-o hard link to input": (c_out(_hardlink), "is the input file"),
    "-o symlink to input": (c_out(_symlink), "is the input file"),
    "-o is a directory": (c_out(lambda t, s: t), "is a directory"),
    "-o under /proc": (c_out(lambda t, s: Path("/proc/mlxbatch-test.jsonl")), "/proc"),
    "-o on a full disk": (c_out(lambda t, s: Path("/dev/full")), "No space left"),
    "-o journal name is someone's file": (c_out(_foreign_part), "not written by mlxbatch"),
    "input named like the journal": (_input_is_part, "is the input file"),
    "-o is the examples file": (
        lambda t, m: (
            [
                "classify",
                write(t / "in.jsonl", GOOD),
                "--model",
                m,
                "--examples",
                write(t / "ex.jsonl", '{"text": "x", "label": "billing"}\n'),
                "-o",
                t / "ex.jsonl",
            ],
            None,
        ),
        "is the input file",
    ),
    "-o is another run's journal": (
        c_out(lambda t, s: write(t / "k.jsonl.part", JOURNAL)),
        "is the journal of another mlxbatch run",
    ),
    "--json onto another run's journal": (
        lambda t, m: (
            c_report("--json", "k.jsonl.part")(t, m) if write(t / "k.jsonl.part", JOURNAL) else None
        ),
        "is the journal of another mlxbatch run",
    ),
    "-o too long a name for its journal": (
        c_out(lambda t, s: t / ("x" * 246 + ".jsonl")),
        "the name of its journal is longer than",
    ),
    "--plot too long a name": (c_report("--plot", "y" * 252 + ".png"), "--plot"),
    "--json too long a name": (
        lambda t, m: c_report("--json", t / ("j" * 256))(t, m),
        "the name is longer than",
    ),
    "--resume on /dev/null": (
        c_out(lambda t, s: Path("/dev/null"), "--resume"),
        "regular output file",
    ),
    "--resume without -o": (c_in(GOOD, "--resume"), "--resume needs -o"),
    # evaluation reports
    "--json onto the input": (c_report("--json", "in.jsonl"), "--json"),
    "--plot onto the input": (c_report("--plot", "in.jsonl"), "would overwrite"),
    "--json onto -o": (c_report("-o", "o.jsonl", "--json", "o.jsonl"), "would overwrite"),
    "--json onto the journal": (
        c_report("-o", "o.jsonl", "--json", "o.jsonl.part"),
        "would overwrite",
    ),
    "--json and --plot one path": (
        c_report("--json", "r.png", "--plot", "r.png"),
        "different paths",
    ),
    "--plot not an image name": (c_report("--plot", "r.txt"), "must end in .png"),
    "--json in a missing directory": (
        c_report("--json", "/nonexistent-mlxbatch/r.json"),
        "does not exist",
    ),
    "--gold-field no row has": (
        c_report("--gold-field", "golden"),
        "no row has the gold field 'golden'",
    ),
    "eval --json onto predictions": (
        lambda t, m: c_eval(PRED, "--json", t / "pred.jsonl")(t, m),
        "would overwrite",
    ),
    "eval --json onto the input": (
        lambda t, m: c_eval(PRED, "--json", t / "in.jsonl")(t, m),
        "would overwrite",
    ),
    "eval rows not predictions": (
        c_eval('{"id": "a", "label": "billing"}\n{"id": "b"}\n'),
        "row 1: neither an error row",
    ),
    "eval ids out of order": (
        c_eval("".join(reversed(PRED.splitlines(True)))),
        "row 1: id 'b' where the input's row 1 has id 'a'",
    ),
    "eval NaN score": (
        c_eval(PRED.replace("0.3", "NaN")),
        "row 1: the score of 'technical' is nan, not a probability in [0, 1]",
    ),
    "eval score 5.0": (
        c_eval(PRED.replace("0.6", "5.0")),
        "row 2: the score of 'technical' is 5.0, not a probability",
    ),
    "eval score 1e999": (
        c_eval(PRED.replace("0.7", "1e999")),
        "row 1: the score of 'billing' is 1e999",  # named as written
    ),
    "eval negative score": (
        c_eval(PRED.replace("0.4", "-0.4")),
        "row 2: the score of 'billing' is -0.4",
    ),
    "eval no gold field": (c_eval(PRED, "--gold-field", "golden"), "no row has the gold field"),
    "bench --sweep not a number": (
        lambda t, m: (
            ["bench", "--model", m, "--tickets", "5", "--sweep", "512,abc", "--no-peers"],
            None,
        ),
        "--sweep: 'abc'",
    ),
    "bench --sweep zero": (
        lambda t, m: (
            ["bench", "--model", m, "--tickets", "5", "--sweep", "0", "--no-peers"],
            None,
        ),
        "--sweep: '0'",
    ),
    "bench --tickets 0": (
        lambda t, m: (["bench", "--model", m, "--tickets", "0", "--no-peers"], None),
        "--tickets 0",
    ),
    "bench no modes": (
        lambda t, m: (
            ["bench", "--model", m, "--tickets", "5", "--modes", ",", "--no-peers"],
            None,
        ),
        "--modes: choose at least one",
    ),
    "bench --against missing, before running": (
        lambda t, m: (
            [
                "bench",
                "--model",
                m,
                "--tickets",
                "5",
                "--against",
                t / "nope",
                "--no-peers",
                "--modes",
                "gold",
            ],
            None,
        ),
        "not found",
    ),
    "bench --json onto its tickets": (
        lambda t, m: (
            [
                "bench",
                "--model",
                m,
                "--tickets",
                write(t / "b.jsonl", GOOD),
                "--json",
                t / "b.jsonl",
                "--no-peers",
                "--sweep",
                "",
            ],
            None,
        ),
        "would overwrite",
    ),
    "examples longer than the context": (
        lambda t, m: (
            [
                "classify",
                write(t / "in.jsonl", GOOD),
                "--model",
                (c_model(lambda d: edit_config(d, max_position_embeddings=256))(t, m)[0][-1]),
                "--examples",
                write(
                    t / "ex.jsonl",
                    '{"text": "' + "charged twice " * 200 + '", "label": "billing"}\n',
                ),
            ],
            None,
        ),
        "no room left in the model's context of 256 tokens",
    ),
    "-o onto the model's weights": (
        c_into_model("-o", "model.safetensors"),
        "not .safetensors",
    ),  # refused by its suffix, before the model's own file check
    "--json onto the model's weights": (
        c_into_model("--json", "model.safetensors", "--gold-field", "gold"),
        "mlxbatch writes nothing there",
    ),  # beside a model's files: refused before the model is resolved
    # settings
    "budget cannot fit": (c_in(GOOD, "--batch-tokens", 10**9), "--batch-tokens"),
    "unknown option": (c_in(GOOD, "--fast-please"), "No such option"),
    "max-tokens below minimum": (c_in(GOOD, "--max-tokens", 2), "--max-tokens"),
    "unknown mode": (c_in(GOOD, "--mode", "fast"), "--mode"),
    "unknown dtype": (c_in(GOOD, "--dtype", "int4"), "--dtype"),
    # models
    "missing model": (
        lambda t, m: (["classify", write(t / "in.jsonl", GOOD), "--model", t / "nope"], None),
        "not found",
    ),
    "config not json": (c_model(lambda m: write(m / "config.json", "{nope")), "not valid JSON"),
    "config is a list": (c_model(lambda m: write(m / "config.json", "[1, 2]")), "not an object"),
    "config string number": (
        c_model(lambda m: edit_config(m, hidden_size="64")),
        "hidden_size must be a positive integer",
    ),
    "config zero heads": (
        c_model(lambda m: edit_config(m, num_attention_heads=0)),
        "num_attention_heads must be a positive integer",
    ),
    "config negative vocab": (
        c_model(lambda m: edit_config(m, vocab_size=-5)),
        "vocab_size must be",
    ),
    "config bool tie": (
        c_model(lambda m: edit_config(m, tie_word_embeddings="yes")),
        "tie_word_embeddings",
    ),
    "vocab below control tokens": (
        c_model(lambda m: edit_config(m, vocab_size=1000)),
        "do not belong together",
    ),
    "config a billion layers": (
        c_model(lambda m: edit_config(m, num_hidden_layers=10**9)),
        "num_hidden_layers 1,000,000,000 is beyond",
    ),
    "config layers as 1e9": (
        c_model(lambda m: edit_config(m, num_hidden_layers=1e9)),
        "num_hidden_layers",
    ),
    "config huge hidden size": (
        c_model(lambda m: edit_config(m, hidden_size=2**40, num_attention_heads=2**10)),
        "hidden_size",
    ),
    "config huge vocab": (c_model(lambda m: edit_config(m, vocab_size=10**12)), "vocab_size"),
    "config huge heads": (
        c_model(lambda m: edit_config(m, num_attention_heads=2**30, num_key_value_heads=2**30)),
        "num_attention_heads",
    ),
    "integer dense weight": (c_model(_int_weights), "a dense weight must be one of"),
    "safetensors header is a list": (c_model(_header_list), "corrupt safetensors header"),
    "safetensors missing offsets": (c_model(_no_offsets), "data_offsets"),
    "safetensors unknown dtype": (c_model(_bad_dtype), "unknown dtype"),
    "safetensors overlapping ranges": (c_model(_overlap), "overlap"),
    "no tokenizer": (c_model(lambda m: (m / "tokenizer.json").unlink()), "tokenizer.json"),
    "nan weights": (c_model(_nan_weights), "non-finite scores"),
    # other commands
    "tickets -o a directory": (lambda t, m: (["tickets", "5", "-o", t], None), "is a directory"),
    "init-random negative seed": (
        lambda t, m: (["init-random", t / "x", "--preset", "tiny", "--seed", -1], None),
        "--seed",
    ),
    "init-random over a model": (
        lambda t, m: (["init-random", m, "--preset", "tiny"], None),
        "--force",
    ),
    "convert onto its source": (lambda t, m: (["convert", m, m], None), "source checkpoint"),
    "convert over a model": (
        lambda t, m: (["convert", m, shutil.copytree(m, t / "other")], None),
        "--force",
    ),
    "bench bad tickets file": (
        lambda t, m: (
            [
                "bench",
                "--model",
                m,
                "--tickets",
                write(t / "b.jsonl", "{nope\n"),
                "--no-peers",
                "--sweep",
                "",
            ],
            None,
        ),
        "invalid JSON",
    ),
    # input and output formats
    "csv on stdin without a text column": (c_stdin("id,body\n1,x\n2,y\n"), "no 'text' column"),
    "tsv on stdin without a text column": (c_stdin("id\tbody\n1\tx\n2\ty\n"), "no 'text' column"),
    "tsv.gz on stdin without a text column": (c_stdin(gz("id\tbody\n1\tx\n")), "no 'text' column"),
    "tsv named without a suffix, no text column": (
        c_in("id\tbody\n1\tx\n", name="tickets"),
        "no 'text' column",
    ),
    "csv named without a suffix, no text column": (
        c_in("id,body\n1,x\n", name="tickets"),
        "no 'text' column",
    ),
    "csv header repeats a column": (
        c_in("id,text,text\n1,a,b\n", name="in.csv"),
        "repeats the column 'text'",
    ),
    "json record repeats a key": (
        c_in('{"id": "a", "text": "x", "text": "y"}\n'),
        "line 1: the key 'text' appears twice",
    ),
    "gzip cut short": (c_in(gz(GOOD)[:-12], name="in.jsonl.gz"), "cut short or corrupt"),
    **cut_short_cases(),
    "-o .json": (c_out(lambda t, s: t / "o.json"), "mlxbatch writes .jsonl, .jsonl.gz, .csv"),
    "-o .parquet": (c_out(lambda t, s: t / "o.parquet"), "mlxbatch writes .jsonl"),
    "-o .xlsx": (c_out(lambda t, s: t / "o.xlsx"), "mlxbatch writes .jsonl"),
    "-o a FIFO named .csv": (
        c_out(lambda t, s: os.mkfifo(t / "f.csv") or t / "f.csv"),
        "a device or FIFO is written as JSONL",
    ),
    "ids 1 and '1' into a csv": (
        c_in('{"id": 1, "text": "a"}\n{"id": "1", "text": "b"}\n', "-o", "o.csv"),
        "one id in a CSV output",
    ),
    "tickets -o .tsv (texts hold line breaks)": (
        lambda t, m: (["tickets", "5", "-o", t / "t.tsv"], None),
        "which TSV (no quoting) cannot hold",
    ),
    "tickets -o .json": (
        lambda t, m: (["tickets", "5", "-o", t / "t.json"], None),
        "mlxbatch writes .jsonl",
    ),
}


def rows_of(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]  # strict: no NaN accepted


OKS = {
    "nested json skipped": (c_in(GOOD + NESTED, "--on-error", "skip", "-o", "o.jsonl"), 3),
    "huge integer skipped": (c_in(GOOD + HUGE_INT, "--on-error", "skip", "-o", "o.jsonl"), 3),
    "csv trailing blank lines": (
        c_in('id,text\n1,"a, b"\n2,c\n\n\n', "-o", "o.jsonl", name="in.csv"),
        2,
    ),
    "csv with BOM": (c_in("\ufeffid,text\n1,a\n2,b\n", "-o", "o.jsonl", name="in.csv"), 2),
    "jsonl with BOM": (c_in("\ufeff" + GOOD, "-o", "o.jsonl"), 2),
    "text with BOM": (c_in("\ufefffirst\nsecond\n", "-o", "o.jsonl", name="in.txt"), 2),
    "tsv keeps quotes": (
        c_in(
            'id\ttext\n1\t"Urgent" please\n2\t"open quote\n3\tlast\n',
            "-o",
            "o.jsonl",
            name="in.tsv",
        ),
        3,
    ),
    "huge csv field truncated": (
        c_in(
            "id,text\n1," + "word " * 40_000 + "\n2,short\n",
            "--too-long",
            "truncate",
            "--max-tokens",
            64,
            "-o",
            "o.jsonl",
            name="in.csv",
        ),
        2,
    ),
    "jsonl without a suffix": (c_in(GOOD, "-o", "o.jsonl", name="tickets"), ["a", "b"]),
    "--input-format tsv on classify": (
        c_in("id\ttext\nx\ta, b\n", "--input-format", "tsv", "-o", "o.jsonl", name="in.data"),
        ["x"],
    ),
    "csv with another suffix": (
        c_in("id,text\nx,a\ny,b\n", "-o", "o.jsonl", name="in.csv.bak"),
        ["x", "y"],
    ),
    "max-batch huge": (c_in(GOOD, "--max-batch", 10**7, "-o", "o.jsonl"), 2),
    "0-byte journal (a full disk)": (c_cut_journal(""), 2),
    "0-byte journal, --resume": (c_cut_journal("", "--resume"), 2),
    "journal header cut short, --resume": (
        c_cut_journal('{"mlxbatch_journal": 1, "fing', "--resume"),
        2,
    ),
    "bad rows skipped": (
        c_in(GOOD + "{nope\n" + '{"id": "c"}\n', "--on-error", "skip", "-o", "o.jsonl"),
        4,
    ),
    "gzipped jsonl": (c_in(gz(GOOD), "-o", "o.jsonl", name="in.jsonl.gz"), ["a", "b"]),
    "gzip named .jsonl": (c_in(gz(GOOD), "-o", "o.jsonl"), ["a", "b"]),
    "gzip on stdin": (c_stdin(gz(GOOD), "-o", "o.jsonl"), ["a", "b"]),
    "csv.gz": (c_in(gz("id,text\nx,a\ny,b\n"), "-o", "o.jsonl", name="in.csv.gz"), ["x", "y"]),
    "parquet": (
        lambda t, m: c_in(
            parquet_of([{"id": "x", "text": "a"}, {"id": "y", "text": "b"}]),
            "-o",
            "o.jsonl",
            name="in.parquet",
        )(t, m),
        ["x", "y"],
    ),
    "wide csv header on stdin": (
        c_stdin(
            ",".join(f"c{i}" for i in range(300))
            + ",id,text\n"
            + "," * 300
            + "x,a\n"
            + "," * 300
            + "y,b\n",
            "-o",
            "o.jsonl",
        ),
        ["x", "y"],
    ),
    "CR-only line ends": (c_in("first\rsecond\rthird\r", "-o", "o.jsonl", name="in.txt"), 3),
}


def invoke(args, stdin, cwd):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, [str(a) for a in args], input=stdin)
    finally:
        os.chdir(old)


@pytest.mark.parametrize("name", list(ERRORS))
def test_refused_with_one_line(name, tiny_model_dir, tmp_path):
    setup, message = ERRORS[name]
    args, stdin = setup(tmp_path, tiny_model_dir)
    before = {
        p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size < 10**7
    }
    r = invoke(args, stdin, tmp_path)
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit), (
        r.exception
    )
    assert r.exit_code == 2, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert all(x.startswith("  ") for x in lines[1:]), r.stderr  # details only, indented
    assert "Traceback" not in r.output
    for p, data in before.items():  # nothing the user had was changed
        assert p.read_bytes() == data, p


@pytest.mark.parametrize("name", list(OKS))
def test_handled_correctly(name, tiny_model_dir, tmp_path):
    setup, want = OKS[name]  # how many rows, or their ids in order
    args, stdin = setup(tmp_path, tiny_model_dir)
    r = invoke(args, stdin, tmp_path)
    assert r.exit_code == 0, r.output
    out = rows_of(tmp_path / "o.jsonl")
    if isinstance(want, list):
        assert [x["id"] for x in out] == want and all("scores" in x for x in out)
    else:
        assert len(out) == want
    ids = [x["id"] for x in out if x["id"] is not None]
    assert len(ids) == len(set(ids))


def test_tsv_fields_are_not_unquoted(tiny_model_dir, tmp_path):
    src = write(tmp_path / "in.tsv", 'id\ttext\n1\t"Urgent" please\n2\t"open\n3\tlast\n')
    from mlxbatch.io.inputs import read_rows

    rows, fmt = read_rows(str(src))
    assert fmt == "tsv" and [r.text for r in rows] == ['"Urgent" please', '"open', "last"]


def test_stdin_formats_are_detected(tiny_model_dir, tmp_path):
    for data in (
        "\ufeff" + GOOD,
        "id,text\n1,a\n2,b\n",
        "id\ttext\n1\ta\n2\tb\n",
        "plain\nlines\n",
    ):
        r = invoke(["classify", "-", "--model", tiny_model_dir], data, tmp_path)
        assert r.exit_code == 0, r.output
        rows = [json.loads(x) for x in r.stdout.splitlines()]
        assert len(rows) == 2 and all("label" in x for x in rows), data


def test_dev_null_and_stdout_outputs(tiny_model_dir, tmp_path):
    src = write(tmp_path / "in.jsonl", GOOD)
    r = invoke(["classify", src, "--model", tiny_model_dir, "-o", "/dev/null"], None, tmp_path)
    assert r.exit_code == 0 and Path("/dev/null").is_char_device()
    r = invoke(["classify", src, "--model", tiny_model_dir, "-o", "-"], None, tmp_path)
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 2


def test_nan_weights_give_error_rows_and_fail_verify(tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    _nan_weights(model)
    src, out = write(tmp_path / "in.jsonl", GOOD), tmp_path / "o.jsonl"
    r = invoke(
        ["classify", src, "--model", model, "-o", out, "--on-error", "skip", "--verify"],
        None,
        tmp_path,
    )
    assert r.exit_code == 1, r.output  # verify: non-finite is a disagreement
    rows = rows_of(out)  # strict JSON
    assert all("non-finite" in x["error"] and "label" not in x for x in rows)


def test_truncation_meets_the_limit_on_character_boundaries(tiny_model_dir, tmp_path):
    texts = ["🚀" * 50, "é" * 300, "数据" * 100 + " tail", "word " * 200]
    src = write(tmp_path / "in.txt", "\n".join(texts) + "\n")
    out = tmp_path / "o.jsonl"
    r = invoke(
        [
            "classify",
            src,
            "--model",
            tiny_model_dir,
            "--max-tokens",
            12,
            "--too-long",
            "truncate",
            "-o",
            out,
        ],
        None,
        tmp_path,
    )
    assert r.exit_code == 0, r.output
    for row in rows_of(out):
        if "error" in row:
            assert "too few tokens remain" in row["error"]
        else:
            assert row["truncated"]["to_tokens"] <= 12
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.api.limits import truncate

    clf = Classifier.load(tiny_model_dir)
    for t in texts:
        cut = truncate(clf.engine, t, 16)
        assert cut is not None and "\ufffd" not in cut[0] and cut[1] <= 16
        assert len(clf.engine.fed(clf.engine.prompt(cut[0]))) == cut[1]


def test_a_second_run_on_the_same_output_is_refused_with_its_pid(tiny_model_dir, tmp_path):
    from mlxbatch.io.sinks import Journal

    out = tmp_path / "o.jsonl"
    # the holder keeps the lock until it is killed, however long the refused runs take
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom pathlib import Path\n"
            "from mlxbatch.io.sinks import Journal\n"
            f"j = Journal(Path({str(out)!r}), {{'fingerprint': 'x', 'settings': {{}}}}, False)\n"
            "print('ready', flush=True)\nsys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        src = write(tmp_path / "in.jsonl", GOOD)
        for extra in ([], ["--resume"]):
            r = invoke(
                ["classify", src, "--model", tiny_model_dir, "-o", out, *extra], None, tmp_path
            )
            assert r.exit_code == 2
            assert f"another run is writing this output (pid {holder.pid})" in r.stderr, r.stderr
        with pytest.raises(Exception, match="another run"):
            Journal(out, {"fingerprint": "x"}, True)
    finally:
        holder.kill()
        holder.wait()


def test_resume_with_another_dtype_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    from mlxbatch.engine.engine import Engine

    src, out = write(tmp_path / "in.jsonl", GOOD * 1), tmp_path / "o.jsonl"

    def interrupted(self, *a, **k):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(Engine, "run", interrupted)
    r = invoke(
        ["classify", src, "--model", tiny_model_dir, "-o", out, "--dtype", "float32"],
        None,
        tmp_path,
    )
    assert r.exit_code == 130
    monkeypatch.undo()
    r = invoke(
        ["classify", src, "--model", tiny_model_dir, "-o", out, "--dtype", "float16", "--resume"],
        None,
        tmp_path,
    )
    assert r.exit_code == 2 and "different --dtype" in r.stderr, r.output


def test_converting_a_synthetic_model_keeps_it_synthetic(tiny_model_dir, tmp_path):
    r = invoke(["convert", tiny_model_dir, tmp_path / "copy"], None, tmp_path)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "copy/mlxbatch.json").read_text())["synthetic"] is True
    r = invoke(["convert", tiny_model_dir, tmp_path / "copy", "--force"], None, tmp_path)
    assert r.exit_code == 0, r.output


def test_parity_without_torch_names_the_extra(tiny_model_dir, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("torch", "transformers") else real(name, *a),
    )
    r = invoke(["parity", tiny_model_dir], None, tmp_path)
    assert r.exit_code == 2 and "mlxbatch[parity]" in r.stderr


@pytest.mark.parametrize("limit", ["lots", "inf", "nan", "-5G", "0", "1e400"])
def test_bad_memory_limit_is_named(tiny_model_dir, tmp_path, monkeypatch, limit):
    monkeypatch.setenv("MLXBATCH_MEMORY_LIMIT", limit)
    r = invoke(
        ["classify", write(tmp_path / "in.jsonl", GOOD), "--model", tiny_model_dir], None, tmp_path
    )
    assert r.exit_code == 2 and "MLXBATCH_MEMORY_LIMIT" in r.stderr, r.output


def test_output_onto_the_file_redirected_to_stdin_is_refused(tiny_model_dir, tmp_path):
    src = write(tmp_path / "in.jsonl", GOOD)
    with open(src, "rb") as stdin:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "mlxbatch",
                "classify",
                "-",
                "--model",
                str(tiny_model_dir),
                "-o",
                str(src),
            ],
            stdin=stdin,
            capture_output=True,
            text=True,
        )
    assert r.returncode == 2 and "is the input file" in r.stderr
    assert src.read_text() == GOOD


def test_the_printed_memory_bound_never_exceeds_the_machine(tiny_model_dir, tmp_path):
    from mlxbatch.runtime.memory import total_bytes

    src = write(tmp_path / "in.jsonl", GOOD)
    r = invoke(
        [
            "classify",
            src,
            "--model",
            tiny_model_dir,
            "--max-batch",
            10**7,
            "--labels",
            "billing issue,account access,technical problem",
        ],
        None,
        tmp_path,
    )
    assert r.exit_code == 0, r.output
    bound = float(r.stderr.split("(bound ")[1].split(" GiB")[0])
    assert 0 < bound * 2**30 < total_bytes()


def test_table_is_large_enough():
    assert len(ERRORS) + len(OKS) >= 60


def parquet_of(rows: list[dict]) -> bytes:
    import io

    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def test_outputs_are_what_their_names_say_and_read_back(tiny_model_dir, tmp_path):
    import gzip

    from mlxbatch.io.inputs import read_rows

    src = write(tmp_path / "in.jsonl", GOOD.replace("}", ', "gold": "billing"}'))
    for name in ("o.jsonl.gz", "o.csv", "o.tsv", "o.csv.gz"):
        r = invoke(["classify", src, "--model", tiny_model_dir, "-o", name], None, tmp_path)
        assert r.exit_code == 0, r.output
        assert not (tmp_path / (name + ".part")).exists()
    data = (tmp_path / "o.jsonl.gz").read_bytes()
    assert data[:2] == b"\x1f\x8b" and len(gzip.decompress(data).splitlines()) == 2
    r = invoke(["eval", src, "o.jsonl.gz", "--gold-field", "gold"], None, tmp_path)
    assert r.exit_code == 0 and "accuracy" in r.stdout.lower(), r.output
    for name, fmt in (("o.csv", "csv"), ("o.tsv", "tsv"), ("o.csv.gz", "csv")):
        rows, got = read_rows(str(tmp_path / name), text_field="label")
        assert got == fmt and [r.id for r in rows] == ["a", "b"] and all(r.text for r in rows)


def test_tickets_are_written_by_suffix(tmp_path):
    from mlxbatch.bench.workload import generate
    from mlxbatch.io.inputs import read_rows

    want = [(t["id"], t["text"], {"intent": t["intent"]}) for t in generate(7, seed=3)]
    for name, fmt in (("t.csv", "csv"), ("t.jsonl.gz", "jsonl"), ("t.jsonl", "jsonl")):
        r = invoke(["tickets", "7", "--seed", "3", "-o", tmp_path / name], None, tmp_path)
        assert r.exit_code == 0, r.output
        rows, got = read_rows(str(tmp_path / name), fields=("intent",))
        assert got == fmt and [(x.id, x.text, x.fields) for x in rows] == want, name


def test_missing_extras_are_named_in_one_line(tiny_model_dir, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("pyarrow", "zstandard") else real(name, *a),
    )
    for name, data, extra in (
        ("in.parquet", b"PAR1" + bytes(20), "pip install 'mlxbatch[parquet]'"),
        ("in.jsonl.zst", b"\x28\xb5\x2f\xfd" + bytes(20), "pip install 'mlxbatch[zstd]'"),
    ):
        r = invoke(
            ["classify", write(tmp_path / name, data), "--model", tiny_model_dir], None, tmp_path
        )
        assert r.exit_code == 2 and extra in r.stderr, r.output
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: ")


@pytest.mark.parametrize(
    "name",
    [
        "model.safetensors",
        "model.gguf",
        "tokenizer.model",
        "chat_template.jinja",
        "run.py",
        "pytorch_model.bin",
    ],
)
def test_outputs_never_take_a_weights_tokenizer_or_code_suffix(tiny_model_dir, tmp_path, name):
    """`tickets 5 -o tiny/model.safetensors` replaced the model's weights with JSONL (fresh
    adversarial pass): such suffixes are refused for every output, whoever's file."""
    target = tmp_path / name
    target.write_bytes(b"precious")
    for args in (
        ["tickets", "5", "-o", target],
        [
            "classify",
            write(tmp_path / "in.txt", b"a ticket\n"),
            "--model",
            tiny_model_dir,
            "-o",
            target,
        ],
    ):
        r = invoke(args, None, tmp_path)
        assert r.exit_code == 2 and r.stderr.startswith("error: ") and name in r.stderr, r.output
        assert target.read_bytes() == b"precious"


def test_tickets_refuses_a_count_no_disk_could_hold(tmp_path):
    r = invoke(["tickets", "99999999999999", "-o", "/dev/null"], None, tmp_path)
    assert r.exit_code == 2 and r.stderr.startswith("error: ") and "1000000000" in r.stderr, (
        r.output
    )


def test_eval_of_predictions_that_do_not_exist_says_so(tmp_path):
    """A newcomer's pass: a missing predictions file was "not a JSONL output of mlxbatch
    classify (...: no such file)"."""
    src = write(tmp_path / "in.jsonl", GOOD.replace("}", ', "gold": "billing"}'))
    missing = tmp_path / "nope.jsonl"
    r = invoke(["eval", src, missing, "--gold-field", "gold"], None, tmp_path)
    assert r.exit_code == 2 and r.stderr.strip() == f"error: {missing}: no such file", r.stderr
