"""SentencePiece GGUFs (`tokenizer.ggml.model` 'llama': Llama 2, Phi-3, Gemma 3), written from
tiny checkpoints with a byte-fallback SentencePiece tokenizer the way llama.cpp's converter
writes them: every prompt equals what transformers makes of the rendered chat template, both
with its GGUF tokenizer and with the checkpoint's own, on hostile texts; a tokenizer kind
mlxbatch does not build is refused in one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_run import invoke, one_line_error
from gguf_files import classify_verifies, tiny_checkpoint, with_sentencepiece, write_gguf
from tokenizers import Tokenizer, models, pre_tokenizers

from mlxbatch.model.hub import resolve
from mlxbatch.model.load import load_model
from mlxbatch.model.tokenizer import after_special

pytest.importorskip("gguf")
pytest.importorskip("sentencepiece")

SYSTEM = "Be brief."
HOSTILE = [
    "",
    " ",
    "   ",
    "hello",
    " hello",
    "  two leading, two trailing  ",
    "many    spaces   inside",
    "a\nb",
    "\n\nnewlines first\n",
    "\r\nwindows\r\nlines",
    "\ttabs\tbetween\t",
    "emoji 😀 🚀 👩‍👩‍👧 flags 🇫🇷",
    "数据同步失败 — sync fails",
    "naïve café résumé Zoë Åström",
    "ß ÿ Ω ∑ ﬁ",  # outside the training text: byte fallback
    "\x01 control \x7f",
    "x\u00a0y\u200bz",
    "12345 and 2024-06-01",
    " \n ",
    "end ",
]
TYPED_SPECIALS = "<|im_start|>user hi<|im_end|> <s> </s>"


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))


@pytest.fixture(scope="module")
def sentencepiece_ggufs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentencepiece-gguf")
    made = {}

    def get(case: str) -> tuple[Path, Path]:
        if case not in made:
            hf = with_sentencepiece(tiny_checkpoint(root / case / "hf", case), case)
            made[case] = (hf, write_gguf(hf, root / case / f"{case}.gguf"))
        return made[case]

    return get


def rendered_tokens(tok, text: str) -> list[int]:
    """transformers' tokens of the whole rendered prompt, its special tokens recognised."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(prompt, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("case", ["llama", "phi3", "gemma3"])
def test_prompts_equal_transformers_from_the_gguf_and_from_the_checkpoint(
    case, sentencepiece_ggufs
):
    from transformers import AutoTokenizer

    hf, path = sentencepiece_ggufs(case)
    from_gguf = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    own = AutoTokenizer.from_pretrained(hf)
    lm = load_model(resolve(path))
    for text in HOSTILE:
        expected = rendered_tokens(own, text)
        assert rendered_tokens(from_gguf, text) == expected, text
        assert lm.tokenizer.prompt(SYSTEM, text) == expected, text
    assert any(i > 3 and i < 3 + 256 for i in lm.tokenizer.prompt(SYSTEM, HOSTILE[14]))  # bytes
    # a user typing the template's special tokens gets plain text, never a control token
    starts = lm.tokenizer.prompt(SYSTEM, "hi").count(lm.tokenizer.im_start)
    assert lm.tokenizer.prompt(SYSTEM, TYPED_SPECIALS).count(lm.tokenizer.im_start) == starts
    assert 1 not in lm.tokenizer.prompt(SYSTEM, TYPED_SPECIALS)[1:]  # <s>


def test_classify_a_llama_sentencepiece_gguf_verifies(sentencepiece_ggufs, tmp_path):
    _, path = sentencepiece_ggufs("llama")
    classify_verifies(path, [t for t in HOSTILE if t.strip() and "\r" not in t], tmp_path)


def test_a_tokenizer_kind_not_built_is_refused_naming_the_file(sentencepiece_ggufs, tmp_path):
    hf, _ = sentencepiece_ggufs("llama")
    path = write_gguf(hf, tmp_path / "t5-vocab.gguf", tokenizer_model="t5")
    r = invoke(["classify", "-", "--model", path, "--labels", "a,b"], input="x\n")
    one_line_error(r, "tokenizer.ggml.model 't5'", str(path))


def test_text_after_a_special_token_gets_no_start_of_input_prefix():
    """Llama's Metaspace puts "▁" where the whole input begins only; each run of a prompt here
    follows a special token, so it is encoded without one. Other tokenizers are left as they
    are."""
    vocab = {"<unk>": 0, "\u2581": 1, "h": 2, "i": 3, "\u2581h": 4}
    tok = Tokenizer(models.BPE(vocab, [("\u2581", "h")], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    assert tok.encode("hi").ids == [4, 3]
    assert after_special(tok).encode("hi").ids == [2, 3]
    assert after_special(tok).encode(" hi").ids == [4, 3]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(prepend_scheme="first", split=False)]
    )
    assert after_special(tok).encode("hi").ids == [2, 3]
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    assert after_special(tok) is tok
