"""Every family on tiny random checkpoints saved by `transformers`: logits equal to transformers',
every scoring mode equal to the gold loop, labels equal to an independent transformers scoring.

One checkpoint a case, tied and untied heads, each family's own switches turned on (Llama 3
rope scaling and biases, Qwen3's explicit head_dim, Gemma 3's sliding layers with prompts
several windows long, Phi-4-mini's LongRoPE with partial rotary, Phi-3's all-sliding layers).
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import save_randomised
from fast_path import score_batch

from mlxbatch.engine.engine import Engine
from mlxbatch.engine.labels import LabelSet
from mlxbatch.engine.planner import plan_batches
from mlxbatch.engine.prompt import default_system_prompt
from mlxbatch.engine.scheduler import score_all
from mlxbatch.errors import ModelError
from mlxbatch.model.load import LoadedModel, load_model
from mlxbatch.model.tokenizer import PromptTokenizer

SMALL = dict(
    vocab_size=151936,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
)
_LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 500000.0,
}
_GEMMA_ROPE = {
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
}
_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "original_max_position_embeddings": 256,
    "short_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 4.0],
    "long_factor": [2.0, 3.0, 4.0, 6.0, 8.0, 9.0],
}
CASES = {
    # name: (transformers config class, its arguments)
    "llama3_tied_biased": (
        "LlamaConfig",
        dict(tie_word_embeddings=True, rope_parameters=_LLAMA3, attention_bias=True, mlp_bias=True),
    ),
    "llama_untied_head_dim": ("LlamaConfig", dict(tie_word_embeddings=False, head_dim=24)),
    "qwen3_tied": ("Qwen3Config", dict(tie_word_embeddings=True, head_dim=32)),
    "qwen3_untied": ("Qwen3Config", dict(tie_word_embeddings=False, head_dim=16)),
    "gemma3_sliding": (
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=3,
            head_dim=16,
            sliding_window=8,
            query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters=_GEMMA_ROPE,
            hidden_activation="gelu_pytorch_tanh",
        ),
    ),
    # Gemma 3 4B+: the same decoder inside Gemma3ForConditionalGeneration, beside a vision tower
    "gemma3_vision_language": (
        "Gemma3Config",
        dict(
            num_hidden_layers=3,
            head_dim=16,
            sliding_window=8,
            query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters=_GEMMA_ROPE,
            hidden_activation="gelu_pytorch_tanh",
        ),
    ),
    "phi4mini_longrope": (
        "Phi3Config",
        dict(
            tie_word_embeddings=True,
            partial_rotary_factor=0.75,
            rope_parameters=_LONGROPE,
            max_position_embeddings=4096,
            original_max_position_embeddings=256,
        ),
    ),
    "phi3_untied_sliding": ("Phi3Config", dict(tie_word_embeddings=False, sliding_window=8)),
}
LABELS = ("billing", "account access", "technical support team")  # multi-token labels too
TEXTS = [
    "I was charged twice this month",
    "x",
    "the app crashes " * 6,
    "\n\nstarts with blank lines",
    " 数据 sync ünïcode error 0x1F ",
]


def make_checkpoint(path: Path, case: str, seed: int = 0) -> Path:
    import torch
    import transformers

    cls_name, kwargs = CASES[case]
    if cls_name == "Gemma3Config":  # the kwargs are its language model's; a tiny vision tower
        vision = transformers.SiglipVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        )
        text = transformers.Gemma3TextConfig(**(SMALL | kwargs)).to_dict()
        cfg = transformers.Gemma3Config(
            text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4
        )
    else:
        cfg = getattr(transformers, cls_name)(**(SMALL | kwargs))
    torch.manual_seed(seed)
    return save_randomised(transformers.AutoModelForCausalLM.from_config(cfg).float(), path)


@dataclass
class Case:
    name: str
    path: Path
    lm: LoadedModel
    hf: object  # the transformers model of the same checkpoint


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory) -> Case:
    import torch
    from transformers import AutoModelForCausalLM

    path = make_checkpoint(tmp_path_factory.mktemp(request.param), request.param)
    hf = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return Case(request.param, path, load_model(path), hf)


def make_engine(lm, prefix_cache: bool = True) -> Engine:
    labels = LabelSet.build(LABELS, lm.tokenizer.label, lm.model.args.vocab_size)
    return Engine(lm, labels, default_system_prompt(LABELS), prefix_cache)


def test_logits_equal_transformers(case):
    import torch

    tokens = case.lm.tokenizer.prompt(default_system_prompt(LABELS), TEXTS[2])
    assert len(tokens) > 40  # several Gemma / Phi-3 windows of 8
    ours = np.array(case.lm.model.head(case.lm.model(mx.array([tokens])))[0])
    with torch.no_grad():
        ref = case.hf(input_ids=torch.tensor([tokens])).logits[0].numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4, err_msg=case.name)


def transformers_scores(hf, prompts: list[list[int]], labels: LabelSet) -> np.ndarray:
    """Label probabilities from whole sequences (prompt + label) through transformers, the
    full-vocabulary log-softmax at each label token, in one right-padded batch."""
    import torch

    seqs = [
        (i, j, p + list(t[:-1])) for i, p in enumerate(prompts) for j, t in enumerate(labels.tokens)
    ]
    width = max(len(s) for *_, s in seqs)
    ids = torch.tensor([s + [0] * (width - len(s)) for *_, s in seqs])  # causal: pads come last
    with torch.no_grad():
        h = hf.model(input_ids=ids).last_hidden_state
        sums = np.zeros((len(prompts), len(labels.tokens)))
        for row, (i, j, _) in enumerate(seqs):
            label, n = labels.tokens[j], len(prompts[i])
            logp = torch.log_softmax(hf.lm_head(h[row, n - 1 : n - 1 + len(label)]), -1)
            sums[i, j] = sum(float(logp[k, t]) for k, t in enumerate(label))
    return np.exp(sums - sums.max(1, keepdims=True)) / np.exp(
        sums - sums.max(1, keepdims=True)
    ).sum(1, keepdims=True)


def test_every_mode_equals_the_gold_loop_and_transformers(case):
    gold_engine = make_engine(case.lm, prefix_cache=False)
    prompts = [gold_engine.prompt(t) for t in TEXTS]
    gold = np.stack([gold_engine.score_gold(p) for p in prompts])
    for prefix_cache, mode, max_batch in (
        (True, "greedy", 4),
        (True, "sequential", 1),
        (False, "naive", 3),
    ):
        e = make_engine(case.lm, prefix_cache)
        probs = score_all(e, prompts, plan_batches(e.fed_lengths(prompts), mode, 10_000, max_batch))
        assert (probs.argmax(1) == gold.argmax(1)).all(), (case.name, mode, prefix_cache)
        np.testing.assert_allclose(probs, gold, atol=2e-6, err_msg=f"{case.name} {mode}")
    ref = transformers_scores(case.hf, prompts, gold_engine.labels)
    assert (ref.argmax(1) == gold.argmax(1)).all(), case.name
    np.testing.assert_allclose(gold, ref, atol=1e-4, err_msg=case.name)


def test_random_texts_never_see_past_the_window_on_the_fast_path():
    """The sliding mask is a pure function of the layout's mask: the last `window` visible keys
    of each query, whatever the padding and shared-prefix slots around them."""
    from mlxbatch.engine.layout import RowLayout
    from mlxbatch.model.decoder import sliding_mask

    r = random.Random(0)
    prefix = list(range(1, 13))
    prompts = [
        prefix[: r.randint(9, 12)] + [50 + r.randint(0, 9)] * r.randint(1, 9) for _ in range(5)
    ]
    lay = RowLayout.build(prompts, prefix, label_slots=0)
    full = lay.mask()
    slid = np.array(sliding_mask(mx.array(full), 4, lay.width, lay.capacity))
    pos = np.full(full.shape[-1], -1)
    for b in range(lay.batch):
        # each key slot's position in row b, and each query's: visible keys precede it in order
        seen = full[b, 0, -1] | full[b, 0].any(0)
        pos = np.cumsum(seen) - 1
        for q in range(lay.lengths[b]):
            qpos = lay.shared[b] + q
            want = full[b, 0, q] & (pos > qpos - 4)
            assert (slid[b, 0, q] == want).all()


# Chat templates as their checkpoints publish them, with the Qwen tokenizer's control tokens in
# place of each family's own (so template text holds special tokens this tokenizer knows).
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}{%- set role = "model" -%}
    {%- else -%}{%- set role = message['role'] -%}{%- endif -%}
    {{ '<|im_start|>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<|im_end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{'<|im_start|>model\n'}}{%- endif -%}"""
LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|im_start|>system<|endoftext|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|im_end|>" }}
{%- for message in messages %}
    {{- '<|im_start|>' + message['role'] + '<|endoftext|>\n\n'+ message['content'] | trim + '<|im_end|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant<|endoftext|>\n\n' }}
{%- endif %}"""
NO_SYSTEM_TEMPLATE = """{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}
{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>\n' }}{% endfor %}
{% if add_generation_prompt %}{{'<|im_start|>model\n'}}{% endif %}"""
TEMPLATES = {"gemma3": GEMMA3_TEMPLATE, "llama3": LLAMA3_TEMPLATE, "no_system": NO_SYSTEM_TEMPLATE}
EXAMPLES = (("I was charged twice.", "billing"), ("  The app crashes\n", "technical support team"))


def with_template(src: Path, dst: Path, template: str) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": template}))
    return dst


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("gemma_template"), "gemma3_sliding")


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_prompts_are_the_templates_as_transformers_renders_them(name, gemma_dir, tmp_path):
    from transformers import AutoTokenizer

    path = with_template(gemma_dir, tmp_path / name, TEMPLATES[name])
    ours, ref = PromptTokenizer(path), AutoTokenizer.from_pretrained(path)
    system = default_system_prompt(LABELS)
    for examples in ((), EXAMPLES):
        prefix = ours.shared_prefix(system, examples)
        for text in TEXTS:
            msgs = [{"role": "system", "content": system}]
            for t, label in examples:
                msgs += [{"role": "user", "content": t}, {"role": "assistant", "content": label}]
            msgs.append({"role": "user", "content": text})
            if name == "no_system":  # folded in front of the first user turn (chat.py)
                msgs = [dict(msgs[1], content=system + "\n\n" + msgs[1]["content"]), *msgs[2:]]
            want = ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            want = list(want["input_ids"] if hasattr(want, "keys") else want)
            got = ours.prompt(system, text, examples)
            assert got == want, (name, examples, text)
            assert got[: len(prefix) - 2] == prefix[:-2]  # the shared prefix, up to BPE merges
    answer = {"gemma3": "model\n", "llama3": "\n\n", "no_system": "model\n"}[name]
    assert ours.answer == answer


def test_a_folded_system_prompt_still_gives_one_shared_prefix(gemma_dir, tmp_path):
    """Gemma's template puts the system prompt inside the first user turn: without examples
    that turn is the item's, and the prefix still holds the system text; every mode equals the
    gold loop on it."""
    path = with_template(gemma_dir, tmp_path / "gemma", GEMMA3_TEMPLATE)
    lm = load_model(path)
    e = make_engine(lm)
    system = default_system_prompt(LABELS)
    assert lm.tokenizer.decode(e.prefix).endswith(system + "\n\n")
    prompts = [e.prompt(t) for t in TEXTS]
    gold = np.stack([e.score_gold(p) for p in prompts])
    probs = score_all(e, prompts, plan_batches(e.fed_lengths(prompts), "greedy", 10_000, 4))
    np.testing.assert_allclose(probs, gold, atol=2e-6)


PUBLISHED_PARAMETERS = {
    "qwen3-0.6b": 596_049_920,
    "llama-3.2-1b": 1_235_814_400,
    "gemma-3-1b": 999_885_952,
    "phi-4-mini": 3_836_021_760,
}


@pytest.mark.parametrize("preset", list(PUBLISHED_PARAMETERS))
def test_presets_have_the_published_parameter_counts(preset):
    from mlxbatch.model.config import ModelArgs
    from mlxbatch.model.presets import PRESETS

    args = ModelArgs.from_dict(PRESETS[preset])
    assert (
        sum(int(np.prod(s)) for s in args.expected_shapes().values())
        == (PUBLISHED_PARAMETERS[preset])
    )


def test_published_config_spellings_give_the_same_args():
    """Old configs (rope_theta + rope_scaling, Gemma's rope_local_base_freq and
    sliding_window_pattern) and transformers >= 5's (rope_parameters) normalise alike."""
    from mlxbatch.model.config import ModelArgs
    from mlxbatch.model.presets import PRESETS

    old = PRESETS["gemma-3-1b"]
    new = {
        k: v
        for k, v in old.items()
        if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling", "sliding_window_pattern")
    }
    new |= {
        "layer_types": [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)
        ],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }
    assert ModelArgs.from_dict(old) == ModelArgs.from_dict(new)
    llama = PRESETS["llama-3.2-1b"]
    moved = {k: v for k, v in llama.items() if k not in ("rope_theta", "rope_scaling")}
    moved["rope_parameters"] = llama["rope_scaling"] | {"rope_theta": llama["rope_theta"]}
    assert ModelArgs.from_dict(llama) == ModelArgs.from_dict(moved)
    phi = ModelArgs.from_dict(PRESETS["phi-4-mini"])
    assert phi.max_position_embeddings == 4096 and phi.layer_types == ()  # window >= context


