"""What one entry refuses, every entry refuses, with the same words: labels, few-shot examples,
label descriptions, the item limit and memory, through the Python API and the CLI (serve
loads through `Classifier.load` and `LabelSet.build` too). Each case is one that an entry
took and another refused before."""

from __future__ import annotations

import json

import pytest
from cli_run import invoke, one_line_error

from mlxbatch import Classifier
from mlxbatch.errors import InputError, ItemTooLong, JobError, LabelError, UsageError
from mlxbatch.io.prompts import read_labels_file

GOOD = '{"id": "a", "text": "I was charged twice"}\n{"id": "b", "text": "the app crashes"}\n'


def test_a_label_with_whitespace_around_it_or_a_control_character_is_refused(
    tiny_model_dir, tmp_path
):
    # classify's --labels strips " billing"; the API kept it and scored another label
    with pytest.raises(LabelError, match="begins or ends with whitespace.*write 'billing'"):
        Classifier.load(tiny_model_dir, labels=[" billing", "technical"])
    with pytest.raises(LabelError, match="control character '\\\\t'"):
        Classifier.load(tiny_model_dir, labels=["a\tb", "c"])
    src = tmp_path / "in.jsonl"
    src.write_text(GOOD)
    r = invoke(
        [
            "classify",
            src,
            "--model",
            tiny_model_dir,
            "-o",
            tmp_path / "o.jsonl",
            "--labels",
            "a\tb,c",
        ],
        tmp_path,
    )
    one_line_error(r, "control character")  # a tab in a label broke the TSV output's columns
    assert not (tmp_path / "o.jsonl").exists()


def test_examples_and_descriptions_are_checked_as_their_files_are(tiny_model_dir, tmp_path):
    labels = ["billing", "technical"]
    with pytest.raises(UsageError, match=r"examples\[1\]: the text is empty"):
        Classifier.load(
            tiny_model_dir,
            labels=labels,
            examples=[("charged twice", "billing"), ("  ", "technical")],
        )
    with pytest.raises(LabelError, match=r"descriptions\['bill'\]: not one of the labels"):
        Classifier.load(tiny_model_dir, labels=labels, descriptions={"bill": "money"})
    with pytest.raises(UsageError, match="spans several lines"):
        Classifier.load(tiny_model_dir, labels=labels, descriptions={"billing": "a\nb"})
    with pytest.raises(UsageError, match=r"descriptions\[.billing.\] is not a string \(int\)"):
        Classifier.load(tiny_model_dir, labels=labels, descriptions={"billing": 3})
    # the same descriptions give the same prompt, from a labels file or from the API
    (tmp_path / "l.json").write_text(json.dumps({"billing": "  money  ", "technical": ""}))
    from_file = Classifier.load(
        tiny_model_dir, labels=labels, descriptions=read_labels_file(tmp_path / "l.json")
    )
    given = Classifier.load(tiny_model_dir, labels=labels, descriptions={"billing": "  money  "})
    assert given.system_prompt == from_file.system_prompt
    assert "- billing: money\n- technical\n" in given.system_prompt


def test_a_labels_file_refuses_a_repeated_yaml_key_and_takes_a_bom(tmp_path):
    (tmp_path / "d.yaml").write_text("billing: money\ntechnical: crash\nbilling: again\n")
    with pytest.raises(InputError, match="d.yaml: .*label 'billing' is given twice"):
        read_labels_file(tmp_path / "d.yaml")  # safe_load kept "again" without a word
    # a merge key (`<<`) is YAML's own and is merged, not refused (the check broke it once)
    (tmp_path / "m2.yaml").write_text("<<: {billing: money}\ntechnical: crash\n")
    assert read_labels_file(tmp_path / "m2.yaml") == {"billing": "money", "technical": "crash"}
    (tmp_path / "b.json").write_bytes(b'\xef\xbb\xbf{"billing": "money", "technical": ""}')
    assert read_labels_file(tmp_path / "b.json") == {"billing": "money", "technical": ""}
    (tmp_path / "b.yaml").write_bytes(b"\xef\xbb\xbfbilling: money\ntechnical: crash\n")
    assert list(read_labels_file(tmp_path / "b.yaml")) == ["billing", "technical"]


