"""Round five (a fresh adversarial pass): absurd option values, the Python API's unordered
collections, the service's drain deadline and its API key file, each class with the case
that found it."""

from __future__ import annotations

import pytest
from test_hostile_round_four import GOOD, invoke, one_line_error

# nan and inf pass click's FloatRange (nan < 0 is false): --max-body-mb inf was a traceback,
# --max-wait-ms nan a classify request that never returned, --verify-sample nan a 500 on
# /v1/models; a window past sys.maxsize an islice traceback that left a journal behind.
ABSURD = [
    (["classify", "in.jsonl", "--collective-timeout", "nan"], "--collective-timeout"),
    (["classify", "in.jsonl", "--verify-sample", "nan"], "--verify-sample"),
    (["classify", "in.jsonl", "--min-confidence", "inf"], "--min-confidence"),
    (["classify", "in.jsonl", "--window-rows", "99999999999999999999"], "--window-rows"),
    (["serve", "--max-body-mb", "inf"], "--max-body-mb"),
    (["serve", "--max-body-mb", "nan"], "--max-body-mb"),
    (["serve", "--max-wait-ms", "nan"], "--max-wait-ms"),
    (["serve", "--max-wait-ms", "1e300"], "--max-wait-ms"),
    (["serve", "--timeout-header", "nan"], "--timeout-header"),
    (["serve", "--timeout-body", "inf"], "--timeout-body"),
    (["serve", "--timeout-keep-alive", "nan"], "--timeout-keep-alive"),
    (["serve", "--drain-timeout", "nan"], "--drain-timeout"),
    (["serve", "--verify-sample", "nan"], "--verify-sample"),
]


@pytest.mark.parametrize("args,option", ABSURD, ids=[" ".join(a[0][-2:]) for a in ABSURD])
def test_an_absurd_option_value_is_one_line(args, option, tmp_path):
    (tmp_path / "in.jsonl").write_text(GOOD)
    r = invoke([*args, "-o", "out.jsonl"] if args[0] == "classify" else args, tmp_path)
    one_line_error(r, option)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no journal left


def test_the_python_api_refuses_unordered_texts(tiny_model_dir):
    # a dict was classified by its keys, a set in hash order: answers matched to nothing
    from mlxbatch import Classifier
    from mlxbatch.errors import UsageError

    clf = Classifier.load(tiny_model_dir)
    for unordered in ({"I was charged twice": 1}, {"a text", "another"}, frozenset({"a"})):
        with pytest.raises(UsageError, match="unordered collection"):
            clf.classify(unordered)
    assert len(clf.classify(t for t in ["hello", "world"])) == 2  # a generator has an order


def test_an_api_key_file_saved_with_a_bom_holds_the_key_without_it(tmp_path, capsys):
    # Notepad's UTF-8 starts with EF BB BF: the key kept it, and every request was a 401
    from mlxbatch.cli.serve import read_api_key

    key = tmp_path / "key"
    key.write_bytes(b"\xef\xbb\xbfs3cret\r\n")
    assert read_api_key(key) == b"s3cret"
    key.write_bytes(b"\xef\xbb\xbf\n")
    with pytest.raises(SystemExit) as e:
        read_api_key(key)
    assert e.value.code == 2 and "the file is empty" in capsys.readouterr().err
