"""Tiny GGUF files written from tiny transformers checkpoints the way llama.cpp's converter
writes them (its names, its Llama Q/K row order, Gemma's norms as 1 + w, its metadata and
tokenizer keys), with the `gguf` package's GGUFWriter: the tests' stand-ins for the files
users have."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ARCHS = {
    "qwen2": "qwen2",
    "llama": "llama",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
}
LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GEMMA_NAMES = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)


def gguf_name(arch: str, name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    if arch == "gemma3" and part in GEMMA_NAMES:
        return f"blk.{layer}.{GEMMA_NAMES[part]}.{kind}"
    return f"blk.{layer}.{LAYER_NAMES[part]}.{kind}"


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`: Hugging Face's rotary halves to interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def tokenizer_keys(hf_dir: Path, vocab_size: int) -> dict:
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    added = {t["id"]: t for t in tok["added_tokens"]}
    for i, t in added.items():
        vocab[t["content"]] = i
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in by_id:
            tokens.append(by_id[i])
            types.append((3 if added[i]["special"] else 4) if i in added else 1)
        else:  # llama.cpp pads the vocabulary to the embedding's rows
            tokens.append(f"[PAD{i}]")
            types.append(5)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return {"tokens": tokens, "types": types, "merges": merges}


def write_gguf(
    hf_dir: Path, out: Path, qtype: str = "F32", kquant_types=None, tokenizer_model="llama"
) -> Path:
    """`hf_dir` (a transformers checkpoint with tokenizer.json) as a GGUF at `out`: 2-D weights
    in `qtype` (F32, F16, Q8_0, Q4_0, Q4_1) where their rows allow, or `kquant_types`
    ({"token_embd": "Q6_K", "*": "Q4_K"}) random K-quant blocks with small scales. A checkpoint
    with a `tokenizer.model` gets a SentencePiece vocabulary, its `tokenizer_model` as given."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = ARCHS[cfg["model_type"]]
    heads, kv = (
        cfg["num_attention_heads"],
        cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
    )
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name("tiny")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    if arch == "gemma3":
        theta = rope.get("full_attention", {}).get("rope_theta", theta)
        w.add_sliding_window(cfg["sliding_window"])
    if theta:
        w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(head_dim)
    if arch in ("llama", "qwen3", "gemma3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if (hf_dir / "tokenizer.model").is_file():
        add_sentencepiece_keys(w, hf_dir, cfg["vocab_size"], arch, tokenizer_model)
    else:
        add_byte_level_keys(w, hf_dir, cfg["vocab_size"])
    w.add_chat_template(CHAT_TEMPLATE)
    tensors = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        tensors |= load_file(str(f))
    for name, t in tensors.items():
        t = t.astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            t = permute(t, heads, heads)
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            t = permute(t, heads, kv)
        if arch == "gemma3" and name.endswith("norm.weight"):
            t = t + 1
        g = gguf_name(arch, name)
        _add(w, g, t, qtype, kquant_types)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def add_byte_level_keys(w, hf_dir: Path, vocab_size: int) -> None:
    toks = tokenizer_keys(hf_dir, vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(toks["tokens"])
    w.add_token_types(toks["types"])
    w.add_token_merges(toks["merges"])
    w.add_eos_token_id(toks["tokens"].index("<|im_end|>"))
    w.add_bos_token_id(toks["tokens"].index("<|endoftext|>"))
    w.add_pad_token_id(toks["tokens"].index("<|endoftext|>"))


def add_sentencepiece_keys(w, hf_dir: Path, vocab_size: int, arch: str, model="llama") -> None:
    """`tokenizer.model` as llama.cpp's `_create_vocab_sentencepiece` writes it: every piece with
    its score and type (normal 1, unknown 2, control 3, user-defined 4, unused 5, byte 6), the
    added tokens of tokenizer_config.json (control where special), [PADn] up to the embedding."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(hf_dir / "tokenizer.model"))
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores, types = [-10000.0] * vocab_size, [5] * vocab_size
    for i in range(sp.get_piece_size()):
        tokens[i], scores[i] = sp.id_to_piece(i), sp.get_score(i)
        kinds = (sp.is_unknown(i), sp.is_control(i), sp.is_unused(i), sp.is_byte(i))
        types[i] = next((k for k, hit in zip((2, 3, 5, 6), kinds) if hit), 1)
    cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    for i, t in cfg.get("added_tokens_decoder", {}).items():
        tokens[int(i)], scores[int(i)] = t["content"], -1000.0
        types[int(i)] = 3 if t.get("special") else 4
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    if arch == "gemma3":
        w.add_add_space_prefix(False)


def sentencepiece_tokenizer(out: Path, dummy_prefix: bool = True) -> Path:
    """A SentencePiece BPE of 400 pieces with byte fallback (Llama 2's kind; Gemma's without a
    dummy prefix) trained on the tickets, as `tokenizer.model` in `out`."""
    import sentencepiece

    out.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4),
        model_prefix=str(out / "sp"),
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=dummy_prefix,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        allow_whitespace_only_pieces=True,
        character_coverage=0.98,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    (out / "sp.model").replace(out / "tokenizer.model")
    (out / "sp.vocab").unlink()
    return out / "tokenizer.model"


def with_sentencepiece(hf_dir: Path, arch: str) -> Path:
    """`hf_dir`'s tokenizer replaced by a SentencePiece one as transformers saves it for `arch`
    (Llama's for llama and phi3, Gemma's for gemma3), ChatML's tokens added as specials."""
    import transformers

    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf_dir / name).unlink()
    sentencepiece_tokenizer(hf_dir, dummy_prefix=arch != "gemma3")
    cls = transformers.GemmaTokenizer if arch == "gemma3" else transformers.LlamaTokenizer
    tok = cls.from_pretrained(str(hf_dir))
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(hf_dir))
    cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    added = json.loads((hf_dir / "tokenizer.json").read_text())["added_tokens"]
    cfg["added_tokens_decoder"] = {str(t.pop("id")): t for t in added}  # as llama.cpp reads
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    if arch == "phi3":  # Phi-3's tokenizer.json: the "▁" prepended by a normalizer, to each run
        spec = json.loads((hf_dir / "tokenizer.json").read_text())
        spec["normalizer"] = PHI3_NORMALIZER
        spec["pre_tokenizer"] = None
        (hf_dir / "tokenizer.json").write_text(json.dumps(spec))
    return hf_dir


