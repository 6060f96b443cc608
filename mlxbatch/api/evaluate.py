"""How good the labels are: accuracy, per-class precision/recall/F1, confusion, calibration
and coverage, as pure functions over lists; gold labels outside the label set are counted
and named under `unknown_gold`, never dropped silently."""

from __future__ import annotations

from collections import Counter

import numpy as np

THRESHOLDS = (0.5, 0.7, 0.9)


def expected_calibration_error(
    confidence: np.ndarray, correct: np.ndarray, bins: int = 10
) -> float:
    """Sum over equal-width confidence bins of |accuracy - mean confidence| x bin share."""
    if len(confidence) == 0:
        return 0.0
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1], right=True), 0, bins - 1)
    ece = 0.0
    for b in range(bins):
        m = which == b
        if m.any():
            ece += m.mean() * abs(correct[m].mean() - confidence[m].mean())
    return float(ece)


def evaluate(
    predicted: list[str | None],
    gold: list,
    labels: tuple[str, ...] | list[str],
    confidence: list[float] | None = None,
) -> dict:
    """Metrics of `predicted` against `gold` over the label set `labels`."""
    labels = tuple(labels)
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predictions for {len(gold)} gold labels")
    conf = np.array(confidence if confidence is not None else [np.nan] * len(gold), np.float64)
    unknown = Counter(str(g) for g in gold if g is not None and g not in labels)
    missing = sum(1 for g in gold if g is None)
    keep = [i for i, g in enumerate(gold) if g in labels]
    pred = [predicted[i] for i in keep]
    gl = [gold[i] for i in keep]
    conf = conf[keep] if len(keep) else np.zeros(0)
    n = len(gl)
    answered = [i for i, p in enumerate(pred) if p is not None]
    correct = np.array([pred[i] == gl[i] for i in range(n)], bool)
    cols, outside, matrix = _confusion(pred, gl, labels, abstained=len(answered) < n)
    per_class = _per_class(labels, matrix)
    present = [lab for lab in labels if per_class[lab]["support"] > 0]
    out = {
        "items": len(gold),
        "evaluated": n,
        "unknown_gold": dict(unknown),
        "missing_gold": missing,
        "accuracy": float(correct.mean()) if n else None,
        "macro_f1": float(np.mean([per_class[x]["f1"] for x in present])) if present else None,
        "per_class": per_class,
        "confusion": {
            "labels": list(labels),
            "columns": [c if c else "(abstained)" for c in cols],
            "outside_label_set": outside,
            "matrix": matrix,
        },
        "coverage": len(answered) / n if n else None,
        "accuracy_answered": float(correct[answered].mean()) if answered else None,
        "abstained": n - len(answered),
    }
    if confidence is not None and n:
        out["ece"] = expected_calibration_error(conf, correct)
        out["above_threshold"] = _above_thresholds(conf, correct)
    return out


def _confusion(
    pred: list, gold: list, labels: tuple[str, ...], abstained: bool
) -> tuple[tuple, list[str], list[list[int]]]:
    """The columns (the labels, predictions outside them, then abstentions when there are any),
    those outside, and the matrix: a row a gold label, a column a prediction."""
    # a prediction outside the label set is wrong, never dropped: it gets its own column
    outside = sorted({str(p) for p in pred if p is not None and p not in labels})
    cols = (*labels, *outside, None) if abstained else (*labels, *outside)
    matrix = [
        [sum(1 for p, g in zip(pred, gold) if g == gt and p == pt) for pt in cols] for gt in labels
    ]
    return cols, outside, matrix


def _per_class(labels: tuple[str, ...], matrix: list[list[int]]) -> dict:
    """Precision, recall and F1 of each label, read off the confusion matrix."""
    per_class = {}
    for j, lab in enumerate(labels):
        tp = matrix[j][j]
        predicted_as = sum(matrix[k][j] for k in range(len(labels)))
        support = sum(matrix[j])
        p = tp / predicted_as if predicted_as else 0.0
        r = tp / support if support else 0.0
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        per_class[lab] = {
            "precision": p,
            "recall": r,
            "f1": f1,
            "support": support,
            "predicted": predicted_as,
        }
    return per_class


