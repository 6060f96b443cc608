"""Every family rule is a field of its record (model/family.py): a family whose block needs no
new feature is one record, and the config modules never ask which `model_type` they read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mlxbatch.errors import ModelError
from mlxbatch.model.config import ModelArgs
from mlxbatch.model.config_fields import FULL, SLIDING
from mlxbatch.model.families import FAMILIES
from mlxbatch.model.family import Family

MODEL = Path(__file__).parent.parent / "mlxbatch" / "model"

# a made-up family: Gemma-like sliding layers with their own rope base and attention scalar,
# read from keys of its own, and one bias switch
TOY = Family(
    "Toy",
    qk_norm=True,
    activations=("silu", "gelu_pytorch_tanh"),
    activation_key="act_fn",
    rope_types=("default", "linear"),
    sliding="pattern",
    local_rope_key="local_theta",
    attention_scalar_key="attn_scalar",
    bias_switches=("attention_bias",),
    vision_language_type="toy_vl",
    defaults={
        "num_key_value_heads": None,
        "head_dim": None,
        "rms_norm_eps": 1e-6,
        "rope_theta": 50_000.0,
        "tie_word_embeddings": True,
        "max_position_embeddings": 1024,
        "act_fn": "gelu_pytorch_tanh",
        "local_theta": 2_000.0,
        "attn_scalar": 64,
        "sliding_window": 16,
        "sliding_window_pattern": 3,
    },
)
SIZES = dict(
    hidden_size=64,
    num_hidden_layers=6,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(FAMILIES, "toy", TOY)
    return TOY


def test_a_new_family_is_one_record(toy):
    """Only the record is added: its keys, defaults and switches decide every field."""
    args = ModelArgs.from_dict(
        SIZES | {"model_type": "toy", "attention_bias": True, "mlp_bias": True}
    )
    assert args.family is toy
    assert args.hidden_act == "gelu_pytorch_tanh"  # the family's default, under its own key
    assert args.attention_scale == 64**-0.5
    assert args.attention_bias and not args.mlp_bias  # a switch it does not read is ignored
    assert args.tie_word_embeddings and args.sliding_window == 16
    assert args.layer_types == (SLIDING, SLIDING, FULL) * 2
    assert args.rope(SLIDING).base == 2_000.0 and args.rope(FULL).base == 50_000.0

    given = ModelArgs.from_dict(
        SIZES | {"model_type": "toy", "act_fn": "silu", "local_theta": 3_000.0, "attn_scalar": 16}
    )
    assert given.hidden_act == "silu" and given.attention_scale == 16**-0.5
    assert given.rope(SLIDING).base == 3_000.0
    with pytest.raises(ModelError, match="hidden_act 'relu' is not supported for Toy"):
        ModelArgs.from_dict(SIZES | {"model_type": "toy", "act_fn": "relu"})


def test_a_new_familys_block_is_built_from_its_record(toy):
    """The decoder builds the made-up family's block with the parameters its config lists."""
    from mlx.utils import tree_flatten

    from mlxbatch.model.decoder import Decoder

    args = ModelArgs.from_dict(SIZES | {"model_type": "toy", "attention_bias": True})
    params = {k: tuple(v.shape) for k, v in tree_flatten(Decoder(args).parameters())}
    assert params == args.expected_shapes()
    assert "model.layers.0.self_attn.q_norm.weight" in params
    assert "model.layers.0.self_attn.o_proj.bias" in params


def test_a_new_familys_vision_language_checkpoint_reads_its_text_config(toy):
    args = ModelArgs.from_dict({"model_type": "toy_vl", "text_config": SIZES, "vocab_size": 300})
    assert args.model_type == "toy" and args.vision_language


def test_the_published_families_rules_are_fields_of_their_records():
    """What differs by family is stated in each record, and stays as transformers reads it."""
    gemma, phi3 = FAMILIES["gemma3_text"], FAMILIES["phi3"]
    assert gemma.activation_key == "hidden_activation"
    assert gemma.local_rope_key == "rope_local_base_freq"
    assert gemma.attention_scalar_key == "query_pre_attn_scalar"
    assert gemma.vision_language_type == "gemma3"
    assert phi3.original_context_key == "original_max_position_embeddings"
    assert FAMILIES["llama"].bias_switches == ("attention_bias", "mlp_bias")
    assert FAMILIES["mistral"].bias_switches == () and FAMILIES["qwen2"].bias_switches == ()
    for t, family in FAMILIES.items():
        others = [f for f in FAMILIES.values() if f is not family]
        assert family.activation_key in family.defaults, t
        for key in (family.local_rope_key, family.attention_scalar_key):
            assert key is None or key in family.defaults, t
        assert all(f.gguf_arch != family.gguf_arch for f in others if family.gguf_arch), t


def _rules_by_model_type(path: Path) -> list[str]:
    """Comparisons that decide by a `model_type` name (`model_type == "gemma3_text"`), or by
    whether a defaults table holds a named key (`"hidden_activation" in d`), in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = [x.value for x in sides if isinstance(x, ast.Constant) and isinstance(x.value, str)]
        right = ast.unparse(node.comparators[-1])
        by_key = right in ("d", "defaults") or right.endswith(".defaults")
        if any(v in FAMILIES for v in named) or (named and by_key):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_config_modules_ask_the_record_never_the_model_type():
    found = []
    for name in ("config.py", "config_fields.py", "vision_language.py", "gguf_convert.py"):
        found += _rules_by_model_type(MODEL / name)
    assert found == []