@pytest.mark.parametrize("case", ["phi4mini_longrope"])  # fused projections
def test_quantized_conversion_loads_for_any_family(case, tmp_path):
    from mlxbatch.model.convert import convert_hf
    from mlxbatch.model.hub import describe_dir

    hf = make_checkpoint(tmp_path / "hf", case)
    convert_hf(hf, tmp_path / "q8", q_bits=8, q_group_size=32)
    dense, q = load_model(hf), load_model(tmp_path / "q8")
    assert q.quantization["bits"] == 8
    tokens = mx.array([q.tokenizer.prompt("Be brief.", TEXTS[0])])
    a, b = (np.array(m.model.head(m.model(tokens))) for m in (dense, q))
    assert np.abs(a - b).max() < 0.05  # 8-bit weights: close, not equal
    assert describe_dir(tmp_path / "q8")["family"] == dense.model.args.family.name


def test_mlx_lm_is_given_the_published_config_spelling():
    from mlxbatch.bench.parity import mlx_lm_config

    gemma = {
        "model_type": "gemma3_text",
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    }
    cfg, note = mlx_lm_config(gemma)
    assert (cfg["rope_theta"], cfg["rope_local_base_freq"], cfg["sliding_window_pattern"]) == (
        1e6,
        1e4,
        2,
    )
    assert cfg["rope_scaling"] == {"type": "linear", "rope_type": "linear", "factor": 8.0}
    assert note == ""
    cfg, note = mlx_lm_config({"model_type": "phi3", "rope_parameters": _LONGROPE})
    assert cfg["rope_scaling"]["long_factor"] == _LONGROPE["short_factor"]
    assert note == " (short factors)"


