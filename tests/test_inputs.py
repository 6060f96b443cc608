"""Input validation: every bad row named by its number, never a silently lost row."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxbatch.errors import InputError
from mlxbatch.io.inputs import read_rows


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


def errors(rows):
    return {r.number: r.error for r in rows if r.error}


def test_jsonl_bad_rows_are_each_reported(tmp_path):
    lines = [
        '{"id": 1, "text": "fine"}',
        "{not json",
        "[1, 2]",
        '{"id": 3}',
        '{"id": 4, "text": 12}',
        '{"id": 5, "text": "   "}',
        '{"id": 1, "text": "dupe"}',
        '{"text": "no id"}',
        '{"id": {"a": 1}, "text": "odd id"}',
    ]
    data = ("\n".join(lines) + "\n").encode() + b'{"id": 9, "text": "caf\xe9"}\n'
    rows, fmt = read_rows(write(tmp_path, "in.jsonl", data))
    assert fmt == "jsonl" and len(rows) == 10
    e = errors(rows)
    assert 1 not in e
    assert "invalid JSON" in e[2]
    assert "not a JSON object but an array" in e[3]
    assert "missing text field" in e[4]
    assert "not a string" in e[5]
    assert e[6] == "empty text"
    assert "duplicate id 1 (first at 1)" in e[7]
    assert "missing id field 'id'" in e[8]
    assert "not a string or number" in e[9]
    assert "not UTF-8" in e[10]


def test_rows_that_no_tokenizer_or_json_output_can_take_are_named(tmp_path):
    """JSON accepts lone surrogates ("\\ud800") and non-finite numbers; neither can reach the
    tokenizer or a strict JSON output, so each is a row error, found before anything runs."""
    lines = [
        '{"id": "a", "text": "fine"}',
        '{"id": "b", "text": "half \\ud800 a pair"}',
        '{"id": "\\udfff", "text": "x"}',
        '{"id": Infinity, "text": "y"}',
        '{"id": NaN, "text": "z"}',
        '{"id": 1e400, "text": "w"}',
    ]
    rows, _ = read_rows(write(tmp_path, "in.jsonl", "\n".join(lines) + "\n"))
    e = errors(rows)
    assert 1 not in e
    assert "lone surrogate '\\ud800' at character 6" in e[2]
    assert e[3].startswith("id '\\udfff' holds a lone surrogate")
    assert e[4] == "id inf is not a finite number"
    assert e[5] == "id nan is not a finite number"
    assert e[6] == "id 1e400 is not a finite number"  # named as written


def test_ids_default_to_row_numbers_and_blank_lines_are_not_rows(tmp_path):
    rows, _ = read_rows(write(tmp_path, "in.jsonl", '{"text": "a"}\n\n{"text": "b"}\n'))
    assert [(r.id, r.number, r.text) for r in rows] == [(1, 1, "a"), (3, 3, "b")]
    rows, fmt = read_rows(write(tmp_path, "in.txt", "first\n\nsecond\n"))
    assert fmt == "text" and [(r.id, r.text) for r in rows] == [(1, "first"), (3, "second")]


def test_explicit_id_field_is_required_on_every_row(tmp_path):
    path = write(tmp_path, "in.jsonl", '{"key": "a", "text": "x"}\n{"text": "y"}\n')
    rows, _ = read_rows(path, id_field="key")
    assert rows[0].id == "a" and "missing id field 'key'" in rows[1].error


def test_csv_rows_header_and_field_counts(tmp_path):
    path = write(tmp_path, "in.csv", 'id,text\n1,"multi\nline, with comma"\n2\n3,""\n4,ok\n')
    rows, fmt = read_rows(path)
    assert fmt == "csv"
    assert rows[0].text == "multi\nline, with comma"
    e = errors(rows)
    assert "1 fields where the header has 2" in e[2] and e[3] == "empty text" and 4 not in e
    with pytest.raises(InputError, match="no 'body' column"):
        read_rows(path, text_field="body")


@pytest.mark.parametrize(
    "content, message", [(b"", "empty input"), (b"\n \n", "empty input"), (None, "no such file")]
)
def test_unusable_files_fail_whole(tmp_path, content, message):
    path = (
        str(tmp_path / "missing.jsonl") if content is None else write(tmp_path, "x.jsonl", content)
    )
    with pytest.raises(InputError, match=message):
        read_rows(path)


def test_empty_csv_is_refused(tmp_path):
    with pytest.raises(InputError, match="empty file"):
        read_rows(write(tmp_path, "x.csv", ""))


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(items=st.lists(st.one_of(texts, st.integers(), st.none()), min_size=1, max_size=30))
def test_jsonl_reader_keeps_one_row_per_object(tmp_path_factory, items):
    """Whatever the values, every object line becomes exactly one row, valid or not."""
    path = tmp_path_factory.mktemp("h") / "in.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(items)))
    rows, _ = read_rows(str(path))
    assert [r.id for r in rows] == list(range(len(items)))
    for r, t in zip(rows, items):
        ok = isinstance(t, str) and t.strip() != ""
        assert (r.error is None) == ok and (r.text == t if ok else r.text is None)


@settings(max_examples=100, deadline=None)
@given(items=st.lists(texts.filter(lambda t: t.strip()), min_size=1, max_size=20))
def test_csv_reader_round_trips_any_text(tmp_path_factory, items):
    import csv

    path = tmp_path_factory.mktemp("h") / "in.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        w.writerows([[i, t] for i, t in enumerate(items)])
    rows, _ = read_rows(str(path))
    assert [r.text for r in rows] == items
