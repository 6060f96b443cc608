"""The command line as users call it: classify, policies, labels, memory, doctor, bench."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from mlxbatch.bench.workload import generate, write_jsonl
from mlxbatch.cli import cli
from mlxbatch.runtime import blas, probe


@pytest.fixture(scope="module")
def tickets_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("t") / "tickets.jsonl"
    write_jsonl(generate(120, seed=5), path)
    return path


def run(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, catch_exceptions=False)


def read_jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_all_modes_agree_and_rows_map_one_to_one(tiny_model_dir, tickets_file, tmp_path):
    outs = {}
    for mode in ("sorted", "naive", "sequential"):
        out = tmp_path / f"{mode}.jsonl"
        r = run(
            "classify",
            tickets_file,
            "--model",
            tiny_model_dir,
            "-o",
            out,
            "--mode",
            mode,
            "--batch-tokens",
            2048,
            "--verify",
        )
        assert r.exit_code == 0, r.output
        assert "100.00% label agreement" in r.output
        outs[mode] = read_jsonl(out)
    ids = [t["id"] for t in read_jsonl(tickets_file)]
    for rows in outs.values():
        assert [x["id"] for x in rows] == ids
        assert all(set(x) == {"id", "label", "scores"} for x in rows)
        assert all(abs(sum(x["scores"].values()) - 1) < 1e-5 for x in rows)
    assert [x["label"] for x in outs["sorted"]] == [x["label"] for x in outs["sequential"]]
    assert [x["label"] for x in outs["naive"]] == [x["label"] for x in outs["sequential"]]


def test_stdin_text_and_csv_output(tiny_model_dir, tmp_path):
    out = tmp_path / "o.csv"
    r = run(
        "classify",
        "-",
        "--model",
        tiny_model_dir,
        "-o",
        out,
        "--labels",
        "spam,ham",
        "--no-prefix-cache",
        input="buy now\nsee you at lunch\n",
    )
    assert r.exit_code == 0, r.output
    lines = out.read_text().splitlines()
    assert lines[0] == "id,label,score_spam,score_ham,error" and len(lines) == 3
    r = run("classify", "-", "--model", tiny_model_dir, input="hello\n")
    assert r.exit_code == 0 and json.loads(r.stdout.splitlines()[0])["id"] == 1


def test_bad_rows_fail_before_compute_or_become_error_rows(tiny_model_dir, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        '{"id": "a", "text": "ok"}\n{"id": "b"}\nnot json\n{"id": "d", "text": "fine"}\n'
    )
    out = tmp_path / "o.jsonl"
    r = run("classify", src, "--model", tiny_model_dir, "-o", out)
    assert r.exit_code == 2
    assert "line 2: missing text field 'text'" in r.output and "line 3: invalid JSON" in r.output
    assert not out.exists()
    r = run("classify", src, "--model", tiny_model_dir, "-o", out, "--on-error", "skip")
    assert r.exit_code == 0, r.output
    rows = read_jsonl(out)
    # an unreadable row's id is null, never its line number (which could collide with real ids)
    assert [x["id"] for x in rows] == ["a", "b", None, "d"]
    assert [x.get("line") for x in rows] == [None, 2, 3, None]
    assert "error" in rows[1] and "error" in rows[2] and "label" in rows[3]


def test_too_long_policies(tiny_model_dir, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("short one\n" + "very long ticket text " * 60 + "\n")
    r = run("classify", src, "--model", tiny_model_dir, "--max-tokens", 40)
    assert r.exit_code == 2 and "over the limit of 40" in r.output
    out = tmp_path / "o.jsonl"
    r = run(
        "classify",
        src,
        "--model",
        tiny_model_dir,
        "--max-tokens",
        40,
        "--too-long",
        "truncate",
        "-o",
        out,
        "--verify",
    )
    assert r.exit_code == 0, r.output
    rows = read_jsonl(out)
    assert "truncated" not in rows[0]
    t = rows[1]["truncated"]
    assert t["from_tokens"] > 40 >= t["to_tokens"] and rows[1]["label"]


@pytest.mark.parametrize(
    "labels, message",
    [
        ("billing,billing", "duplicate label"),
        ("billing", "at least two labels"),
        ("billing,,x", "empty label"),
        ("account,account access", "token prefix"),
    ],
)
def test_bad_label_sets_are_refused(tiny_model_dir, tickets_file, labels, message):
    r = run("classify", tickets_file, "--model", tiny_model_dir, "--labels", labels)
    assert r.exit_code == 2 and message in r.output


def test_a_budget_that_cannot_fit_is_refused(tiny_model_dir, tickets_file):
    r = run("classify", tickets_file, "--model", tiny_model_dir, "--batch-tokens", 10**9)
    assert r.exit_code == 2 and "GiB" in r.output, r.output
    assert "--batch-tokens 1000000000; lower it" in r.output  # as the CLI takes it


def test_peak_memory_stays_under_the_stated_bound(tiny_model_dir, tickets_file):
    from mlxbatch.api.classifier import Classifier
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.jobs.job import run_job

    clf = Classifier.load(tiny_model_dir)
    rows, _ = read_rows(str(tickets_file))
    res = run_job(clf, rows, RunSpec(batch_tokens=1024), None)
    assert 0 < res.peak_memory <= res.memory_bound


def test_peak_memory_leaves_out_the_planners_first_calibration(
    tiny_model_dir, tickets_file, tmp_path, monkeypatch
):
    """A machine's first job calibrates the planner while its settings resolve: its batches
    made a tiny model's peak 0.10 GiB against the job's stated bound of 0.04."""
    import mlx.core as mx

    from mlxbatch.api.classifier import Classifier
    from mlxbatch.api.spec import RunSpec
    from mlxbatch.io.inputs import read_rows
    from mlxbatch.jobs.job import run_job

    clf = Classifier.load(tiny_model_dir)
    measured = clf.cost_model

    def calibrating():  # as a calibration: its batches' memory, freed before the job's own
        mx.eval(mx.zeros((512 << 20) // 4))  # more than a tiny model's job may use
        return measured()

    monkeypatch.setattr(clf, "cost_model", calibrating)
    rows, _ = read_rows(str(tickets_file))
    res = run_job(clf, rows, RunSpec(batch_tokens=1024), tmp_path / "out.jsonl")
    assert 0 < res.peak_memory <= res.memory_bound


def test_missing_model_and_bad_prompt_file_are_clear(tickets_file, tmp_path):
    r = run("classify", tickets_file, "--model", tmp_path / "nope")
    assert r.exit_code == 2 and "model directory not found" in r.output
    r = run(
        "classify", tickets_file, "--model", tmp_path, "--system-prompt-file", tmp_path / "p.txt"
    )
    assert r.exit_code == 2 and "cannot read the system prompt" in r.output


def test_python_api(tiny_model_dir):
    from mlxbatch import Classifier

    clf = Classifier.load(tiny_model_dir, labels=["billing", "account access", "account deletion"])
    preds = clf.classify(["charged twice", "\n\nlocked out", "delete me"], batch_tokens=256)
    gold = clf.classify(["charged twice", "\n\nlocked out", "delete me"], mode="sequential")
    assert [p.label for p in preds] == [p.label for p in gold]
    assert set(preds[0].scores) == {"billing", "account access", "account deletion"}


def test_python_api_names_texts_it_cannot_classify(tiny_model_dir):
    from mlxbatch import Classifier
    from mlxbatch.errors import UsageError

    clf = Classifier.load(tiny_model_dir)
    assert clf.classify([]) == []
    with pytest.raises(UsageError, match=r"texts\[1\]: expected a str, got int"):
        clf.classify(["fine", 5])
    with pytest.raises(
        UsageError, match=r"texts\[0\] holds a lone surrogate '\\ud800' at character 6"
    ):
        clf.classify(["half \ud800 a pair"])


def test_tickets_match_the_published_length_profile():
    import numpy as np

    from mlxbatch.model.convert import qwen_tokenizer_dir
    from mlxbatch.model.tokenizer import PromptTokenizer

    tok = PromptTokenizer(qwen_tokenizer_dir())
    rows = generate(600)
    lengths = np.array([len(tok.encode(t["text"])) for t in rows])
    assert 85 <= np.median(lengths) <= 103 and 400 <= lengths.max() <= 500
    assert rows == generate(600) and rows != generate(600, seed=1)
    assert {t["intent"] for t in rows} == {"billing", "technical", "account"}
    assert any(not t["text"].isascii() for t in rows)
    short = [len(tok.encode(t["text"])) for t in generate(200, mix="short")]
    assert np.median(short) < np.median(lengths) / 2


def cli_env():
    env = dict(os.environ)
    env.pop(blas._MARK, None)
    return env


FAST_BLAS_PLATFORM = platform.system() == "Linux" and platform.machine() in ("x86_64", "aarch64")


def require_fast_blas():
    """Where mlxbatch promises a fast BLAS (Linux x86_64 and aarch64), its absence fails the
    test (a green suite must not hide a product 25-90x slower); elsewhere the test skips."""
    if blas.plan() is None:
        tried = "; ".join(f"{r['source']}: {r.get('refused', 'ok')}" for r in blas.tried())
        if FAST_BLAS_PLATFORM:
            pytest.fail(f"no fast BLAS on this Linux {platform.machine()} machine: {tried}")
        pytest.skip(f"no fast BLAS promised on {platform.system()} {platform.machine()}")


@pytest.mark.skipif(platform.system() != "Linux", reason="the BLAS interposition is Linux-only")
def test_cli_runs_mlx_on_openblas():
    require_fast_blas()
    out = subprocess.run(
        [sys.executable, "-m", "mlxbatch", "doctor", "--json", "--size", "256"],
        capture_output=True,
        text=True,
        env=cli_env(),
        check=True,
    )
    info = json.loads(out.stdout)
    assert info["fast_blas"] is True
    assert "openblas" in info["blas"] and info["blas_kernels"] not in (None, "Prescott")
    assert info["blas_activation"] == blas.plan().source
    chosen = [r for r in info["blas_tried"] if r.get("chosen")]
    assert len(chosen) == 1 and chosen[0]["library"] == info["blas"]
    assert chosen[0]["corename"] == info["blas_kernels"] and chosen[0]["invariant"] is True


@pytest.mark.skipif(not FAST_BLAS_PLATFORM, reason="scipy-openblas32 ships for x86_64/aarch64")
def test_the_portable_openblas_is_what_serves_mlx():
    """The dependency is scipy-openblas32 (DYNAMIC_ARCH, built for every CPU of the platform),
    renamed so MLX binds to it: the README's install alone gives the fast path."""
    require_fast_blas()
    assert blas.plan().source == blas.SCIPY
    config = blas.plan().config
    assert "DYNAMIC_ARCH" in config and "MAX_THREADS=4 " not in config + " "