def test_classify_takes_the_item_limits_the_api_and_serve_take(tiny_model_dir, tmp_path):
    # --max-tokens refused 1-7 (click's IntRange(8)) where the API and serve took them
    src = tmp_path / "in.jsonl"
    src.write_text(GOOD)
    out = tmp_path / "o.jsonl"
    clf = Classifier.load(tiny_model_dir)
    texts = ["I was charged twice", "the app crashes"]
    # 7: taken, and refused alike (the prompt's end leaves no token of text beside the marker)
    r = invoke(
        [
            "classify",
            src,
            "--model",
            tiny_model_dir,
            "-o",
            out,
            "--max-tokens",
            7,
            "--too-long",
            "truncate",
        ],
        tmp_path,
    )
    assert r.exit_code == 0, r.output  # error rows, as every row over a limit is
    for row in map(json.loads, out.read_text().splitlines()):
        assert "over the limit of 7 set by --max-tokens 7" in row["error"], row
        assert "too few tokens remain to truncate into" in row["error"], row
    with pytest.raises(ItemTooLong, match="over the limit of 7 set by max_tokens=7, and too few"):
        clf.classify(texts, max_tokens=7, truncate=True)
    fits = len(clf.engine.fed(clf.engine.prompt(texts[0]))) - 1  # the first text is cut
    r = invoke(
        [
            "classify",
            src,
            "--model",
            tiny_model_dir,
            "-o",
            out,
            "--max-tokens",
            fits,
            "--too-long",
            "truncate",
        ],
        tmp_path,
    )
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    api = clf.classify(texts, max_tokens=fits, truncate=True)
    assert rows[0]["truncated"] and api[0].truncated == rows[0]["truncated"]
    assert [row["label"] for row in rows] == [p.label for p in api]
    assert [row["scores"] for row in rows] == [p.scores for p in api]  # the same bits


def test_memory_that_holds_no_item_is_one_error_naming_what_takes_it(
    tiny_model_dir, tmp_path, monkeypatch
):
    src = tmp_path / "in.jsonl"
    src.write_text(GOOD)
    # every row was "over the limit of 1 set by the free memory (0.0 GiB with the weights)"
    r = invoke(
        ["classify", src, "--model", tiny_model_dir, "-o", tmp_path / "o.jsonl"],
        tmp_path,
        env={"MLXBATCH_MEMORY_LIMIT": "1K"},
    )
    one_line_error(r, "MLXBATCH_MEMORY_LIMIT=1K (1.0 KiB)", "the weights alone need")
    # many multi-token labels: one item of one token needs more than the cap leaves
    labels = [f"q{i}z" for i in range(60)]
    clf = Classifier.load(tiny_model_dir, labels=labels)
    fp = clf.footprint
    assert fp.label_len > 1
    cap = fp.weight_bytes + fp.batch_cost(1, 1, 1).total // 2
    monkeypatch.setenv("MLXBATCH_MEMORY_LIMIT", str(cap))
    with pytest.raises(JobError, match="60 labels of up to .* use fewer or shorter labels"):
        clf.classify(["I was charged twice"])


def test_an_item_bound_by_memory_leaves_the_batch_check_room(tiny_model_dir, monkeypatch):
    """`--too-long truncate` without --max-tokens cuts an item to half of what the weights leave,
    so the batch check, measuring free memory again, has room to pass."""
    clf = Classifier.load(tiny_model_dir)
    fp, context = clf.footprint, clf.engine.lm.model.args.max_position_embeddings
    room = fp.batch_cost(context // 16, 1, context // 16).total  # a 16th of the context, whole
    monkeypatch.setenv("MLXBATCH_MEMORY_LIMIT", str(fp.weight_bytes + room))
    item = clf.prepare("my invoice is wrong " * context, truncate=True)
    assert fp.batch_cost(item.fed, 1, item.fed).total <= room / 2
    assert item.fed > fp.longest_item(fp.weight_bytes + room, context, share=1.0) / 4  # not 0
    with pytest.raises(Exception, match="half of what the weights leave of MLXBATCH_MEMORY_LIMIT"):
        clf.prepare("my invoice is wrong " * context)
    (pred,) = clf.classify(["my invoice is wrong " * context], truncate=True)
    assert pred.label in clf.labels.names
