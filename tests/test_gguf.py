"""GGUF files as models: logits equal to transformers' own GGUF loading for every family and
stored type, tokens equal to its tokenizer, Ollama's store, `models`, and one-line refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_run import invoke, one_line_error
from gguf_files import CORPUS, classify_verifies, random_kquant_blocks, tiny_checkpoint, write_gguf

from mlxbatch.bench.parity import hf_logits, mlx_logits, parity_batches
from mlxbatch.errors import ModelError
from mlxbatch.model.hub import resolve
from mlxbatch.model.load import load_model

gguf = pytest.importorskip("gguf")
TOL = 2e-4


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """Each module run converts into its own cache, never the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-checkpoints")
    made = {}

    def get(case: str) -> Path:
        if case not in made:
            made[case] = tiny_checkpoint(root / case, case)
        return made[case]

    return get


def transformers_gguf(path: Path, **config):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, **config
    ).eval()


def logits_diff(lm, hf) -> float:
    batches = parity_batches(lm)
    ours = np.concatenate([x for b in batches for x in mlx_logits(lm, b)])
    ref = np.concatenate([x for b in batches for x in hf_logits(hf, b)])
    return float(np.abs(ours - ref).max())


@pytest.mark.parametrize("case", ["qwen2", "llama", "llama_mha", "qwen3", "gemma3", "phi3"])
def test_float32_files_give_transformers_logits(case, checkpoints, tmp_path):
    """Every family's names, Llama's rotary rows, Gemma's 1 + w norms, tied and untied heads."""
    import torch
    from transformers import AutoModelForCausalLM

    hf_dir = checkpoints(case)
    path = write_gguf(hf_dir, tmp_path / f"{case}.gguf")
    lm = load_model(resolve(path), dtype="float32")
    # transformers' GGUF config leaves what it does not map at its class's default: Qwen3's
    # head_dim (128, the published sizes'; the file's key_length is ours), Gemma 3's
    # query_pre_attn_scalar (256; llama.cpp scales by head_dim, as the published sizes do)
    extra = {"qwen3": {"head_dim": 32}, "gemma3": {"query_pre_attn_scalar": 16}}.get(case, {})
    assert logits_diff(lm, transformers_gguf(path, **extra)) <= TOL
    original = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    assert logits_diff(lm, original) <= TOL  # and the checkpoint the file was written from


@pytest.mark.parametrize(
    "case, qtype", [("llama", "Q8_0"), ("llama", "Q4_0"), ("qwen2", "Q4_1"), ("llama_mha", "F16")]
)
def test_mlx_native_types_stay_quantized_and_match_transformers(case, qtype, checkpoints, tmp_path):
    path = write_gguf(checkpoints(case), tmp_path / f"{case}-{qtype}.gguf", qtype)
    model_dir = resolve(path)
    lm = load_model(model_dir, dtype="float32")
    manifest = json.loads((model_dir / "mlxbatch.json").read_text())
    assert manifest["gguf"]["quantization"] == qtype
    if qtype != "F16":
        assert (
            lm.quantization["group_size"] == 32 and "kept quantized" in manifest["gguf"]["weights"]
        )
    assert logits_diff(lm, transformers_gguf(path)) <= TOL


def test_k_quants_are_dequantized_by_the_gguf_package(checkpoints, tmp_path):
    path = write_gguf(
        checkpoints("llama_256"),
        tmp_path / "k.gguf",
        kquant_types={"token_embd": "Q6_K", "*": "Q4_K"},
    )
    model_dir = resolve(path)
    manifest = json.loads((model_dir / "mlxbatch.json").read_text())
    assert manifest["gguf"]["types"]["Q4_K"] > 0 and manifest["gguf"]["types"]["Q6_K"] == 1
    assert "dequantized to float32" in manifest["gguf"]["weights"]
    lm = load_model(model_dir, dtype="float32")
    assert lm.quantization is None
    assert logits_diff(lm, transformers_gguf(path)) <= TOL


def test_k_quant_without_the_gguf_package_names_the_extra(checkpoints, tmp_path, monkeypatch):
    path = write_gguf(checkpoints("llama_256"), tmp_path / "k.gguf", kquant_types={"*": "Q4_K"})
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)
    with pytest.raises(ModelError, match=r"pip install 'mlxbatch\[gguf\]'"):
        resolve(path)


