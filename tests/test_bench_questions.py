"""`bench --questions` on a tiny model: every answer agrees with the gold loop and the single
runs, the fed tokens split into texts and tails, and the report says where the time went."""

from __future__ import annotations

from test_questions import QUESTIONS, TEXTS

from mlxbatch.bench.questions import bench_questions, format_questions
from mlxbatch.engine.questions import questions_from


def test_the_report_splits_tokens_and_time_and_agrees_with_the_gold_loop(tiny_model_dir):
    questions = questions_from(QUESTIONS)
    r = bench_questions(tiny_model_dir, questions, TEXTS, None, True, lambda _: None)
    assert r["agreement_gold"] == 1.0 and r["agreement_single"] == 1.0
    fed = r["questions"]["fed_tokens"]
    assert 0 < r["text_tokens"] < fed and r["token_ratio"] > 1
    assert r["single"]["fed_tokens"] > fed
    assert set(r["phases"]) == {"layout", "forward", "labels"}
    text = format_questions(r)
    assert f"{r['text_tokens']:,} of the texts" in text and "forward" in text
    assert "gold loop" in text and "x a single-question run's" in text
