"""Foundation: forward pass parity with transformers, caching, conversion, bad checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlxbatch.bench.parity import ATOL, run_parity
from mlxbatch.engine.layout import batch_mask
from mlxbatch.errors import ModelError
from mlxbatch.model.cache import KVCache
from mlxbatch.model.config import ModelArgs
from mlxbatch.model.convert import PRESETS, convert_hf, init_random
from mlxbatch.model.load import load_model
from mlxbatch.model.weights import load_tensors, weight_files


def test_logits_match_transformers_and_mlx_lm(hf_and_mlx):
    hf, mlx_dir = hf_and_mlx
    reports = run_parity(hf, mlx_dir)
    for r in reports:
        assert r.passed, r.line()
        assert r.max_abs < ATOL
    assert reports[0].positions > 100  # single and padded batches were compared


def test_parity_detects_a_wrong_weight(tied_pair, tmp_path):
    hf, mlx_dir = tied_pair
    broken = tmp_path / "broken"
    shutil.copytree(mlx_dir, broken)
    t = mx.load(str(broken / "model.safetensors"))
    t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"] * 1.01
    mx.save_safetensors(str(broken / "model.safetensors"), t)
    reports = run_parity(hf, broken, with_mlx_lm=False)
    assert not reports[0].passed


def test_cached_forward_equals_uncached(tiny_model_dir):
    lm = load_model(tiny_model_dir)
    tokens = lm.tokenizer.prompt("Be brief.", "The app crashes on start, error 0x1F.")
    full = lm.model(mx.array([tokens]))
    a = lm.model.args
    cache = KVCache.allocate(
        a.num_hidden_layers, 1, a.num_key_value_heads, a.head_dim, len(tokens), mx.float32
    )
    parts, start = [], 0
    for size in (7, 1, 5, len(tokens)):  # prefill in uneven chunks, then the rest
        chunk = tokens[start : start + size]
        if not chunk:
            break
        end = start + len(chunk)
        mask = mx.array(batch_mask(0, [0], [end], end, start, len(chunk)))  # causal, offset
        parts.append(lm.model(mx.array([chunk]), cache, start, mask))
        start += len(chunk)
    cached = mx.concatenate(parts, axis=1)
    assert cache.offset == len(tokens)
    np.testing.assert_allclose(np.array(cached), np.array(full), atol=1e-5)


def test_conversion_round_trip_is_bit_exact(hf_and_mlx, tmp_path):
    hf, mlx_dir = hf_and_mlx
    src = load_tensors(weight_files(hf))
    out = load_tensors(weight_files(mlx_dir))
    args = ModelArgs.load(hf)
    if args.tie_word_embeddings:
        src.pop("lm_head.weight", None)
    assert set(src) == set(out)
    for name, t in src.items():
        assert t.dtype == out[name].dtype
        assert np.array_equal(np.array(t).view(np.uint8), np.array(out[name]).view(np.uint8)), name
    manifest = json.loads((mlx_dir / "mlxbatch.json").read_text())
    assert manifest["tensors"] == len(out) and not manifest["synthetic"]
    # converting the converted directory again changes nothing
    again = convert_hf(mlx_dir, tmp_path / "again")
    assert again["sha256"] == manifest["sha256"]


def test_convert_casts_dtype(tied_pair, tmp_path):
    hf, _ = tied_pair
    m = convert_hf(hf, tmp_path / "bf16", dtype="bfloat16")
    assert m["dtype"] == "bfloat16"
    lm = load_model(tmp_path / "bf16", dtype="float32")
    assert lm.model.model.embed_tokens.weight.dtype == mx.float32


def test_sharded_checkpoint_loads(tied_pair, tmp_path):
    hf, mlx_dir = tied_pair
    tensors = mx.load(str(mlx_dir / "model.safetensors"))
    names = sorted(tensors)
    shard_dir = tmp_path / "sharded"
    shutil.copytree(mlx_dir, shard_dir)
    (shard_dir / "model.safetensors").unlink()
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, keys in halves.items():
        mx.save_safetensors(str(shard_dir / file), {k: tensors[k] for k in keys})
    index = {"weight_map": {k: f for f, keys in halves.items() for k in keys}}
    (shard_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    a, b = load_model(mlx_dir), load_model(shard_dir)
    ids = mx.array([a.tokenizer.prompt("x", "hello")])
    assert mx.array_equal(a.model(ids), b.model(ids))
    # a tensor in two shards (other values in the second) would let the later file win,
    # whatever the index says: refused, naming both files
    first = names[0]
    extra = {first: tensors[first] * 2, names[1]: tensors[names[1]]}
    mx.save_safetensors(str(shard_dir / "model-00002-of-00002.safetensors"), extra)
    with pytest.raises(ModelError, match=f"tensor {first} is also in .*model-00001"):
        load_model(shard_dir)


def test_qwen25_preset_has_the_published_parameter_count():
    args = ModelArgs.from_dict(PRESETS["qwen2.5-0.5b"])
    total = sum(int(np.prod(s)) for s in args.expected_shapes().values())
    assert total == 494_032_768
    assert (args.head_dim, args.n_rep) == (64, 7)


def test_init_random_is_deterministic_and_marked_synthetic(tmp_path):
    a = init_random(tmp_path / "a", preset="tiny", seed=3, dtype="float32")
    b = init_random(tmp_path / "b", preset="tiny", seed=3, dtype="float32")
    c = init_random(tmp_path / "c", preset="tiny", seed=4, dtype="float32")
    assert a["sha256"] == b["sha256"] != c["sha256"]
    assert (
        a["synthetic"]
        and json.loads((tmp_path / "a/config.json").read_text())["mlxbatch_synthetic"]
    )
    lm = load_model(tmp_path / "a")
    assert lm.synthetic and "SYNTHETIC" in lm.describe()
    assert lm.model.num_parameters() == a["parameters"]


@pytest.fixture()
def model_copy(tiny_model_dir, tmp_path) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(tiny_model_dir, dst)
    return dst


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text()) | changes
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("missing_tensor", "missing from the checkpoint"),
        ("extra_tensor", "unexpected tensor"),
        ("wrong_shape", "has shape"),
        ("truncated", "truncated"),
        ("bad_header", "corrupt safetensors header"),
        ("model_type", "model_type 'gpt2' is not supported"),
        ("sliding_window", "sliding-window attention is not supported"),
        ("no_weights", "no *.safetensors"),
        ("pickle_only", "pickled PyTorch weights are never loaded"),
        ("bad_config_json", "not valid JSON"),
    ],
)
def test_bad_checkpoints_fail_clearly(model_copy, breakage, message):
    weights = model_copy / "model.safetensors"
    if breakage in ("missing_tensor", "extra_tensor", "wrong_shape"):
        t = mx.load(str(weights))
        if breakage == "missing_tensor":
            del t["model.layers.1.mlp.down_proj.weight"]
        elif breakage == "extra_tensor":
            t["model.layers.9.mlp.down_proj.weight"] = mx.zeros((2, 2))
        else:
            t["model.norm.weight"] = mx.ones((3,))
        mx.save_safetensors(str(weights), t)
    elif breakage == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif breakage == "bad_header":
        data = bytearray(weights.read_bytes())
        data[10:20] = b"\xff" * 10
        weights.write_bytes(bytes(data))
    elif breakage == "model_type":
        _edit_config(model_copy, model_type="gpt2")
    elif breakage == "sliding_window":
        _edit_config(model_copy, use_sliding_window=True)
    elif breakage in ("no_weights", "pickle_only"):
        weights.unlink()
        if breakage == "pickle_only":
            (model_copy / "pytorch_model.bin").write_bytes(b"not loaded")
    elif breakage == "bad_config_json":
        (model_copy / "config.json").write_text("{nope")
    with pytest.raises(ModelError, match=message.replace("*", r"\*")):
        load_model(model_copy)


def test_non_finite_weights_are_caught_when_asked(model_copy):
    weights = model_copy / "model.safetensors"
    t = mx.load(str(weights))
    t["model.norm.weight"] = mx.full(t["model.norm.weight"].shape, float("nan"))
    mx.save_safetensors(str(weights), t)
    load_model(model_copy)  # the check is optional: off by default
    with pytest.raises(ModelError, match="NaN or infinite"):
        load_model(model_copy, check_finite=True)


@pytest.mark.parametrize("layout", ["plain", "tiled"])
@pytest.mark.parametrize("heads,kv", [(4, 2), (14, 2), (3, 3)])
@pytest.mark.parametrize("mask_kind", ["array", "causal", "none"])
def test_host_attention_equals_mlx_sdpa(heads, kv, mask_kind, layout):
    from mlxbatch.model import hostops

    rng = np.random.default_rng(heads * 10 + kv)
    B, L, S, hd = 3, 5, 9, 16
    q, k, v = (
        mx.array(rng.standard_normal(s).astype(np.float32))
        for s in ((B, heads, L, hd), (B, kv, S, hd), (B, kv, S, hd))
    )
    mask = {
        "array": mx.array(rng.random((B, 1, L, S)) < 0.7) | mx.eye(L, S, S - L, dtype=mx.bool_),
        "causal": "causal",
        "none": None,
    }[mask_kind]
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    got = hostops.KERNELS[layout][1](q, k, v, 0.25, hostops.prepare(mask, L, S))
    np.testing.assert_allclose(np.array(got), np.array(want), atol=2e-6)


@pytest.mark.parametrize("layout", ["plain", "tiled"])
@pytest.mark.parametrize("m,n,k", [(1, 8, 16), (3, 4864, 896), (300, 64, 64), (517, 130, 40)])
def test_each_layouts_product_is_x_times_w_transposed(layout, m, n, k):
    """The layouts' row padding and tiling leave x @ w.T + bias (rows past a tile included)."""
    from mlxbatch.model import hostops

    rng = np.random.default_rng(m + n)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, m, k), (n, k), (n,)))
    product = hostops.KERNELS[layout][0]
    for bias in (None, b):
        got = np.array(product(mx.array(x), mx.array(w), None if bias is None else mx.array(b)))
        want = x @ w.T + (0 if bias is None else b)
        assert got.shape == (2, m, n)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_host_attention_gives_zeros_for_a_row_that_sees_nothing():
    from mlxbatch.model import hostops

    q, k, v = mx.ones((1, 2, 2, 4)), mx.ones((1, 1, 3, 4)), mx.ones((1, 1, 3, 4))
    mask = mx.array([[[[True, True, False], [False, False, False]]]])
    out = np.array(hostops.attention(q, k, v, 0.5, hostops.prepare(mask, 2, 3)))
    assert np.isfinite(out).all() and (out[0, :, 1] == 0).all() and (out[0, :, 0] == 1).all()