def _above_thresholds(confidence: np.ndarray, correct: np.ndarray) -> dict:
    """At each threshold: the share of rows at least that confident, and their accuracy."""
    out = {}
    for t in THRESHOLDS:
        above = confidence >= t
        out[str(t)] = {
            "coverage": float(above.mean()),
            "accuracy": float(correct[above].mean()) if above.any() else None,
        }
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def format_evaluation(m: dict) -> str:
    """The evaluation as text tables."""
    labels = m["confusion"]["labels"]
    w = max(12, *(len(x) + 2 for x in labels))
    errors = m.get("error_rows", 0)
    rows = m["items"] + errors
    lines = [
        f"evaluation over {m['evaluated']} of {rows} rows with a known gold label: "
        f"accuracy {_pct(m['accuracy'])}, macro-F1 {_num(m['macro_f1'])}"
    ]
    if errors:
        lines.append(
            f"error rows (not scored, not evaluated): {errors} of {rows}; accuracy "
            f"counting them as wrong {_pct(m['evaluated'] and m['accuracy'] * m['evaluated'] / (m['evaluated'] + errors))}"
        )
    if m["unknown_gold"]:
        names = ", ".join(f"{k!r} x{v}" for k, v in sorted(m["unknown_gold"].items()))
        lines.append(f"gold labels not in the label set (not evaluated): {names}")
    if m["confusion"].get("outside_label_set"):
        names = ", ".join(map(repr, m["confusion"]["outside_label_set"]))
        lines.append(f"predicted labels not in the label set (counted as wrong): {names}")
    if m.get("missing_gold"):
        lines.append(f"rows without a gold label (not evaluated): {m['missing_gold']}")
    if m["abstained"]:
        lines.append(
            f"coverage {_pct(m['coverage'])} ({m['abstained']} abstained, counted as "
            f"wrong above); accuracy on the rows kept {_pct(m['accuracy_answered'])}"
        )
        if m.get("accuracy_top_label") is not None:
            lines.append(
                f"top-label accuracy if nothing abstained: {_pct(m['accuracy_top_label'])}"
            )
    lines += ["", f"{'class':<{w}} {'precision':>9} {'recall':>7} {'f1':>6} {'support':>8}"]
    for lab, c in m["per_class"].items():
        lines.append(
            f"{lab:<{w}} {c['precision']:>9.3f} {c['recall']:>7.3f} {c['f1']:>6.3f} "
            f"{c['support']:>8}"
        )
    cols = m["confusion"]["columns"]
    cw = max(8, *(len(c) + 1 for c in cols))
    lines += [
        "",
        "confusion (rows: gold, columns: predicted)",
        f"{'':<{w}}" + "".join(f"{c:>{cw}}" for c in cols),
    ]
    for lab, row in zip(labels, m["confusion"]["matrix"]):
        lines.append(f"{lab:<{w}}" + "".join(f"{v:>{cw}}" for v in row))
    if "ece" in m:
        lines += ["", f"calibration: expected calibration error {m['ece']:.3f} (10 bins)"]
        for t, v in m["above_threshold"].items():
            lines.append(
                f"  confidence >= {t}: {v['coverage']:.1%} of rows, accuracy {_pct(v['accuracy'])}"
            )
    return "\n".join(lines)


MAX_INCHES, MAX_CELL_TEXT = 40, 40  # at dpi 120: at most 4,800 pixels a side


def plot_confusion(m: dict, path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ..errors import UsageError

        raise UsageError("--plot needs matplotlib: pip install 'mlxbatch[plot]'") from None
    mat = np.array(m["confusion"]["matrix"])
    # capped: 200 labels asked matplotlib for a 29k x 26k-pixel figure
    scale = min(1.0, MAX_INCHES / (1.2 * max(mat.shape) + 2))
    fig, ax = plt.subplots(
        figsize=(scale * (1.2 * mat.shape[1] + 2), scale * (1.1 * mat.shape[0] + 1.5))
    )
    ax.tick_params(labelsize=max(3.0, 10 * scale))
    ax.imshow(mat, cmap="Blues")
    ax.set_xticks(range(mat.shape[1]), m["confusion"]["columns"], rotation=30, ha="right")
    ax.set_yticks(range(mat.shape[0]), m["confusion"]["labels"])
    for (i, j), v in np.ndenumerate(mat if max(mat.shape) <= MAX_CELL_TEXT else np.zeros((0, 0))):
        ax.text(
            j, i, str(v), ha="center", va="center", color="white" if v > mat.max() / 2 else "black"
        )
    ax.set(
        xlabel="predicted",
        ylabel="gold",
        title=f"accuracy {_pct(m['accuracy'])}, macro-F1 {_num(m['macro_f1'])}",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def evaluate_rows(results: list[dict], gold: list, labels: tuple[str, ...]) -> dict:
    """Metrics from output rows (error rows are counted as not evaluated)."""
    pred, g, conf = [], [], []
    errors = 0
    for r, gl in zip(results, gold):
        if "error" in r:
            errors += 1
            continue
        pred.append(r.get("label"))
        g.append(gl)
        conf.append(max(r["scores"].values()))
    m = evaluate(pred, g, labels, conf)
    m["error_rows"] = errors
    if m["abstained"]:  # what the top label alone would score, abstentions ignored
        top = [max(r["scores"], key=r["scores"].get) for r in results if "error" not in r]
        pairs = [(t, x) for t, x in zip(top, g) if x in labels]
        m["accuracy_top_label"] = sum(t == x for t, x in pairs) / len(pairs) if pairs else None
    return m
