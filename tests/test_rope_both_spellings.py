"""A config.json holding both `rope_scaling` and `rope_parameters` runs as transformers runs it:
`rope_scaling` replaces `rope_parameters` whole (theta and partial rotary included; the
top-level keys and the family's defaults fill what it omits), and Gemma 3 merges it into the
full-attention layers' entry; where it has no such entry to go to, one line refuses it."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from test_families import LABELS, TEXTS, make_checkpoint

from mlxbatch.engine.prompt import default_system_prompt
from mlxbatch.errors import ModelError
from mlxbatch.model.config import ModelArgs
from mlxbatch.model.load import load_model

BOTH = {
    # the saved rope_parameters: llama3 scaling at theta 500,000; transformers runs linear at
    # its default theta (10,000)
    "llama3_tied_biased": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    # rope_parameters: plain rope at theta 1e6; rope_scaling's own theta and type win
    "qwen3_tied": {"rope_scaling": {"rope_type": "default", "rope_theta": 5000.0}},
    # the full-attention entry (linear, factor 8, theta 1e6) takes rope_scaling's factor
    "gemma3_sliding": {"rope_scaling": {"factor": 2.0}},
    # LongRoPE at 0.75 partial rotary replaced by plain rope at rope_scaling's 0.5
    "phi4mini_longrope": {"rope_scaling": {"rope_type": "default", "partial_rotary_factor": 0.5}},
}


@pytest.mark.parametrize("case", list(BOTH))
def test_both_rope_spellings_run_as_transformers_runs_them(case, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    path = make_checkpoint(tmp_path / case, case)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg.get("rope_parameters")  # what transformers >= 5 saves
    (path / "config.json").write_text(json.dumps(cfg | BOTH[case]))
    hf = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    lm = load_model(path, dtype="float32")
    tokens = lm.tokenizer.prompt(default_system_prompt(LABELS), TEXTS[2])
    ours = np.array(lm.model.head(lm.model(mx.array([tokens])))[0])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([tokens])).logits[0].numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4, err_msg=case)


def test_rope_scaling_beside_gemma_rope_parameters_without_a_full_attention_entry_is_refused():
    cfg = {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 1000,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
    }
    with pytest.raises(
        ModelError,
        match=r"^config.json: rope_scaling is given beside a "
        "rope_parameters without a 'full_attention' entry",
    ):
        ModelArgs.from_dict(cfg)