def test_the_random_blocks_are_valid_k_quants():
    w = gguf.quants.dequantize(
        random_kquant_blocks("Q4_K", (4, 512)), gguf.GGMLQuantizationType.Q4_K
    )
    assert w.shape == (4, 512) and np.isfinite(w).all() and 0.001 < np.abs(w).mean() < 0.1


# -- the tokenizer, on the real Qwen vocabulary --------------------------------------------------

TEXTS = [
    "hello world",
    "  two leading spaces",
    "\n\nnewlines\r\nand\ttabs  ",
    "Ünïcödé — 🚀 数据",
    "don't I'll we're 12345 3.14159",
    "<|im_end|> typed by a user <|im_start|>",
    "a" * 300,
    "   ",
    "",
    "emoji 👩‍👩‍👧 flags 🇫🇷 and زبان فارسی",
    "x\u00a0y\u200bz",
]


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory) -> Path:
    from conftest import make_hf_checkpoint

    root = tmp_path_factory.mktemp("qwen-gguf")
    return write_gguf(make_hf_checkpoint(root / "hf", "tied_gqa"), root / "qwen2.gguf")


def transformers_tokenizer(path: Path):
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    arch, tokenizer_dict, _ = get_gguf_tokenizer(str(path))
    tok, _ = convert_gguf_tokenizer(arch, tokenizer_dict)
    tok.encode_special_tokens = True  # as ours: a special token's string typed is plain text
    return tok


def test_tokens_equal_transformers_tokenizer_from_the_same_file(qwen_gguf):
    lm = load_model(resolve(qwen_gguf))
    ref = transformers_tokenizer(qwen_gguf)
    for text in TEXTS + CORPUS:
        assert lm.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False).ids, text
    # the chat template comes from the file: its control tokens are the template's
    prompt = lm.tokenizer.prompt("Be brief.", "hi")
    assert lm.tokenizer.decode(prompt).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


def test_classify_a_gguf_verifies(qwen_gguf, tmp_path):
    classify_verifies(qwen_gguf, TEXTS[:6] + CORPUS, tmp_path)


def test_convert_writes_the_directory_the_cache_holds(qwen_gguf, tmp_path):
    r = invoke(["convert", qwen_gguf, tmp_path / "out"])
    assert r.exit_code == 0, r.output
    cached = resolve(qwen_gguf)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "out" / name).read_text() == (cached / name).read_text()
    assert resolve(qwen_gguf) == cached  # converted once


# -- Ollama's store and LM Studio's folder -------------------------------------------------------

MODEL_LAYER = "application/vnd.ollama.image.model"


def fake_ollama(root: Path, blob_source: Path | None, layers=None) -> Path:
    digest = "ab" * 32
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    manifest.parent.mkdir(parents=True)
    if layers is None:
        layers = [
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32},
            {"mediaType": MODEL_LAYER, "digest": f"sha256:{digest}"},
        ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    (root / "blobs").mkdir()
    if blob_source:
        shutil.copyfile(blob_source, root / "blobs" / f"sha256-{digest}")
    return root


def test_ollama_names_the_same_bytes_as_the_path(checkpoints, tmp_path, monkeypatch):
    path = write_gguf(checkpoints("qwen2"), tmp_path / "tiny.gguf", "Q8_0")
    monkeypatch.setenv("OLLAMA_MODELS", str(fake_ollama(tmp_path / "ollama", path)))
    assert resolve("ollama:tiny") == resolve("ollama:tiny:latest") == resolve(path)
    r = invoke(
        ["classify", "-", "--model", "ollama:tiny", "--labels", "spam,ham", "--verify"],
        input="buy now\nsee you\n",
    )
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "layers, blob, words",
    [
        (None, False, "lacks the model's blob"),
        (
            [
                {
                    "mediaType": "application/vnd.ollama.image.license",
                    "digest": "sha256:" + "ef" * 32,
                }
            ],
            True,
            "no model layer",
        ),
    ],
)
def test_ollama_store_problems_are_one_line(
    layers, blob, words, checkpoints, tmp_path, monkeypatch
):
    path = write_gguf(checkpoints("qwen2"), tmp_path / "tiny.gguf") if blob else None
    monkeypatch.setenv("OLLAMA_MODELS", str(fake_ollama(tmp_path / "ollama", path, layers)))
    one_line_error(
        invoke(["classify", "-", "--model", "ollama:tiny", "--labels", "a,b"], input="x\n"), words
    )
    one_line_error(
        invoke(["classify", "-", "--model", "ollama:absent:7b", "--labels", "a,b"], input="x\n"),
        "no such model",
        "absent/7b",
    )


