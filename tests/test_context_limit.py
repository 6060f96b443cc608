"""The per-item limit the model's context sets names the config.json key it comes from:
`original_max_position_embeddings` for LongRoPE (the context is capped there), else
`max_position_embeddings`."""

from __future__ import annotations

import pytest
from test_families import make_checkpoint, make_engine

from mlxbatch.api.spec import RunSpec, item_limit
from mlxbatch.model.load import load_model


@pytest.mark.parametrize(
    ("case", "key", "tokens"),
    [
        ("phi4mini_longrope", "original_max_position_embeddings", 256),
        ("phi3_untied_sliding", "max_position_embeddings", 1024),
    ],
)
def test_the_context_limit_names_the_key_it_comes_from(case, key, tokens, tmp_path):
    engine = make_engine(load_model(make_checkpoint(tmp_path / case, case)))
    limit = item_limit(engine, RunSpec())
    assert limit.source == f"the model's context ({key})"
    fp = engine.footprint
    assert limit.tokens == tokens - fp.prefix - fp.label_len