def test_python_api_gets_the_fast_blas_in_process():
    """`import mlxbatch; mlxbatch.Classifier` loads OpenBLAS before mlx, with no re-exec."""
    require_fast_blas()
    # Which library serves MLX's sgemm symbol, not a speed ratio: a timing comparison failed
    # with both cores busy (9.6 against 6.5 GFLOP/s); `mlxbatch doctor` measures the speed.
    code = (
        "import mlxbatch; mlxbatch.Classifier\n"
        "from mlxbatch.runtime import sgemm\n"
        "import json, mlx.core as mx\n"
        "a = mx.ones((64, 64)); mx.eval(a @ a)\n"
        "p = sgemm.sgemm_provider()\n"
        "print(json.dumps([p['library'], p.get('corename')]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), check=True
    )
    library, kernels = json.loads(out.stdout.splitlines()[-1])
    assert "openblas" in library and kernels


@pytest.mark.skipif(platform.system() != "Linux", reason="the BLAS interposition is Linux-only")
def test_blas_choice_is_measured_and_a_crashing_build_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    bad = tmp_path / "libnot-a-library.so"
    bad.write_bytes(b"\x7fELF garbage")
    assert "failure" in probe._probe(str(bad), ())  # fails in its subprocess, not here
    # a library whose first sgemm is an illegal instruction, as cmeel's AVX-512 build on Zen 3
    crash = tmp_path / "sigill.py"
    crash.write_text("import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    monkeypatch.setattr(probe, "_PROBE_CODE", crash.read_text())
    assert probe._probe("x", ())["failure"].startswith("died of SIGILL in the probe")
    fake = [
        blas.Candidate("scipy-openblas32", None, problem="patchelf is not installed"),
        blas.Candidate("avx512-only", "/a/libopenblas.so"),
        blas.Candidate("system", "/b/libopenblas.so"),
    ]
    found = {
        "": {"gflops": 5.0},
        "/a/libopenblas.so": {"failure": "died of SIGILL in the probe"},
        "/b/libopenblas.so": {"gflops": 80.0, "corename": "Haswell", "config": "x"},
    }
    monkeypatch.setattr(blas, "candidates", lambda: fake)
    monkeypatch.setattr(probe, "_probe", lambda lib, env: found[lib])
    assert blas.plan().source == "system"  # the AVX-512 build crashed: the next one is used
    assert blas.plan().corename == "Haswell"
    rows = {r["source"]: r for r in blas.tried()}
    assert rows["scipy-openblas32"]["refused"] == "patchelf is not installed"
    assert "SIGILL" in rows["avx512-only"]["refused"] and "refused" not in rows["system"]
    found["/b/libopenblas.so"] = {"gflops": 6.0}  # no faster than the reference: none is used
    probe.cache_path().unlink()
    assert blas.plan() is None
    assert (
        "no faster than the reference"
        in {r["source"]: r for r in blas.tried()}["system"]["refused"]
    )
    monkeypatch.setattr(blas, "ACTIVE", {})
    line = blas.warning()
    assert "SIGILL" in line and "patchelf is not installed" in line and blas.REMEDY in line


@pytest.mark.skipif(platform.system() != "Linux", reason="the BLAS interposition is Linux-only")
@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["/b/libopenblas.so"].update(gflops="x"),  # failed every run
        lambda d: d["/b/libopenblas.so"].clear(),  # left MLX on the reference BLAS
        lambda d: d.pop("/b/libopenblas.so"),
        lambda d: d["/b/libopenblas.so"].update(invariant="yes"),  # counted as invariant
        lambda d: d["/b/libopenblas.so"].update(layouts=["diagonal"], invariant=True),
        lambda d: d["reference"].update(gflops=float("inf")),
        lambda d: d.update(reference=[]),
    ],
)
def test_an_edited_blas_cache_is_probed_again(monkeypatch, tmp_path, edit):
    """blas.json is a file a person can edit: cached probes that no probe writes are measured
    again (and saved over), not trusted; a cache as written is not."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fake = [blas.Candidate("system", "/b/libopenblas.so")]
    found = {
        "": {"gflops": 5.0},
        "/b/libopenblas.so": {
            "gflops": 80.0,
            "corename": "Haswell",
            "config": "x",
            "threads": 2,
            "layouts": ["tiled"],
            "invariant": True,
        },
    }
    probed = []
    monkeypatch.setattr(blas, "candidates", lambda: fake)
    monkeypatch.setattr(probe, "_probe", lambda lib, env: probed.append(lib) or found[lib])
    assert blas.plan().invariant and len(probed) == 2
    assert blas.plan().gflops == 80.0 and len(probed) == 2  # read back, not probed again
    path = probe.cache_path()
    cached = json.loads(path.read_text())
    edit(cached["probes"])
    path.write_text(json.dumps(cached))
    plan = blas.plan()
    assert len(probed) == 4 and plan.gflops == 80.0 and plan.invariant and plan.layout == "tiled"
    assert json.loads(path.read_text())["probes"]["/b/libopenblas.so"]["invariant"] is True


@pytest.mark.skipif(not FAST_BLAS_PLATFORM, reason="scipy-openblas32 ships for x86_64/aarch64")
def test_the_symbol_table_reader_finds_the_prefixed_exports():
    from mlxbatch.runtime import elf, scipy_openblas

    exported = elf.exported_symbols(scipy_openblas.library())
    assert "scipy_cblas_sgemm" in exported and "scipy_openblas_get_config" in exported
    assert "cblas_sgemm" in elf.exported_symbols(blas.plan().library)  # the renamed copy
    with pytest.raises(ValueError):
        elf.exported_symbols(__file__)


def test_bench_quick_runs_end_to_end(tmp_path):
    js = tmp_path / "b.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxbatch",
            "bench",
            "--quick",
            "--tickets",
            "24",
            "--sweep",
            "512",
            "--no-peers",
            "--json",
            js,
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(js.read_text())
    names = [m["name"] for m in result["modes"]]
    assert names[:4] == [
        "sequential (gold)",
        "sequential + prefix cache",
        "naive (batch 16)",
        "sorted (default)",
    ]
    assert all(m["agreement"] == 1.0 for m in result["modes"])
    assert result["padding_tax"]["global_max_factor"] >= result["padding_tax"]["sorted_factor"] >= 1
    assert "SYNTHETIC" in out.stdout and "items/s" in out.stdout


def test_bench_against_a_reference_model(tiny_model_dir, tmp_path):
    """`bench --against`: the same weights in another dtype agree on every label, with
    probabilities that differ only by the cast; the figures land in the JSON."""
    from mlxbatch.model.convert import convert_hf

    half = tmp_path / "half"
    convert_hf(tiny_model_dir, half, dtype="bfloat16")
    js = tmp_path / "b.json"
    r = CliRunner().invoke(
        cli,
        [
            "bench",
            "--model",
            str(tiny_model_dir),
            "--tickets",
            "12",
            "--modes",
            "sorted",
            "--sweep",
            "",
            "--no-peers",
            "--against",
            str(half),
            "--json",
            str(js),
        ],
    )
    assert r.exit_code == 0, r.output
    a = json.loads(js.read_text())["against"]
    assert a["items"] == 12 and a["reference"] != a["model"]
    assert 0 < a["max_abs_prob_diff"] < 0.05 and a["label_agreement"] >= 0.9
    assert a["seconds"] > 0 and a["reference_seconds"] > 0


def test_convert_then_parity_through_the_cli(hf_and_mlx, tmp_path):
    hf, _ = hf_and_mlx
    out = tmp_path / "converted"
    r = run("convert", hf, out)
    assert r.exit_code == 0 and "tensors" in r.output
    r = run("parity", hf, "--mlx", out)
    assert r.exit_code == 0, r.output
    assert r.output.count("PASS") == 2 and "FAIL" not in r.output


def test_init_random_at_qwen25_shapes_loads_and_runs(tmp_path):
    import mlx.core as mx

    from mlxbatch.model.load import load_model

    r = run("init-random", tmp_path / "m", "--preset", "qwen2.5-0.5b")
    assert r.exit_code == 0 and "494,032,768 parameters" in r.output
    lm = load_model(tmp_path / "m")
    assert lm.model.num_parameters() == 494_032_768
    h = lm.model(mx.array([lm.tokenizer.prompt("sys", "hello")]))
    logits = lm.model.head(h[:, -1])
    assert logits.shape == (1, 151936) and bool(mx.all(mx.isfinite(logits)))


def test_check_finite_flag_refuses_nan_weights(tiny_model_dir, tickets_file, tmp_path):
    import shutil

    import mlx.core as mx

    bad = tmp_path / "bad"
    shutil.copytree(tiny_model_dir, bad)
    t = mx.load(str(bad / "model.safetensors"))
    t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"] / 0.0
    mx.save_safetensors(str(bad / "model.safetensors"), t)
    r = run("classify", tickets_file, "--model", bad, "--check-weights")
    assert r.exit_code == 2 and "NaN or infinite" in r.output


def test_demo_main_job_runs_and_verifies(tiny_model_dir, tmp_path):
    r = run("demo", "--tickets", 20, "--model", tiny_model_dir, "--out", tmp_path / "demo")
    assert r.exit_code == 0, r.output
    assert "100.0% label agreement" in r.output and "SYNTHETIC" in r.output
    assert len(read_jsonl(tmp_path / "demo" / "predictions.jsonl")) == 20
    assert re.search(r"demo: \d+ s in all \(\d+ s classifying, \d+ s the gold loop", r.output)


def test_the_demo_says_what_the_planners_first_job_added(tiny_model_dir, tmp_path, monkeypatch):
    """A newcomer read "also calibrating the planner, once" after a run that had not: the last
    line names the check or the calibration only on the machine's first job, and says which."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no planner cached yet
    first = run("demo", "--tickets", 6, "--model", tiny_model_dir, "--out", tmp_path / "a")
    assert first.exit_code == 0, first.output
    last = first.output.strip().splitlines()[-1]
    calibrated = "calibrating it for this machine" in first.output
    assert ("also calibrated the planner" in last) == calibrated, last
    assert ("also checked the planner's default cost model" in last) == (not calibrated), last
    again = run("demo", "--tickets", 6, "--model", tiny_model_dir, "--out", tmp_path / "b")
    assert again.exit_code == 0 and "first job" not in again.output.strip().splitlines()[-1]


