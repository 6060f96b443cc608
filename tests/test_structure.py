"""The seams: row layouts without a model, executors forced either way, the job plan on resume,
and imports that only point down the layers."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from fast_path import score_batch

from mlxbatch.engine.layout import PAD_ID, RowLayout, batch_mask

PACKAGE = Path(__file__).parent.parent / "mlxbatch"
LAYERS = [
    "errors",
    "runtime",
    "model",
    "engine",
    "io",
    "api",
    "jobs",
    "serve",
    "bench",
    "cli",
]  # bottom to top
# def line to last line in the formatter's layout (a long call puts each argument on a line of
# its own): what reads in one screen
MAX_FUNCTION_LINES = 60
# a click command parses, builds the spec, calls one library function and prints
MAX_COMMAND_LINES = 40


def test_row_layout_builds_tokens_positions_and_masks_without_a_model():
    prefix = [1, 2, 3]
    prompts = [[1, 2, 3, 7, 8], [1, 2, 9], [1, 2, 3, 4]]  # row 1 shares only 2 prefix slots
    lay = RowLayout.build(prompts, prefix, label_slots=2)
    assert lay.prefix_width == 3 and lay.batch == 3 and lay.width == 2 and lay.capacity == 7
    assert lay.fed == ((7, 8), (9,), (4,))
    assert lay.shared.tolist() == [3, 2, 3] and lay.positions().tolist() == [3, 2, 3]
    assert lay.tokens().tolist() == [[7, 8], [9, PAD_ID], [4, PAD_ID]]
    assert lay.last().tolist() == [1, 0, 0]
    np.testing.assert_array_equal(lay.mask(), batch_mask(3, [3, 2, 3], [2, 1, 1], 2, 3, 2))
    assert lay.label_positions(2).tolist() == [5, 5, 3, 3, 4, 4]
    lm = lay.label_mask(2)
    assert lm.shape == (6, 1, 2, 7)
    # row 1's label rows: prefix slots 0-1, its one token (slot 3), then the label slots, causal
    assert lm[2, 0].astype(int).tolist() == [[1, 1, 0, 1, 0, 1, 0], [1, 1, 0, 1, 0, 1, 1]]


def test_a_prompt_is_never_fed_empty():
    lay = RowLayout.build([[1, 2, 3]], [1, 2, 3], label_slots=0)
    assert lay.fed == ((3,),) and lay.shared.tolist() == [2]


def test_both_executors_give_the_same_scores(tiny_model_dir):
    from mlxbatch.engine.engine import Engine
    from mlxbatch.engine.labels import LabelSet
    from mlxbatch.engine.prompt import default_system_prompt
    from mlxbatch.model.load import load_model
    from mlxbatch.runtime.executor import CpuLanes, SingleStream

    lm = load_model(tiny_model_dir)
    names = ("billing", "account access", "technical")
    labels = LabelSet.build(names, lm.tokenizer.label, lm.model.args.vocab_size)
    texts = ["charged twice", "cannot log in at all", "x", "the app crashes " * 5, "\n\nhi"]
    out = {}
    for name, ex in (("single", SingleStream()), ("lanes", CpuLanes(2)), ("three", CpuLanes(3))):
        e = Engine(lm, labels, default_system_prompt(names), executor=ex)
        out[name] = score_batch(e, [e.prompt(t) for t in texts])
    np.testing.assert_allclose(out["single"], out["lanes"], atol=1e-6)
    np.testing.assert_allclose(out["single"], out["three"], atol=1e-6)


def test_lanes_run_whole_batches_and_return_them_in_order(tiny_model_dir):
    """A job's batches on CPU lanes: each batch's scores are those of the batch alone on one
    stream (to the bit: a batch runs whole on one lane), in the batches' order, whichever lane
    was free; closing early stops the lanes and leaves the executor usable."""
    from mlxbatch.engine.engine import Engine
    from mlxbatch.engine.labels import LabelSet
    from mlxbatch.engine.prompt import default_system_prompt
    from mlxbatch.model.load import load_model
    from mlxbatch.runtime import executor, sgemm

    lm = load_model(tiny_model_dir)
    names = ("billing", "technical")
    labels = LabelSet.build(names, lm.tokenizer.label, lm.model.args.vocab_size)
    lanes = Engine(lm, labels, default_system_prompt(names), executor=executor.CpuLanes(2))
    one = Engine(lm, labels, default_system_prompt(names), executor=executor.SingleStream())
    texts = ["charged twice " * k for k in range(1, 12)]
    batches = [
        [lanes.prompt(t) for t in texts[a:b]] for a, b in ((0, 1), (1, 5), (5, 6), (6, 9), (9, 11))
    ]
    got = lanes.score_batches(batches)
    with sgemm.single_threaded():  # the lanes' BLAS setting, for the same kernels
        want = one.score_batches(batches)
    assert [g.shape for g in got] == [(len(b), 2) for b in batches]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    run = lanes.scorers["fast"].score_batches(iter(batches * 3))
    first = next(run)
    run.close()  # what was queued is cancelled, what runs finishes
    np.testing.assert_array_equal(first, want[0])
    np.testing.assert_array_equal(lanes.score_batches(batches[1:2])[0], want[1])


def test_resume_keeps_the_first_runs_truncation_and_batches(tiny_model_dir, tmp_path, monkeypatch):
    """Interrupted at batch tokens 64 with truncation, resumed with 4096 and less free memory:
    the file equals an uninterrupted run (the journal's batch shape wins, before truncation)."""
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.bench.workload import generate, write_jsonl
    from mlxbatch.engine.engine import Engine
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.io.sinks import journal_path
    from mlxbatch.jobs.job import run_job

    src = tmp_path / "t.jsonl"
    write_jsonl(generate(120, seed=4, mix="heavy-tail"), src)
    rows = lambda: read_rows(str(src))[0]  # noqa: E731  (rows carry per-run errors)
    clf = Classifier.load(tiny_model_dir)
    first = RunSpec(batch_tokens=64, too_long="truncate", max_batch=8)
    ref = run_job(clf, rows(), first, tmp_path / "ref.jsonl")
    assert ref.batch_tokens == 64
    truncated = [json.loads(x) for x in (tmp_path / "ref.jsonl").read_text().splitlines()]
    assert sum("truncated" in r for r in truncated) > 5

    real_run, out = Engine.run, tmp_path / "out.jsonl"

    def interrupted(self, *a, **k):
        for n, item in enumerate(real_run(self, *a, **k)):
            if n == 4:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(Engine, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_job(clf, rows(), first, out)
    assert journal_path(out).exists()
    monkeypatch.setattr(Engine, "run", real_run)
    monkeypatch.setenv("MLXBATCH_MEMORY_LIMIT", "64M")  # a different free-memory default
    again = RunSpec(batch_tokens=4096, too_long="truncate", max_batch=8)
    res = run_job(clf, rows(), again, out, resume=True)
    assert res.batch_tokens == 64
    assert out.read_bytes() == (tmp_path / "ref.jsonl").read_bytes()


def _imports(path: Path) -> set[str]:
    """First-level mlxbatch sub-packages/modules imported by a module (relative or absolute)."""
    tree = ast.parse(path.read_text())
    rel = path.relative_to(PACKAGE).parts
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel[:-1])[: len(rel) - node.level]
                parts = base + (node.module.split(".") if node.module else [])
                if not parts:  # `from . import x` at the top
                    parts = [a.name for a in node.names]
                found.add(parts[0])
            elif node.module and node.module.startswith("mlxbatch."):
                found.add(node.module.split(".")[1])
    return found


def test_imports_point_down_the_layers():
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).parts
        if len(rel) == 1:
            continue  # __init__ (lazy API), __main__, errors
        layer = LAYERS.index(rel[0])
        for dep in _imports(path):
            if dep in LAYERS:
                assert LAYERS.index(dep) <= layer, f"{'/'.join(rel)} imports {dep}"


def test_the_python_api_and_the_file_io_are_siblings():
    """api/ (texts in, predictions out) imports nothing of io/ (the job's files), nor io/ of
    api/: a constant of one imported by the other put a whole layer between them."""
    for inner, outer in (("api", "io"), ("io", "api")):
        for path in (PACKAGE / inner).rglob("*.py"):
            assert outer not in _imports(path), f"{inner}/{path.name} imports {outer}"


def test_no_function_is_longer_than_a_screen():
    """A longer function hides its steps and their order: split it into named ones."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                where = path.relative_to(PACKAGE.parent).as_posix()
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def _is_command(node: ast.FunctionDef) -> bool:
    """Decorated by `click.command`, `click.group` or a group's `.command`."""
    for d in node.decorator_list:
        call = d.func if isinstance(d, ast.Call) else d
        if isinstance(call, ast.Attribute) and call.attr in ("command", "group"):
            return True
    return False


def test_every_command_is_thin():
    """A click command parses, builds the spec, calls one library function and prints; what
    resolves, validates or runs lives in a named helper."""
    long = []
    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and _is_command(node):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_COMMAND_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert len(long) == 0, f"commands over {MAX_COMMAND_LINES} lines:\n" + "\n".join(long)