def test_init_random_widens_a_smaller_vocabulary_and_zeroes_gemma_norms(tmp_path, monkeypatch):
    from mlxbatch.model import convert
    from mlxbatch.model.presets import PRESETS

    shrink = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    monkeypatch.setitem(PRESETS, "llama-small", PRESETS["llama-3.2-1b"] | shrink)
    monkeypatch.setitem(PRESETS, "gemma-small", PRESETS["gemma-3-1b"] | shrink)
    m = convert.init_random(tmp_path / "llama", "llama-small", dtype="float32")
    assert m["vocab_size_widened"].startswith("128256 -> 151936")
    lm = load_model(tmp_path / "llama")
    assert lm.model.args.vocab_size == 151936 and lm.synthetic
    convert.init_random(tmp_path / "gemma", "gemma-small", dtype="float32")
    lm = load_model(tmp_path / "gemma")
    assert float(mx.abs(lm.model.model.norm.weight).max()) == 0.0  # (1 + w): unit scale
    e = make_engine(lm)
    p = e.prompt(TEXTS[0])
    np.testing.assert_allclose(score_batch(e, [p])[0], e.score_gold(p), atol=2e-6)


def test_a_vision_language_checkpoint_runs_its_language_model(tmp_path):
    """Gemma 3 4B+ is saved as `gemma3` (Gemma3ForConditionalGeneration): its language model
    loads (the vision tower's tensors passed over), converts to a plain `gemma3_text` model,
    and runs quantized in the layout mlx-vlm writes (the language model's prefix kept)."""
    from mlxbatch.model.convert import convert_hf
    from mlxbatch.model.hub import describe_dir

    hf = make_checkpoint(tmp_path / "hf", "gemma3_vision_language")
    from safetensors import safe_open

    with safe_open(str(hf / "model.safetensors"), "np") as f:
        stored = list(f.keys())
    assert json.loads((hf / "config.json").read_text())["model_type"] == "gemma3"
    assert any(k.startswith("vision_tower.") for k in stored)
    assert all(not k.startswith("model.layers.") for k in stored)  # the language model's prefix
    lm = load_model(hf)
    assert lm.model.args.vision_language and lm.model.args.family.name == "Gemma 3"
    assert describe_dir(hf)["family"] == "Gemma 3 (with vision)"
    tokens = mx.array([lm.tokenizer.prompt("Be brief.", TEXTS[2])])
    ours = np.array(lm.model.head(lm.model(tokens)))

    convert_hf(hf, tmp_path / "text")
    cfg = json.loads((tmp_path / "text" / "config.json").read_text())
    assert cfg["model_type"] == "gemma3_text" and "vision_config" not in cfg
    text = load_model(tmp_path / "text")
    assert not text.model.args.vision_language
    from mlxbatch.engine.calibration import cache_key

    # one decoder, one calibration (the flag is where the weights came from, no shape)
    assert cache_key(make_engine(lm)) == cache_key(make_engine(text))
    np.testing.assert_array_equal(np.array(text.model.head(text.model(tokens))), ours)

    # quantized as mlx-vlm leaves it: the text tensors under language_model.model., the config
    # a gemma3 one holding the quantization
    convert_hf(hf, tmp_path / "q8", q_bits=8, q_group_size=32)
    vl = tmp_path / "q8-vl"
    shutil.copytree(tmp_path / "q8", vl)
    (vl / "mlxbatch.json").unlink()
    tensors = mx.load(str(vl / "model.safetensors"))
    mx.save_safetensors(
        str(vl / "model.safetensors"), {"language_model." + k: v for k, v in tensors.items()}
    )
    q_cfg = json.loads((vl / "config.json").read_text())
    outer = {
        "model_type": "gemma3",
        "quantization": q_cfg.pop("quantization"),
        "text_config": q_cfg | {"model_type": "gemma3_text"},
    }
    (vl / "config.json").write_text(json.dumps(outer))
    q = load_model(vl)
    assert q.quantization["bits"] == 8 and q.model.args.vision_language
    assert np.abs(np.array(q.model.head(q.model(tokens))) - ours).max() < 0.05


