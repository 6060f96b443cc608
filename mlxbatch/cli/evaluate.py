"""`mlxbatch eval`: score an output file against the gold labels of its input."""

from __future__ import annotations

import math
import os
from pathlib import Path

import click

from ..io.inputs import FORMATS
from ..io.rows import text_id
from .common import check_gold_field, fail, plot_target, report_options

# classify writes float32 probabilities normalized to 1 (within ~1e-6); half a hundredth per
# label also passes scores rounded to two decimals in a spreadsheet (3 x 0.33 is 0.99)
ROUNDING_PER_LABEL = 0.005


def _not_a_prediction(
    res, row, tabular: bool = False, first: tuple[int, dict] | None = None
) -> str | None:
    """Why an output row cannot be evaluated against its input row (`first`: the first scored
    row's number and scores, whose labels every row's scores name), or None."""
    if not isinstance(res, dict):
        return "not a JSON object"
    if "error" not in res and not (
        isinstance(res.get("scores"), dict)
        and res["scores"]
        and all(isinstance(v, (int, float)) for v in res["scores"].values())
        and (res.get("label") is None or res["label"] in res["scores"])
    ):
        return "neither an error row nor a label with its scores"
    for label, v in res.get("scores", {}).items() if "error" not in res else ():
        if isinstance(v, bool) or not math.isfinite(v) or not 0 <= v <= 1:  # NaN, 5.0, inf
            return f"the score of {label!r} is {v!r}, not a probability in [0, 1]"[:200]
    if "error" not in res and (problem := _not_classifys(res, first)):
        return problem
    if (
        row.id is not None
        and "id" in res
        and res["id"] != row.id
        and not (isinstance(res["id"], str) and tabular and res["id"] == text_id(row.id))
    ):  # a CSV/TSV output's ids are text
        return (
            f"id {res['id']!r} where the input's row {row.number} has id {row.id!r}; "
            "give the input the predictions were made from, in the same order"
        )
    return None


def _not_classifys(res: dict, first: tuple[int, dict] | None) -> str | None:
    """What `classify` never writes in a scored row: scores that do not sum to 1, of other
    labels than the other rows', a label that is not the top score, a label on an abstention
    (each was evaluated)."""
    scores, label = res["scores"], res.get("label")
    total = math.fsum(scores.values())
    slack = ROUNDING_PER_LABEL * len(scores) + 1e-9  # 1e-9: 0.99's float error
    if abs(total - 1) > slack:  # scores of a subset of the labels, or edited by hand
        return f"the scores sum to {total:.4g}, not 1 (one probability for each label)"
    if first is not None and set(scores) != set(first[1]):
        return (
            f"its scores name {', '.join(map(repr, scores))}, row {first[0]}'s "
            f"{', '.join(map(repr, first[1]))}: one label set for every row"
        )[:300]
    if label is not None and res.get("abstained") is True:
        return f"it abstains, yet its label is {label!r}"[:200]
    if label is not None and scores[label] < max(scores.values()):
        top = max(scores, key=scores.get)
        return f"its label {label!r} is not its top score ({top!r} is)"[:200]
    return None


@click.command("eval")
@click.argument("input_path", metavar="INPUT")
@click.argument("predictions", type=click.Path(path_type=Path))
@click.option("--gold-field", help="JSONL key / CSV column of the gold label.")
@click.option("--text-field", default="text", show_default=True)
@click.option("--id-field", default=None)
@click.option(
    "--input-format",
    type=click.Choice(FORMATS),
    default="auto",
    show_default=True,
)
@click.option("--labels", help="The label set (default: the score keys of the predictions).")
@report_options("the metrics", "confusion")
@click.option(
    "--questions",
    type=click.Path(path_type=Path),
    help="The questions file of a classify --questions output: each question is "
    "evaluated against the input's field of its name.",
)
def evaluate_cmd(**options):
    """Accuracy, per-class F1, confusion and calibration of PREDICTIONS (a classify output:
    JSONL, CSV or TSV, gzip-compressed or not) against the gold labels of INPUT, row by row."""
    if options["questions"] is not None:
        return evaluate_questions(options)
    if not options["gold_field"]:
        fail("eval needs --gold-field (or --questions, for a classify --questions output)")
    from ..api.evaluate import evaluate_rows, format_evaluation, plot_confusion
    from ..io.outputs import check_reports, write_json_report
    from ..io.streams import report_stream

    input_path, predictions, json_path = (
        options[k] for k in ("input_path", "predictions", "json_path")
    )
    plot_path = plot_target(options["plot_path"], predictions, "confusion")
    check_reports(json_path, plot_path, [Path(input_path), predictions])
    rows, results = _read_checked(options)
    names = _label_names(options["labels"], results, predictions)
    gold = [r.fields.get(options["gold_field"]) for r in rows]
    m = evaluate_rows(results, gold, names)
    click.echo(format_evaluation(m), file=report_stream(json_path))
    if json_path:
        write_json_report(json_path, m)
    if plot_path:
        plot_confusion(m, plot_path)