def test_bench_built_in_prompts_grow_the_shared_prefix(tmp_path):
    prefix = {}
    for name in ("default", "descriptions", "few-shot"):
        js = tmp_path / f"{name}.json"
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "mlxbatch",
                "bench",
                "--quick",
                "--tickets",
                "8",
                "--prompt",
                name,
                "--modes",
                "gold,sorted",
                "--sweep",
                "",
                "--no-peers",
                "--no-calibrate",
                "--json",
                js,
            ],
            capture_output=True,
            text=True,
            env=cli_env(),
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert f"prompt {name} (" in out.stdout
        m = re.search(r"prompt \S+ \((\d+) shared prefix tokens\)", out.stdout)
        prefix[name] = int(m.group(1))
        assert all(m["agreement"] == 1.0 for m in json.loads(js.read_text())["modes"])
    assert prefix["default"] < prefix["descriptions"] < prefix["few-shot"]
    alone = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxbatch",
            "bench",
            "--quick",
            "--tickets",
            "8",
            "--modes",
            "sorted",
            "--no-peers",
            "--no-calibrate",
            "--json",
            js,
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
    )
    assert alone.returncode == 0, alone.stderr[-2000:]
    (mode,) = json.loads(js.read_text())["modes"]
    assert mode["agreement"] is None and " n/a " in alone.stdout  # no reference ran: no claim
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxbatch",
            "bench",
            "--quick",
            "--prompt",
            "descriptions",
            "--system-prompt",
            "mine",
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
    )
    assert bad.returncode == 2 and "built-in prompt" in bad.stderr


