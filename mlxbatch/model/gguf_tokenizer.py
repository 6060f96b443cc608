"""A GGUF's tokenizer as `tokenizer.json` + `tokenizer_config.json`, token for token as
transformers builds it from the same file.

A GGUF stores the vocabulary (`tokenizer.ggml.tokens`, each token's type), the merges and the
name of the pre-tokenizer llama.cpp matched (`tokenizer.ggml.pre`). A byte-level BPE (`gpt2`:
Qwen2/2.5, Qwen3, Llama 3, SmolLM2) is rebuilt here with `tokenizers` alone: the merges as
given, text split by the regex that name stands for (GPT-2's own where it names none), control
tokens special and user-defined ones whole. A SentencePiece vocabulary (`llama`: Gemma 3,
Phi-3, Llama 2) needs transformers' converter, which differs by family in ways only it keeps
current; without transformers such a file is refused with the install line.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from ..errors import ModelError

_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> the split regex (transformers' table); any other name: GPT-2's
SPLITS = {
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "llama-bpe": _LLAMA3,
    "falcon3": _LLAMA3,
    "smaug-bpe": _LLAMA3,
    "dbrx": _LLAMA3,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
    "megrez": _QWEN2,
    "gpt-4o": _GPT4O,
    "llama4": _GPT4O,
}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (the byte-level alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_level(meta: dict) -> Tokenizer:
    tokens, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or []
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {}
    for i, t in enumerate(tokens):
        t = t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))
        vocab[t] = i  # a repeated spelling: the last wins, as in transformers
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    split = SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    # a control token spelled outside the byte alphabet is a mislabel llama.cpp makes: adding
    # it would grow the vocabulary past the embedding (transformers skips it too)
    control = [t for t, k in zip(tokens, types) if k == CONTROL and set(t) <= alphabet]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, k in zip(tokens, types) if k == USER_DEFINED and t in vocab]
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    return tok


def sentencepiece(meta: dict, source: str) -> Tokenizer:
    try:
        from transformers.integrations.gguf import convert_gguf_tokenizer
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING,
        )
    except ImportError:
        raise ModelError(
            f"{source}: its SentencePiece vocabulary (tokenizer.ggml.model "
            "'llama') is rebuilt by transformers' GGUF converter: pip install "
            "'transformers>=5'"
        ) from None
    names = GGUF_TOKENIZER_MAPPING["tokenizer"]
    wanted = {
        name: meta[f"tokenizer.{key}"] for key, name in names.items() if f"tokenizer.{key}" in meta
    }
    return convert_gguf_tokenizer(meta["general.architecture"], wanted)[0]


def write_tokenizer(meta: dict, out: Path, source: str) -> None:
    """tokenizer.json and tokenizer_config.json (special tokens, the chat template) in `out`."""
    kind = meta.get("tokenizer.ggml.model")
    if "tokenizer.ggml.tokens" not in meta:
        raise ModelError(f"{source}: the GGUF holds no tokenizer (tokenizer.ggml.tokens)")
    if kind == "gpt2":
        tok = byte_level(meta)
    elif kind == "llama":
        tok = sentencepiece(meta, source)
    else:
        raise ModelError(
            f"{source}: tokenizer.ggml.model {kind!r} is not one mlxbatch builds (gpt2, llama)"
        )
    tok.save(str(out / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]
    cfg: dict = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        i = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(i, int) and 0 <= i < len(tokens):
            cfg[name] = tokens[i]
    for key in ("add_bos_token", "add_eos_token"):
        if f"tokenizer.ggml.{key}" in meta:
            cfg[key] = bool(meta[f"tokenizer.ggml.{key}"])
    if isinstance(meta.get("tokenizer.chat_template"), str):
        cfg["chat_template"] = meta["tokenizer.chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