def _read_checked(options: dict) -> tuple[list, list]:
    """The input's rows and the predictions' rows, one for one, each a row classify writes,
    and a gold field some input row has."""
    from ..io.inputs import read_rows
    from ..io.rows import read_results, results_format

    input_path, predictions, gold_field = (
        options[k] for k in ("input_path", "predictions", "gold_field")
    )
    fields = (options["text_field"], options["id_field"], options["input_format"])
    rows, _ = read_rows(input_path, *fields, (gold_field,))
    try:
        results = read_results(predictions)  # JSONL, CSV or TSV, gzip-compressed or not
        tabular = results_format(predictions) != "jsonl"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        if not os.path.lexists(predictions):  # the reader's own line names it
            fail(str(e))
        fail(f"{predictions}: not an output of mlxbatch classify ({str(e)[:100]})")
    _check_count(results, rows, predictions, input_path)
    first = next(
        (
            (n, r["scores"])
            for n, r in enumerate(results, start=1)
            if isinstance(r, dict) and "error" not in r and isinstance(r.get("scores"), dict)
        ),
        None,
    )
    for n, (row, res) in enumerate(zip(rows, results), start=1):
        if problem := _not_a_prediction(res, row, tabular, first):
            fail(f"{predictions}: row {n}: {problem}")
    check_gold_field(rows, gold_field, input_path)
    return rows, results


def _check_count(results: list, rows: list, predictions: Path, input_path) -> None:
    if len(results) != len(rows):
        fail(
            f"{predictions}: {len(results)} rows for the {len(rows)} rows of {input_path}; "
            "give the input the predictions were made from"
        )


def _label_names(labels: str | None, results: list, predictions: Path) -> tuple[str, ...]:
    """The label set: `--labels` as classify takes them (predictions outside them are
    counted), else the first scored row's score keys."""
    from ..engine.labels import check_names
    from ..errors import LabelError
    from ..io.promptspec import parse_labels

    if labels is not None:
        try:
            return check_names(parse_labels(labels))
        except LabelError as e:
            fail(f"--labels: {e}")
    scored = [r for r in results if isinstance(r.get("scores"), dict)]
    if not scored:
        fail(f"{predictions}: no scored rows to evaluate")
    return tuple(scored[0]["scores"])


def evaluate_questions(options: dict) -> None:
    """`eval --questions`: each question against the input's field of its name."""
    from ..api.evaluate_answers import evaluate_answers, format_answers
    from ..io.inputs import read_rows
    from ..io.outputs import check_reports, write_json_report
    from ..io.questions import check_question_options, read_questions
    from ..io.rows import read_results
    from ..io.streams import report_stream

    input_path, predictions, questions, json_path = (
        options[k] for k in ("input_path", "predictions", "questions", "json_path")
    )
    fields = (options["text_field"], options["id_field"], options["input_format"])
    if any(options[k] is not None for k in ("gold_field", "labels", "plot_path")):
        fail(
            "--gold-field, --labels and --plot evaluate one label set; --questions evaluates "
            "each question against the input's field of its name"
        )
    asked = read_questions(questions)
    check_question_options(asked, None, None, options["text_field"])
    check_reports(json_path, None, [Path(input_path), predictions, questions])
    rows, _ = read_rows(input_path, *fields, asked.names)
    try:
        results = read_results(predictions, asked)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        fail(f"{predictions}: not an output of mlxbatch classify ({str(e)[:100]})")
    _check_count(results, rows, predictions, input_path)
    for n, res in enumerate(results, start=1):
        if not isinstance(res, dict) or not ("error" in res or _answers_of(res, asked.names)):
            fail(f"{predictions}: row {n}: not a row of answers to these questions")
    if not any(name in row.fields for row in rows for name in asked.names):
        fail(f"{input_path}: no row has a field named as a question ({', '.join(asked.names)})")
    m = evaluate_answers(results, [row.fields for row in rows], asked)
    click.echo(format_answers(m, asked), file=report_stream(json_path))
    if json_path:
        write_json_report(json_path, m)


def _answers_of(res: dict, names: tuple[str, ...]) -> bool:
    answers = res.get("answers")
    return (
        isinstance(answers, dict)
        and list(answers) == list(names)
        and all(isinstance(a, dict) and isinstance(a.get("scores"), dict) for a in answers.values())
    )