@pytest.mark.parametrize("command", [["serve"], ["bench-serve", "--quick"], ["bench", "--serve"]])
def test_the_service_without_its_extra_is_one_line_naming_it(monkeypatch, tiny_model_dir, command):
    """Without the serve extra, `serve` was a ModuleNotFoundError traceback (exit 1)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a)
    )
    r = CliRunner().invoke(cli, [*command, "--model", str(tiny_model_dir)])
    assert r.exit_code == 2, r.output
    assert "needs the serve extra (uvicorn missing): pip install 'mlxbatch[serve]'" in r.output
    assert "Traceback" not in r.output


def test_doctor_lists_the_calibrations_of_models_on_disk_and_counts_the_rest(tmp_path, monkeypatch):
    """The shared cache held ~40 entries of tests' and deleted models, unsorted."""
    from mlxbatch.bench import doctor
    from mlxbatch.engine import calibration

    cost = {"per_batch": 0.01, "per_token": 1e-4, "per_key": 1e-7, "lanes": 1}
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    entries = [
        {"model_path": str(tmp_path / p), "dtype": "float32", "at": "t", "model": cost}
        for p in ("b", "gone", "a", "gone2")
    ]
    # a cache edited by hand (a review found a traceback): a path that is no string, a NUL,
    # constants that are no numbers
    entries += [
        {"model_path": 5, "model": cost},
        {"model_path": "a\0b", "model": cost},
        {"model_path": str(tmp_path / "a"), "at": "u", "model": {"per_batch": "x"}},
    ]
    monkeypatch.setattr(calibration, "cached_entries", lambda: entries)
    lines = doctor.calibrations()
    assert [x.split(" (")[0] for x in lines[:3]] == [str(tmp_path / p) for p in "aab"]
    assert lines[1].endswith("unreadable (edited?)")
    assert lines[3].startswith("4 more for models no longer on disk") and len(lines) == 4
    monkeypatch.setattr(calibration, "cached_entries", lambda: [])
    assert doctor.calibrations().startswith("none cached")


