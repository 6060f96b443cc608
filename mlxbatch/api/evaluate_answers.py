"""How good the answers to several questions are, question by question, against the gold
fields named as the questions: a single-label question as one label set is evaluated
(api/evaluate.py); a multi-label one by micro and macro F1, Hamming loss and each tag's
precision and recall. A question whose field no row has is left out, and said so."""

from __future__ import annotations

from ..engine.questions import Questions
from .evaluate import _num, _pct, evaluate, format_evaluation


def gold_tags(value) -> set[str] | None:
    """A multi-label gold field as a set of tags: a list, or text joined by `;` or `,` (as a
    table holds it); None where the row has none."""
    if value is None:
        return None
    if isinstance(value, list):
        return {str(x).strip() for x in value if str(x).strip()}
    text = str(value).replace(",", ";")
    return {x.strip() for x in text.split(";") if x.strip()}


def multi_label(predicted: list[set[str]], gold: list[set[str]], tags: tuple[str, ...]) -> dict:
    """Micro and macro F1, Hamming loss and per-tag precision/recall of tag sets."""
    per_tag, totals = {}, [0, 0, 0]
    for tag in tags:
        tp = sum(tag in p and tag in g for p, g in zip(predicted, gold))
        fp = sum(tag in p and tag not in g for p, g in zip(predicted, gold))
        fn = sum(tag not in p and tag in g for p, g in zip(predicted, gold))
        per_tag[tag] = {
            "precision": _ratio(tp, tp + fp),
            "recall": _ratio(tp, tp + fn),
            "f1": _ratio(2 * tp, 2 * tp + fp + fn),
            "support": tp + fn,
        }
        totals = [totals[0] + tp, totals[1] + fp, totals[2] + fn]
    tp, fp, fn = totals
    n = len(gold)
    return {
        "evaluated": n,
        "micro_f1": _ratio(2 * tp, 2 * tp + fp + fn) if n else None,
        "macro_f1": sum(t["f1"] for t in per_tag.values()) / len(tags) if n else None,
        "hamming_loss": (fp + fn) / (n * len(tags)) if n else None,
        "exact_match": sum(p == g for p, g in zip(predicted, gold)) / n if n else None,
        "per_tag": per_tag,
        "unknown_tags": sorted({t for g in gold for t in g} - set(tags)),
    }


def _ratio(a: int, b: int) -> float:
    return a / b if b else 0.0


def evaluate_answers(results: list[dict], fields: list[dict], questions: Questions) -> dict:
    """Per question with a gold field: its metrics; `fields`: each input row's fields."""
    out = {}
    for q in questions.questions:
        pairs = [
            (r["answers"][q.name], f[q.name])
            for r, f in zip(results, fields)
            if "answers" in r and f.get(q.name) is not None
        ]
        if not any(f.get(q.name) is not None for f in fields):
            continue
        if q.multi:
            said = [set(a.get("labels") or ()) for a, _ in pairs]
            out[q.name] = multi_label(said, [gold_tags(g) for _, g in pairs], q.labels)
        else:
            said = [a.get("label") for a, _ in pairs]
            confidence = [max(a["scores"].values()) for a, _ in pairs]
            gold = [g if isinstance(g, str) else str(g) for _, g in pairs]
            out[q.name] = evaluate(said, gold, q.labels, confidence)
        out[q.name]["multi_label"] = q.multi
    return out


def format_answers(m: dict, questions: Questions) -> str:
    """The evaluation of each question as text, the questions without gold named."""
    lines = []
    for q in questions.questions:
        if q.name not in m:
            lines.append(f"== {q.name}: no row has a field {q.name!r} (not evaluated)")
            continue
        e = m[q.name]
        lines.append(f"== {q.name}")
        if not e["multi_label"]:
            lines.append(format_evaluation(e | {"error_rows": 0}))
            continue
        lines.append(
            f"multi-label over {e['evaluated']} rows: micro-F1 {_num(e['micro_f1'])}, "
            f"macro-F1 {_num(e['macro_f1'])}, Hamming loss {_num(e['hamming_loss'])}, "
            f"exact match {_pct(e['exact_match'])}"
        )
        if e["unknown_tags"]:
            lines.append(f"gold tags not among the tags (not evaluated): {e['unknown_tags']}")
        lines.append(f"{'tag':<16} {'precision':>9} {'recall':>7} {'f1':>6} {'support':>8}")
        for tag, t in e["per_tag"].items():
            lines.append(
                f"{tag:<16} {t['precision']:>9.3f} {t['recall']:>7.3f} "
                f"{t['f1']:>6.3f} {t['support']:>8}"
            )
    return "\n".join(lines)
