"""Input formats and output formats: compressed and Parquet inputs, the streaming reader, format
detection by content, and outputs that are what their names say (and read back)."""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import sys
import zlib

import pytest

from mlxbatch.errors import InputError, OutputError
from mlxbatch.io.inputs import open_rows, read_rows
from mlxbatch.io.rows import output_format, read_results, write_records, write_rows

ITEMS = [
    {
        "id": f"t{i}",
        "text": f"ticket {i}, about {'money' if i % 2 else 'bugs'}",
        "gold": "billing" if i % 2 else "technical",
    }
    for i in range(1, 41)
]


def jsonl(items) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in items).encode()


def table(items, sep: str) -> bytes:
    out = io.StringIO()
    w = csv.writer(out, delimiter=sep, lineterminator="\n")
    w.writerow(list(items[0]))
    w.writerows([list(x.values()) for x in items])
    return out.getvalue().encode()


def parquet(items, row_group_size: int = 7) -> bytes:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(items), out, row_group_size=row_group_size)
    return out.getvalue()


def zstd(data: bytes) -> bytes:
    return pytest.importorskip("zstandard").ZstdCompressor().compress(data)


def seen(rows):
    return [(r.id, r.text, r.fields, r.error) for r in rows]


EXPECTED = [(x["id"], x["text"], {"gold": x["gold"]}, None) for x in ITEMS]
INPUTS = {  # name: (file name, bytes)
    "jsonl": ("in.jsonl", lambda: jsonl(ITEMS)),
    "csv": ("in.csv", lambda: table(ITEMS, ",")),
    "tsv": ("in.tsv", lambda: table(ITEMS, "\t")),
    "parquet": ("in.parquet", lambda: parquet(ITEMS)),
    "jsonl.gz": ("in.jsonl.gz", lambda: gzip.compress(jsonl(ITEMS))),
    "csv.gz": ("in.csv.gz", lambda: gzip.compress(table(ITEMS, ","))),
    "tsv.gz": ("in.tsv.gz", lambda: gzip.compress(table(ITEMS, "\t"))),
    "jsonl.bz2": ("in.jsonl.bz2", lambda: bz2.compress(jsonl(ITEMS))),
    "jsonl.xz": ("in.jsonl.xz", lambda: lzma.compress(jsonl(ITEMS))),
    "jsonl.zst": ("in.jsonl.zst", lambda: zstd(jsonl(ITEMS))),
    "gzip, misnamed": ("in.jsonl", lambda: gzip.compress(jsonl(ITEMS))),
    "gzip csv, no suffix": ("tickets", lambda: gzip.compress(table(ITEMS, ","))),
    "parquet, no suffix": ("data", lambda: parquet(ITEMS)),
    "two gzip members": (
        "in.jsonl.gz",
        lambda: gzip.compress(jsonl(ITEMS[:9])) + gzip.compress(jsonl(ITEMS[9:])),
    ),
    # pzstd's files start with a skippable frame (magic 0x184D2A50, its size, 4 bytes): they
    # were read as raw bytes, "not UTF-8"
    "zstd after a skippable frame": (
        "in.jsonl.zst",
        lambda: b"\x50\x2a\x4d\x18\x04\x00\x00\x00\x00\x01\x02\x03" + zstd(jsonl(ITEMS)),
    ),
}


@pytest.mark.parametrize("kind", list(INPUTS))
def test_every_format_reads_the_same_rows_streamed_or_whole(kind, tmp_path, monkeypatch):
    name, data = INPUTS[kind]
    path = tmp_path / name
    path.write_bytes(data())
    rows, fmt = read_rows(str(path), fields=("gold",))
    assert seen(rows) == EXPECTED
    with open_rows(str(path), fields=("gold",)) as stream:
        assert stream.format == fmt
        assert seen(stream) == EXPECTED
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    rows, fmt_stdin = read_rows("-", fields=("gold",))
    assert seen(rows) == EXPECTED and fmt_stdin == fmt