def test_models_lists_ollama_and_lm_studio_ggufs(checkpoints, tmp_path, monkeypatch):
    path = write_gguf(checkpoints("llama"), tmp_path / "tiny.gguf", "Q4_0")
    monkeypatch.setenv("OLLAMA_MODELS", str(fake_ollama(tmp_path / "ollama", path)))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLXBATCH_WEIGHTS", str(tmp_path / "no-weights"))
    studio = tmp_path / "home" / ".lmstudio" / "models" / "someone" / "tiny-GGUF"
    studio.mkdir(parents=True)
    shutil.copyfile(path, studio / "tiny-Q4_0.gguf")
    (studio / "mmproj.gguf").write_bytes(b"GGUF" + b"\0" * 40)  # not a model: not listed
    r = invoke(["models", "--json"])
    assert r.exit_code == 0, r.output
    found = {m["name"]: m for m in json.loads(r.stdout)}
    assert found["ollama:tiny:latest"]["kind"] == "ollama"
    studio_entry = found["someone/tiny-GGUF/tiny-Q4_0.gguf"]
    assert studio_entry["kind"] == "lm studio" and studio_entry["quantization"] == "Q4_0"
    assert studio_entry["family"] == "llama" and not studio_entry["broken"]


# -- refusals ------------------------------------------------------------------------------------


def broken_files(good: Path, root: Path) -> dict[str, tuple[Path, str]]:
    data = good.read_bytes()
    out = {}
    (root / "cut.gguf").write_bytes(data[: len(data) - 1000])
    out["cut short"] = (root / "cut.gguf", "cut short")
    (root / "header.gguf").write_bytes(data[:100])
    out["header cut"] = (root / "header.gguf", "cut short")
    (root / "magic.gguf").write_bytes(b"GGML" + data[4:])
    out["bad magic"] = (root / "magic.gguf", "not a GGUF file")
    w = gguf.GGUFWriter(str(root / "bert.gguf"), "bert")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    out["architecture"] = (root / "bert.gguf", "architecture 'bert' is not supported")
    w = gguf.GGUFWriter(str(root / "iq.gguf"), "llama")
    raw = np.zeros((4, 4 * 18), np.uint8)
    w.add_tensor("token_embd.weight", raw, raw_dtype=gguf.GGMLQuantizationType.IQ4_NL)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    out["tensor type"] = (root / "iq.gguf", "IQ4_NL, a type mlxbatch cannot read")
    return out


def test_bad_files_are_one_line_errors(checkpoints, tmp_path):
    good = write_gguf(checkpoints("qwen2"), tmp_path / "good.gguf")
    for path, words in broken_files(good, tmp_path).values():
        r = invoke(["classify", "-", "--model", path, "--labels", "a,b"], input="x\n")
        one_line_error(r, words, str(path))


def test_parity_compares_a_gguf_with_transformers_loading_it(checkpoints, tmp_path):
    path = write_gguf(checkpoints("llama"), tmp_path / "llama.gguf", "Q8_0")
    r = invoke(["parity", path, "--no-mlx-lm"])
    assert r.exit_code == 0, r.output
    assert "transformers (GGUF)" in r.output and "PASS" in r.output


def test_the_load_line_names_the_gguf_and_what_became_of_its_weights(checkpoints, tmp_path):
    path = write_gguf(checkpoints("llama"), tmp_path / "llama.gguf", "Q4_0")
    line = load_model(resolve(path), dtype="float32").describe()
    assert "converted from a Q4_0 GGUF, weights kept quantized" in line
    import mlx.core as mx

    if mx.default_device() == mx.cpu:  # dequantized once: MLX's CPU quantized matmul is slow
        assert "dequantized to float32 at load" in line