def test_doctor_prints_the_matmul_rates_its_ratio_is_of(monkeypatch):
    """A newcomer read `matmul 57.9`, `numpy 67.9` and then `mlx_vs_numpy 1.61`: the ratio came
    from a second, interleaved measurement, the printed MLX rate from a first, lone one."""
    import mlx.core as mx

    from mlxbatch.bench import doctor

    if mx.default_device() != mx.cpu:
        pytest.skip("the NumPy comparison is made on the CPU")
    mlx_rates, numpy_rates = iter([90.0, 80.0]), iter([60.0, 50.0])
    monkeypatch.setattr(doctor, "matmul_gflops", lambda size, dtype: next(mlx_rates))
    monkeypatch.setattr(doctor, "numpy_gflops", lambda size: next(numpy_rates))
    monkeypatch.setattr(doctor, "calibrations", lambda: [])
    info = doctor.report(64)
    mine, numpy = info["matmul_gflops_float32"], info["numpy_matmul_gflops_float32"]
    assert (mine, numpy) == (90.0, 60.0)
    assert info["mlx_vs_numpy_matmul"] == round(mine / numpy, 2)


def test_doctor_judges_the_model_it_is_given(tiny_model_dir, tmp_path):
    """`doctor --model X` (without --calibrate) judges X: a broken one is named, not passed over
    with exit 0."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    cfg = json.loads((broken / "config.json").read_text()) | {"num_hidden_layers": 10**9}
    (broken / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(cli, ["doctor", "--size", "16", "--model", str(broken)])
    assert r.exit_code == 2 and "BROKEN: num_hidden_layers" in r.stdout, r.output
    assert r.stderr.startswith(f"error: --model {broken}: not runnable")
    r = CliRunner().invoke(cli, ["doctor", "--size", "16", "--model", str(tiny_model_dir)])
    assert r.exit_code == 0 and f"{tiny_model_dir}: runnable" in r.stdout, r.output