PHI3_NORMALIZER = {
    "type": "Sequence",
    "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    ],
}


def _add(w, name: str, t: np.ndarray, qtype: str, kquant_types) -> None:
    import gguf

    T = gguf.GGMLQuantizationType
    if t.ndim != 2:
        w.add_tensor(name, t)
        return
    if kquant_types:
        kind = kquant_types.get(name.split(".")[0]) or kquant_types.get("*")
        if kind and t.shape[1] % 256 == 0:
            w.add_tensor(name, random_kquant_blocks(kind, t.shape), raw_dtype=T[kind])
        else:
            w.add_tensor(name, t)
        return
    if qtype == "F32" or t.shape[1] % 32:
        w.add_tensor(name, t)
    elif qtype == "F16":
        w.add_tensor(name, t.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(t, T[qtype]), raw_dtype=T[qtype])


def random_kquant_blocks(kind: str, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """Valid Q4_K / Q6_K blocks of random bytes, their scales set so weights are ~0.02."""
    import gguf

    _, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    rows, blocks = shape[0], shape[1] // 256
    r = np.random.default_rng(seed + rows)
    raw = r.integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    if kind == "Q4_K":  # d, dmin (f16) first: value = d * sc * q - dmin * m
        raw[..., 0:2] = (
            r.uniform(1e-5, 4e-5, (rows, blocks))
            .astype(np.float16)
            .view(np.uint8)
            .reshape(rows, blocks, 2)
        )
        raw[..., 2:4] = (
            r.uniform(1e-5, 4e-5, (rows, blocks))
            .astype(np.float16)
            .view(np.uint8)
            .reshape(rows, blocks, 2)
        )
    elif kind == "Q6_K":  # d (f16) last: value = d * scale (int8) * (q - 32)
        raw[..., -2:] = (
            r.uniform(2e-6, 8e-6, (rows, blocks))
            .astype(np.float16)
            .view(np.uint8)
            .reshape(rows, blocks, 2)
        )
    else:
        raise ValueError(kind)
    return raw.reshape(rows, blocks * size)


CORPUS = [
    "I was charged twice this month for my invoice.",
    "The app crashes with error 0x1F",
    "please delete my account and all data",
    "login fails, password reset never arrives",
    "Ünïcödé tëxt — with emoji 🚀 and 数据 sync",
    "refund the billing error\n\nThanks!",
    "technical support team, account access",
    "Classify the ticket. Answer with one label",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 512


def tiny_tokenizer(out: Path) -> Path:
    """A byte-level BPE of 512 tokens (Qwen2's split, ChatML's control tokens) trained on a few
    tickets: a GGUF of it is read in a moment where the Qwen vocabulary's 151,936 take a minute."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from mlxbatch.model.gguf_tokenizer import SPLITS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLITS["qwen2"]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 8,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    return out


SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
)
CASES = {
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False, head_dim=24, rope_theta=10000.0)),
    "llama_mha": ("LlamaConfig", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(tie_word_embeddings=True, head_dim=32)),
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            head_dim=16,
            sliding_window=8,
            query_pre_attn_scalar=16,
            hidden_activation="gelu_pytorch_tanh",
        ),
    ),
    "phi3": (
        "Phi3Config",
        dict(
            tie_word_embeddings=False,
            sliding_window=None,
            pad_token_id=0,
            bos_token_id=0,
            eos_token_id=0,
        ),
    ),
    "llama_256": (
        "LlamaConfig",
        dict(hidden_size=256, intermediate_size=512, head_dim=64, tie_word_embeddings=True),
    ),
}


def tiny_checkpoint(path: Path, case: str, seed: int = 0) -> Path:
    """A transformers checkpoint of `case` with the tiny tokenizer, biases and norms moved off
    their initial values."""
    import torch
    import transformers

    cls_name, kwargs = CASES[case]
    cfg = getattr(transformers, cls_name)(**(SMALL | kwargs))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    tiny_tokenizer(path)
    return path


def classify_verifies(path, texts: list[str], tmp_path: Path) -> None:
    """`classify --verify` on the GGUF at `path` agrees with the gold loop on `texts`."""
    from cli_run import invoke

    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n")
    labels = "billing,technical,account"
    r = invoke(
        [
            "classify",
            src,
            "--model",
            path,
            "--labels",
            labels,
            "-o",
            tmp_path / "o.jsonl",
            "--verify",
        ]
    )
    assert r.exit_code == 0, r.output
    assert "100.00% label agreement" in r.output
