"""Prompt inputs from files: label descriptions (`--labels-file`) and few-shot examples
(`--examples`), with the same readers and line-numbered errors as the classify input."""

from __future__ import annotations

import json
from pathlib import Path

from ..engine.prompt import description_problem
from ..errors import InputError, LabelError, unicode_problem
from .caps import EXAMPLES_BYTES, EXAMPLES_ROWS, LABELS_FILE_BYTES, read_capped, size
from .formats import json_kind
from .inputs import describe_errors, open_rows


def read_labels_file(path: str | Path) -> dict[str, str]:
    """A JSON or YAML mapping of label -> one-line description, in file order."""
    path = Path(path)
    try:
        text = read_capped(path, LABELS_FILE_BYTES, "--labels-file").decode(
            "utf-8-sig"
        )  # a BOM too
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read the labels file ({e})") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            data = _yaml(text)
        else:
            data = json.loads(text, object_pairs_hook=_pairs)
    except Exception as e:  # json and yaml raise several types; all mean "not parseable"
        kind = "YAML" if path.suffix.lower() in (".yaml", ".yml") else "JSON (.yaml/.yml: YAML)"
        raise InputError(
            f"{path}: not a valid labels file, a {kind} mapping of label to "
            f"description ({str(e).splitlines()[0][:120]})"
        ) from None
    if not isinstance(data, dict) or not data:
        raise InputError(f"{path}: expected a mapping of label to description")
    out = {}
    for label, desc in data.items():
        if not isinstance(label, str) or not label.strip():
            quote = (
                (
                    " (YAML reads yes, no, on, off, true and false unquoted as booleans, and "
                    "digits as numbers: quote the label)"
                )
                if not isinstance(label, str)
                else ""
            )
            raise LabelError(f"{path}: label {label!r} is not a non-empty string{quote}")
        if problem := unicode_problem(label):
            raise InputError(f"{path}: the label {label!r} holds {problem}")
        if problem := description_problem(desc):
            raise InputError(f"{path}: the description of {label!r} {problem}")
        if label.strip() in out:  # a silent merge would drop one description
            raise LabelError(
                f"{path}: label {label!r} is given twice (labels are compared "
                "without surrounding whitespace)"
            )
        out[label.strip()] = (desc or "").strip()
    return out


def _yaml(text: str, what: str = "label"):
    """A YAML document, refusing a repeated key as `_pairs` does (safe_load keeps the last);
    `what` names the keys in the refusal."""
    import yaml  # a dependency (mlx-lm needs it too)

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`, merged by super()
                    continue
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, str) and key in seen:
                    raise LabelError(f"{what} {key!r} is given twice")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=Loader)  # noqa: S506 (a SafeLoader)


def _pairs(pairs: list[tuple], what: str = "label") -> dict:
    """A JSON object, refusing a repeated key (json.loads keeps the last one silently)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise LabelError(f"{what} {key!r} is given twice")
        out[key] = value
    return out


def read_examples(
    path: str, labels: tuple[str, ...], text_field: str = "text", label_field: str = "label"
) -> tuple[tuple[str, str], ...]:
    """Few-shot (text, label) pairs; every bad row and unknown label named by its line."""
    try:
        rows, fmt = capped_examples(path, text_field, (label_field,))
    except InputError as e:  # "e.jsonl: empty input" did not say which file of the run it was
        raise InputError(f"--examples {e}") from None
    for r in rows:
        if r.error:
            continue
        label = r.fields.get(label_field)
        if label is None or isinstance(label, str) and not label.strip():
            r.error = f"missing or empty {label_field!r} field"
        elif not isinstance(label, str):
            r.error = f"the {label_field!r} field is {json_kind(label)}, not a string"
        elif label not in labels:
            r.error = f"label {label!r} is not in the label set ({', '.join(labels)})"
    if any(r.error for r in rows):
        raise InputError("examples: " + describe_errors(rows, path, fmt))
    return tuple((r.text, r.fields[label_field]) for r in rows)


def capped_examples(path: str, text_field: str, fields: tuple[str, ...]) -> tuple[list, str]:
    """The example rows, refused past EXAMPLES_ROWS rows or EXAMPLES_BYTES of text: examples go
    into every prompt, so more could never fit a context (and an endless file never ends)."""
    rows, total = [], 0
    with open_rows(path, text_field, None, "auto", fields=fields, list_others=True) as stream:
        for r in stream:
            rows.append(r)
            total += len(r.text or "")
            if len(rows) > EXAMPLES_ROWS or total > EXAMPLES_BYTES:
                raise InputError(
                    f"{path}: more than {EXAMPLES_ROWS} examples or "
                    f"{size(EXAMPLES_BYTES)} of text, the cap on examples (they go "
                    "into every prompt)"
                )
        return rows, stream.format