def test_a_processors_chat_template_serves_where_the_tokenizer_has_none(gemma_dir, tmp_path):
    from mlxbatch.model.chat import read_template

    inline = with_template(gemma_dir, tmp_path / "inline", GEMMA3_TEMPLATE)
    processor = tmp_path / "processor"
    shutil.copytree(inline, processor)
    cfg = json.loads((processor / "tokenizer_config.json").read_text())
    (processor / "chat_template.json").write_text(
        json.dumps({"chat_template": cfg.pop("chat_template")})
    )
    (processor / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert read_template(processor)[2] == f"{processor / 'chat_template.json'} (chat_template)"
    a, b = PromptTokenizer(inline), PromptTokenizer(processor)
    assert a.prompt("Be brief.", "hello") == b.prompt("Be brief.", "hello")
    (processor / "chat_template.json").write_text("{not json")
    with pytest.raises(ModelError, match="chat_template.json: cannot be read as JSON"):
        read_template(processor)
    # a file there without a template was read as absent: ChatML ran in its place, silently
    for held in ('"x"', "{}", '{"chat_template": ""}', '{"chat_template": null}', "[]"):
        (processor / "chat_template.json").write_text(held)
        with pytest.raises(ModelError, match="chat_template.json: holds no template"):
            read_template(processor)
    named = [
        {"name": "tool_use", "template": "x"},
        {"name": "default", "template": GEMMA3_TEMPLATE},
    ]
    (processor / "chat_template.json").write_text(json.dumps({"chat_template": named}))
    assert PromptTokenizer(processor).prompt("Be brief.", "hello") == a.prompt("Be brief.", "hello")


def test_a_vision_language_config_is_checked_as_its_language_models():
    from mlxbatch.model.config import ModelArgs

    with pytest.raises(ModelError, match="text_config must be an object"):
        ModelArgs.from_dict({"model_type": "gemma3", "text_config": [1]})
    with pytest.raises(ModelError, match=r"gemma3 \(its language model\)"):
        ModelArgs.from_dict({"model_type": "llava"})
    # the published 4B config's text_config: no heads, no vocabulary (transformers' defaults)
    args = ModelArgs.from_dict(
        {
            "model_type": "gemma3",
            "text_config": {
                "hidden_size": 2560,
                "intermediate_size": 10240,
                "model_type": "gemma3_text",
                "num_hidden_layers": 34,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                "sliding_window": 1024,
            },
        }
    )
    assert (args.num_attention_heads, args.num_key_value_heads, args.head_dim, args.vocab_size) == (
        8,
        4,
        256,
        262_208,
    )
    assert args.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",)