class Endless(io.RawIOBase):
    """A JSONL input produced on demand, counting the bytes handed out: the reader must not
    pull the whole (here: 200 MB) input to give its first rows."""

    def __init__(self, rows: int, compress: bool = False):
        self.rows, self.next, self.given, self.pending = rows, 0, 0, b""
        self.z = zlib.compressobj(wbits=31) if compress else None

    def readable(self):
        return True

    def readinto(self, b):
        while not self.pending and self.next < self.rows:
            chunk = jsonl([{"id": self.next + i, "text": "x" * 1000} for i in range(100)])
            self.next += 100
            self.pending = self.z.compress(chunk) if self.z else chunk
            if self.z and self.next >= self.rows:
                self.pending += self.z.flush()
        n = min(len(b), len(self.pending))
        b[:n], self.pending = self.pending[:n], self.pending[n:]
        self.given += n
        return n


@pytest.mark.parametrize("compress", [False, True])
def test_the_stream_reads_only_what_its_rows_need(compress, monkeypatch):
    source = Endless(200_000, compress)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(source)))
    stream = open_rows("-")
    window = []
    for row in stream:
        window.append(row)
        if len(window) == 1000:
            break
    assert [r.id for r in window] == list(range(1000)) and all(r.text for r in window)
    assert source.next < 50_000  # of 200,000 rows: read ahead by a few buffers only
    stream.close()


def test_a_stream_takes_windows_of_rows(tmp_path):
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl(ITEMS)))
    windows = [[r.id for r in w] for w in open_rows(str(path)).windows(16)]
    assert [len(w) for w in windows] == [16, 16, 8]
    assert sum(windows, []) == [x["id"] for x in ITEMS]


def test_missing_zstandard_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "zstandard" else real(name, *a),
    )
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(20))
    with pytest.raises(InputError, match=r"pip install 'mlxbatch\[zstd\]'"):
        read_rows(str(path))


def test_missing_pyarrow_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a)
    )
    path = tmp_path / "in.parquet"
    path.write_bytes(b"PAR1" + bytes(20))
    with pytest.raises(InputError, match=r"pip install 'mlxbatch\[parquet\]'"):
        read_rows(str(path))


def test_parquet_columns_are_chosen_and_checked(tmp_path):
    items = [{"key": i * 10, "body": f"text {i}", "label": "a", "other": [1, 2]} for i in range(20)]
    path = tmp_path / "in.parquet"
    path.write_bytes(parquet(items, row_group_size=3))
    rows, fmt = read_rows(str(path), text_field="body", id_field="key", fields=("label",))
    assert fmt == "parquet"
    assert [(r.number, r.id, r.text, r.fields) for r in rows] == [
        (i + 1, i * 10, f"text {i}", {"label": "a"}) for i in range(20)
    ]
    rows, _ = read_rows(str(path), text_field="body")  # no `id` column: row numbers
    assert [r.id for r in rows] == list(range(1, 21))
    with pytest.raises(InputError, match="the Parquet file has no 'text' column"):
        read_rows(str(path))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 but nothing else")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        read_rows(str(bad))


# mtime=0 and explicit ids: gzip stamps the time into its header, and pytest-xdist refuses to run
# when its workers collect parameters that differ (they did, a second apart, in a CI run).
@pytest.mark.parametrize(
    "data, message",
    [
        (
            gzip.compress(jsonl(ITEMS), mtime=0)[:-20],
            "the data cannot be read .*cut short or corrupt",
        ),
        (
            gzip.compress(jsonl(ITEMS), mtime=0)[:30],
            "the data cannot be read .*cut short or corrupt",
        ),
        (
            gzip.compress(jsonl(ITEMS * 3000), mtime=0)[:-20],
            r"line 1\d{5}: the data cannot be read",
        ),
    ],
    ids=["tail cut", "header only", "cut after 100k lines"],
)
def test_a_cut_short_archive_is_the_files_error(tmp_path, data, message):
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(data)
    with pytest.raises(InputError, match=message):
        read_rows(str(path))