def test_host_silu_equals_the_mlx_formula_and_is_quiet_at_the_extremes():
    import warnings

    from mlxbatch.model import hostops

    g = mx.array(
        np.concatenate([np.linspace(-200, 200, 3001), [-1e30, 1e30, 0.0]]).astype(np.float32)
    )
    g = mx.broadcast_to(g, (40, g.size)) * mx.linspace(0.5, 1.5, 40)[:, None]  # rows in chunks
    u = mx.random.normal(g.shape, key=mx.random.key(0))
    want = np.array(g / (1 + mx.exp(-g)) * u)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning from exp(-g)
        got = np.array(hostops.silu_mul(g, u * 1))  # u * 1: a fresh array, as the MLP passes
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)  # exp: last bits only


def test_host_forward_and_last_position_forward_equal_the_mlx_forward(tiny_model_dir):
    from mlxbatch.engine.layout import RowLayout

    lm = load_model(tiny_model_dir)
    prefix = lm.tokenizer.shared_prefix("Be brief.", ())
    prompts = [
        lm.tokenizer.prompt("Be brief.", t)
        for t in ("short", "a longer ticket " * 9, "mid one here")
    ]
    layout = RowLayout.build(prompts, prefix, 0)
    a = lm.model.args

    def forward(**kw):
        pre = KVCache.allocate(
            a.num_hidden_layers, 1, a.num_key_value_heads, a.head_dim, len(prefix), mx.float32
        )
        lm.model(mx.array([prefix]), pre, 0, "causal", host_kernels=kw.get("host_kernels", False))
        kv = pre.expand(layout.batch, layout.capacity)
        return lm.model(
            mx.array(layout.tokens()),
            kv,
            mx.array(layout.positions()),
            mx.array(layout.mask()),
            **kw,
        )

    plain = np.array(forward())
    last = layout.last()
    np.testing.assert_allclose(np.array(forward(host_kernels=True)), plain, atol=2e-5)
    for host_kernels in (False, True):
        kept = np.array(forward(host_kernels=host_kernels, keep=mx.array(last)))
        assert kept.shape == (layout.batch, 1, a.hidden_size)
        np.testing.assert_allclose(kept[:, 0], plain[np.arange(layout.batch), last], atol=2e-5)


def test_mlx_keeps_freed_buffers_up_to_the_largest_batch_and_never_less():
    from mlxbatch.runtime.memory import keep_freed_buffers

    before = mx.set_cache_limit(64 << 20)
    try:
        keep_freed_buffers(256 << 20)
        assert mx.set_cache_limit(256 << 20) == 256 << 20
        keep_freed_buffers(1 << 20)  # lower: ignored
        assert mx.set_cache_limit(256 << 20) == 256 << 20
    finally:
        mx.set_cache_limit(before)
