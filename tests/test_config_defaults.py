"""A config.json that omits a key runs as transformers runs it: each family's defaults are
transformers' (not Qwen2's), on tiny checkpoints saved by transformers with keys then deleted.

Among them: a Llama config without `tie_word_embeddings` keeps its own head (and the
checkpoint's lm_head.weight), Gemma 3 without `rope_theta` or `query_pre_attn_scalar` takes
transformers' values, Qwen2 without `rope_theta` its own; configs without
`num_key_value_heads`, and Phi-3's `su` rope, run.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import save_randomised

from mlxbatch.engine.prompt import default_system_prompt
from mlxbatch.model.config import ModelArgs
from mlxbatch.model.load import load_model

SMALL = dict(
    vocab_size=151936,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    max_position_embeddings=1024,
)
_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "original_max_position_embeddings": 256,
    "short_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0],
    "long_factor": [2.0, 3.0, 4.0, 6.0, 8.0, 9.0, 10.0, 11.0],
}
_GEMMA = dict(
    num_hidden_layers=3,
    head_dim=16,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
)


def _drop(*keys):
    def edit(cfg):
        for k in keys:
            cfg.pop(k)

    return edit


def _rope_scaling(kind):
    def edit(cfg):  # the pre-transformers-5 spelling, as Phi-3's checkpoints published it
        params = cfg.pop("rope_parameters")
        cfg["rope_scaling"] = {
            k: v for k, v in params.items() if k not in ("rope_type", "rope_theta")
        }
        cfg["rope_scaling"]["type"] = kind
        cfg["rope_theta"] = params["rope_theta"]

    return edit


def _only_inner_original(cfg):
    """Phi-3: transformers takes the top-level original_max_position_embeddings (its own
    default, 4,096, when absent) over the one inside the rope parameters."""
    cfg.pop("original_max_position_embeddings")


CASES = {
    # name: (transformers config class, its arguments, the edit of the saved config.json)
    "llama_no_tie_key": (
        "LlamaConfig",
        dict(tie_word_embeddings=False),
        _drop("tie_word_embeddings"),
    ),
    "llama_no_kv_heads": (
        "LlamaConfig",
        dict(num_key_value_heads=4, tie_word_embeddings=False),
        _drop("num_key_value_heads"),
    ),
    "qwen2_no_rope_theta": (
        "Qwen2Config",
        dict(tie_word_embeddings=True),
        _drop("rope_parameters"),
    ),
    "qwen3_no_head_dim_no_kv_heads": (
        "Qwen3Config",
        dict(
            num_attention_heads=32, num_key_value_heads=32, head_dim=128, tie_word_embeddings=False
        ),
        _drop("head_dim", "num_key_value_heads"),
    ),
    "gemma3_no_rope_theta": ("Gemma3TextConfig", _GEMMA, _drop("rope_parameters")),
    "gemma3_no_query_pre_attn_scalar": (
        "Gemma3TextConfig",
        _GEMMA | dict(query_pre_attn_scalar=256),
        _drop("query_pre_attn_scalar"),
    ),
    "gemma3_no_layer_types_no_window": (
        "Gemma3TextConfig",
        _GEMMA,
        _drop("layer_types", "sliding_window", "_sliding_window_pattern"),
    ),
    "phi3_no_rms_norm_eps": (
        "Phi3Config",
        dict(rms_norm_eps=1e-5, tie_word_embeddings=False),
        _drop("rms_norm_eps"),
    ),
    "phi3_su": (
        "Phi3Config",
        dict(rope_parameters=_LONGROPE, original_max_position_embeddings=256),
        _rope_scaling("su"),
    ),
    "phi3_yarn": (
        "Phi3Config",
        dict(rope_parameters=_LONGROPE, original_max_position_embeddings=256),
        _rope_scaling("yarn"),
    ),
    "phi3_original_only_in_rope": (
        "Phi3Config",
        dict(
            rope_parameters=_LONGROPE,
            max_position_embeddings=4096,
            original_max_position_embeddings=256,
        ),
        _only_inner_original,
    ),
}
TEXTS = ["I was charged twice this month", "the app crashes " * 6]


def make_checkpoint(path: Path, case: str, seed: int = 0) -> Path:
    import torch
    import transformers

    cls_name, kwargs, edit = CASES[case]
    cfg = getattr(transformers, cls_name)(**(SMALL | kwargs))
    torch.manual_seed(seed)
    save_randomised(transformers.AutoModelForCausalLM.from_config(cfg).float(), path)
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))
    return path


def assert_logits_equal_transformers(path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    lm = load_model(path, dtype="float32")
    for text in TEXTS:
        tokens = lm.tokenizer.prompt(default_system_prompt(("a", "b")), text)
        ours = np.array(lm.model.head(lm.model(mx.array([tokens])))[0])
        with torch.no_grad():
            ref = hf(input_ids=torch.tensor([tokens])).logits[0].numpy()
        np.testing.assert_allclose(ours, ref, atol=1e-4, err_msg=str(path))


@pytest.mark.parametrize("case", list(CASES))
def test_an_omitted_key_runs_as_transformers_runs_it(case, tmp_path):
    assert_logits_equal_transformers(make_checkpoint(tmp_path, case))


def test_a_tied_config_with_a_distinct_head_uses_the_head_as_transformers_does(tmp_path):
    """transformers (5.x) does not tie a head the checkpoint holds with other values than the
    embedding: it warns and uses lm_head.weight."""
    make_checkpoint(tmp_path, "llama_no_tie_key")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}))
    assert_logits_equal_transformers(tmp_path)
    assert not load_model(tmp_path).model.args.tie_word_embeddings


def test_a_tied_config_with_a_copy_of_the_embedding_stays_tied(tmp_path):
    from safetensors.numpy import load_file, save_file

    make_checkpoint(tmp_path, "llama_no_tie_key")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}))
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert load_model(tmp_path).model.args.tie_word_embeddings
    assert_logits_equal_transformers(tmp_path)


_READ = (
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "tie_word_embeddings",
    "max_position_embeddings",
    "query_pre_attn_scalar",
    "sliding_window",
)


@pytest.mark.parametrize(
    "model_type", ["qwen2", "qwen3", "llama", "mistral", "gemma3_text", "phi3"]
)
def test_every_default_is_transformers(model_type):
    """A config with only the sizes: every value mlxbatch reads equals transformers' config's."""
    import transformers

    sizes = dict(
        hidden_size=256,
        num_hidden_layers=12,
        intermediate_size=96,
        num_attention_heads=32,
        vocab_size=300,
        model_type=model_type,
    )
    ref = transformers.CONFIG_MAPPING[model_type].from_dict(dict(sizes))
    args = ModelArgs.from_dict(sizes)
    theirs = {k: getattr(ref, k, None) for k in _READ}
    theirs["head_dim"] = getattr(ref, "head_dim", None) or 256 // 32
    if model_type == "phi3":  # its window of None: plain causal
        theirs["max_position_embeddings"] = ref.original_max_position_embeddings
    ours = {k: getattr(args, k) for k in _READ} | {"head_dim": args.head_dim}
    if model_type != "gemma3_text":
        ours["query_pre_attn_scalar"] = None
    assert ours == theirs
    params = ref.rope_parameters
    if model_type == "gemma3_text":
        assert args.rope_theta == params["full_attention"]["rope_theta"]
        assert args.rope_local_base_freq == params["sliding_attention"]["rope_theta"]
        assert list(args.layer_types) == ref.layer_types
    else:
        assert args.rope_theta == params["rope_theta"]
    act = ref.hidden_activation if model_type == "gemma3_text" else ref.hidden_act
    assert args.hidden_act == act


@pytest.mark.parametrize("model_type", ["qwen2", "llama", "phi3"])
def test_rope_parameters_own_theta_wins_over_the_top_level_one(model_type):
    """transformers fills rope_parameters' rope_theta (and partial_rotary_factor) from the
    top-level keys only where it lacks them; mlxbatch preferred the top-level ones."""
    import transformers

    cfg = dict(
        hidden_size=256,
        num_hidden_layers=2,
        intermediate_size=96,
        num_attention_heads=8,
        num_key_value_heads=8,
        vocab_size=300,
        model_type=model_type,
        rope_theta=10000.0,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    if model_type == "phi3":
        cfg |= {
            "partial_rotary_factor": 1.0,
            "rope_parameters": cfg["rope_parameters"] | {"partial_rotary_factor": 0.5},
        }
    ref = transformers.CONFIG_MAPPING[model_type].from_dict(json.loads(json.dumps(cfg)))
    args = ModelArgs.from_dict(cfg)
    assert args.rope_theta == ref.rope_parameters["rope_theta"] == 500000.0
    if model_type == "phi3":
        assert args.rope().dims == int(args.head_dim * ref.rope_parameters["partial_rotary_factor"])


def test_gemma_sliding_layers_own_theta_wins_over_rope_local_base_freq():
    """A review found: the top-level `rope_local_base_freq` beat rope_parameters'
    `sliding_attention.rope_theta`, which transformers reads first (a mixed config's sliding
    layers ran another rope, silently)."""
    import transformers

    cfg = dict(
        hidden_size=256,
        num_hidden_layers=2,
        intermediate_size=96,
        num_attention_heads=8,
        num_key_value_heads=8,
        vocab_size=300,
        model_type="gemma3_text",
        rope_local_base_freq=20000.0,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
        },
    )
    ref = transformers.CONFIG_MAPPING["gemma3_text"].from_dict(json.loads(json.dumps(cfg)))
    args = ModelArgs.from_dict(cfg)
    assert args.rope_local_base_freq == ref.rope_parameters["sliding_attention"]["rope_theta"]
    assert args.rope_local_base_freq == 5000.0 and args.rope_theta == 1e6


_SIZES = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=300,
    max_position_embeddings=1024,
)
_ROPES = {
    "llama": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "gemma3_text": {"rope_type": "linear", "factor": 8.0},
    "phi3": {
        "rope_type": "longrope",
        "original_max_position_embeddings": 256,
        "short_factor": [1.0] * 8,
        "long_factor": [2.0] * 8,
    },
}


@pytest.mark.parametrize(
    ("model_type", "key", "value"),
    [
        ("llama", "factor", "8"),
        ("llama", "factor", 0),
        ("llama", "low_freq_factor", 0),
        ("llama", "high_freq_factor", 1.0),
        ("llama", "original_max_position_embeddings", "64"),
        ("llama", "original_max_position_embeddings", 0),
        ("gemma3_text", "factor", 0),
        ("gemma3_text", "factor", "2"),
        ("gemma3_text", "factor", -8.0),
        ("phi3", "top original_max_position_embeddings", 0),  # Phi-3's top-level key wins over
        ("phi3", "top original_max_position_embeddings", 1),  # the rope parameters' (ignored)
        ("phi3", "max_position_embeddings", "131072"),
        ("phi3", "factor", "x"),
        ("phi3", "attention_factor", "x"),
        ("phi3", "short_factor", [-1.0] * 8),
        ("phi3", "short_factor", [float("nan")] * 8),
        ("phi3", "long_factor", "wide"),
    ],
)
def test_a_bad_rope_scaling_value_is_refused_naming_its_key(model_type, key, value):
    """A factor of "8" or 0, equal low and high frequency factors, an original context of 0 or a
    negative or NaN short factor is refused naming its key, not a traceback or a model that runs."""
    from mlxbatch.errors import ModelError

    def config(scaling: dict) -> dict:
        if model_type == "gemma3_text":  # its global layers scale, its sliding ones do not
            scaling = {"full_attention": scaling, "sliding_attention": {"rope_type": "default"}}
        return _SIZES | {"model_type": model_type, "rope_parameters": scaling}

    ModelArgs.from_dict(config(_ROPES[model_type])).rope().make()  # the sane one loads
    if key.startswith("top ") or key == "max_position_embeddings":  # config.json's own keys
        key = key.removeprefix("top ")  # (Phi-3's top-level original context wins)
        bad = config(_ROPES[model_type]) | {key: value}
    else:
        bad = config(_ROPES[model_type] | {key: value})
    with pytest.raises(ModelError, match=key):
        ModelArgs.from_dict(bad).rope().make()


def test_messages_name_config_keys_and_say_a_default_was_taken():
    """A bad head_dim is named as config.json names it (no internal name), and a value taken as
    a default (num_key_value_heads=32) says config.json lacks it."""
    from mlxbatch.errors import ModelError

    base = _SIZES | {"model_type": "qwen2", "num_attention_heads": 4, "head_dim": 16}
    base.pop("num_key_value_heads")
    with pytest.raises(ModelError, match=r"num_key_value_heads=32 \(not in config.json: Qwen2"):
        ModelArgs.from_dict(base)
    with pytest.raises(ModelError, match="head_dim must be a positive integer") as e:
        ModelArgs.from_dict(base | {"num_key_value_heads": 4, "head_dim": -3})
    assert "override" not in str(e.value)