def test_format_is_detected_by_content_on_stdin(monkeypatch):
    def read(data: bytes, **kw):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        return read_rows("-", **kw)

    with pytest.raises(InputError, match="header has no 'text' column.*--input-format text"):
        read(b"id,body\n1,x\n2,y\n")
    wide = ",".join(f"col{i}" for i in range(400)) + ",text\n"
    rows, fmt = read((wide + ",".join(["v"] * 401) + "\n").encode())
    assert fmt == "csv" and [r.text for r in rows] == ["v"]
    rows, fmt = read(b"Hello, I was charged twice\nthe app crashes, again\nThanks\n")
    assert fmt == "text" and len(rows) == 3
    rows, fmt = read(b"[URGENT] refund please\n")
    assert fmt == "text" and rows[0].text == "[URGENT] refund please"
    rows, fmt = read(b"one\rtwo\r\rthree")  # old Mac line ends
    assert fmt == "text" and [(r.number, r.text) for r in rows] == [
        (1, "one"),
        (2, "two"),
        (4, "three"),
    ]
    rows, fmt = read(b'id,text\r1,a\r2,"b\rc"\r')
    assert fmt == "csv" and [(r.id, r.text) for r in rows] == [("1", "a"), ("2", "b\rc")]
    rows, fmt = read(b"text\nfirst\nsecond\n")
    assert fmt == "csv" and [r.text for r in rows] == ["first", "second"]


@pytest.mark.parametrize(
    "name, data, message",
    [
        (
            "in.csv",
            b"id,text,id\n1,a,2\n",
            r"the CSV header repeats the column 'id' \(columns 1 and 3\)",
        ),
        ("in.tsv", b"text\tx\ttext\na\tb\tc\n", "the TSV header repeats the column 'text'"),
        ("in.parquet", None, "the Parquet file repeats the column 'text'"),
    ],
)
def test_a_repeated_column_is_refused(tmp_path, name, data, message):
    if data is None:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        t = pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["text", "text"])
        pq.write_table(t, tmp_path / name)
    else:
        (tmp_path / name).write_bytes(data)
    with pytest.raises(InputError, match=message):
        read_rows(str(tmp_path / name))


def test_a_repeated_json_key_is_the_rows_error(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(
        '{"id": "a", "text": "x"}\n{"id": "b", "text": "y", "text": "z"}\n'
        '{"id": "c", "text": "ok", "meta": {"k": 1, "k": 2}}\n'
    )
    rows, _ = read_rows(str(path))
    assert [r.error for r in rows] == [
        None,
        "the key 'text' appears twice in one JSON object",
        "the key 'k' appears twice in one JSON object",
    ]


def test_jsonl_ids_follow_the_first_object(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "a"}\n{"id": "x", "text": "b"}\n{"text": "c"}\n')
    rows, _ = read_rows(str(path))
    assert [r.id for r in rows] == [1, 2, 3] and rows[0].error is None
    assert rows[1].error.startswith("an 'id' field, where line 1 has none")
    path.write_text('{nope\n{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n')
    rows, _ = read_rows(str(path))  # the bad line cannot take id 1 (the next row's)
    assert [r.id for r in rows] == [None, 1, 2] and "invalid JSON" in rows[0].error


def test_ids_equal_as_text_are_duplicates_for_a_text_output(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(
        '{"id": 1, "text": "a"}\n{"id": "1", "text": "b"}\n{"id": "a\\tb", "text": "c"}\n'
    )
    rows, _ = read_rows(str(path))
    assert [r.error for r in rows] == [None, None, None]
    rows, _ = read_rows(str(path), output_format="csv")
    assert (
        rows[1].error
        == ("duplicate id '1' (first at 1 as 1; the two are one id in a CSV output: write JSONL)")
        and rows[2].error is None
    )
    rows, _ = read_rows(str(path), output_format="tsv")
    assert "tab or line break" in rows[2].error


@pytest.mark.parametrize(
    "name, want",
    [
        ("o.jsonl", ("jsonl", False)),
        ("o.jsonl.gz", ("jsonl", True)),
        ("o.csv", ("csv", False)),
        ("O.TSV", ("tsv", False)),
        ("o.tsv.gz", ("tsv", True)),
        ("results", ("jsonl", False)),
        ("run.v2", ("jsonl", False)),
        ("o.ndjson", ("jsonl", False)),
        ("o.json", None),
        ("o.parquet", None),
        ("o.xlsx", None),
        ("o.gz", None),
        ("o.csv.zst", None),
        ("o.txt", None),
    ],
)
def test_output_formats_are_what_their_names_say(name, want):
    if want is None:
        with pytest.raises(OutputError, match=r"mlxbatch writes \.jsonl, \.jsonl\.gz, \.csv"):
            output_format(name)
    else:
        assert output_format(name) == want


RESULTS = [
    {"id": "a", "label": "billing", "scores": {"billing": 0.75, "technical": 0.25}},
    {"id": 7, "line": 2, "error": "text field 'text' is a number, not a string"},
    {"id": 'c"q', "label": None, "abstained": True, "scores": {"billing": 0.5, "technical": 0.5}},
]
LABELS = ("billing", "technical")


def written(tmp_path, name: str, rows=RESULTS) -> bytes:
    path = tmp_path / name
    with open(path, "w", encoding="utf-8", newline="") as f:
        write_rows(f, rows, LABELS, name)
    return path.read_bytes()


def test_jsonl_gz_output_is_gzip_and_reads_back(tmp_path):
    data = written(tmp_path, "o.jsonl.gz")
    assert data[:2] == b"\x1f\x8b" and gzip.decompress(data) == jsonl(RESULTS)
    assert read_results(tmp_path / "o.jsonl.gz") == RESULTS
    assert written(tmp_path, "p.jsonl.gz") == data  # mtime 0: the same rows, the same bytes


@pytest.mark.parametrize("name", ["o.tsv", "o.csv", "o.tsv.gz", "o.csv.gz"])
def test_table_outputs_read_back_with_the_readers(tmp_path, name):
    written(tmp_path, name)
    rows, fmt = read_rows(
        str(tmp_path / name),
        text_field="id",
        fields=("label", "score_billing", "error", "abstained"),
    )
    assert fmt == name.split(".")[1]
    assert [(r.text, r.fields) for r in rows] == [
        ("a", {"label": "billing", "score_billing": "0.75", "error": "", "abstained": ""}),
        ("7", {"label": "", "score_billing": "", "error": RESULTS[1]["error"], "abstained": ""}),
        ('c"q', {"label": "", "score_billing": "0.5", "error": "", "abstained": "true"}),
    ]


def test_table_outputs_refuse_what_they_cannot_hold(tmp_path):
    rows = [dict(RESULTS[0], id=1), dict(RESULTS[0], id="1")]
    with pytest.raises(OutputError, match="ids 1 and '1' .* would both be written as 1 in CSV"):
        written(tmp_path, "o.csv", rows)
    with pytest.raises(OutputError, match="row 1, column 'id': a tab or line break"):
        written(tmp_path, "o.tsv", [dict(RESULTS[0], id="a\tb")])


def test_records_are_written_by_suffix(tmp_path):
    for name in ("t.csv", "t.jsonl.gz", "t.tsv"):
        with open(tmp_path / name, "w", encoding="utf-8", newline="") as f:
            write_records(f, ITEMS, name)
        rows, _ = read_rows(str(tmp_path / name), fields=("gold",))
        assert seen(rows) == EXPECTED, name
