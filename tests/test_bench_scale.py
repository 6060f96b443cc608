"""`bench --scale` on tiny sizes: the workload's repeats, the JSON's fields, targets and the 10M
projection derived from the measured runs."""

from __future__ import annotations

import copy
import gzip
import json

import pytest
from click.testing import CliRunner

from mlxbatch.bench.scale import (
    PROJECT_TO,
    WINDOW_ROWS,
    ScaleRequest,
    assess,
    format_scale,
    run_scale,
)
from mlxbatch.bench.scale_runs import write_workload
from mlxbatch.cli import cli


def _rows(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_workload_repeats_are_exact_copies_of_earlier_rows(tmp_path):
    repeats = write_workload(tmp_path / "a.jsonl.gz", 3000, 0.2, seed=1)
    rows = _rows(tmp_path / "a.jsonl.gz")
    assert len(rows) == 3000 and len({r["id"] for r in rows}) == 3000
    seen, copies, far = {}, 0, 0
    for i, r in enumerate(rows):
        if r["text"] in seen:
            copies += 1
            far += i - seen[r["text"]] > 64  # some repeats are far from the row they copy
        seen.setdefault(r["text"], i)
    assert copies == repeats and 0.15 < repeats / 3000 < 0.25 and far > 0
    write_workload(tmp_path / "b.jsonl.gz", 3000, 0.2, seed=1)
    assert _rows(tmp_path / "b.jsonl.gz") == rows
    assert write_workload(tmp_path / "u.jsonl.gz", 3000, 0.0, seed=1) == 0
    unique = _rows(tmp_path / "u.jsonl.gz")
    assert len({r["text"] for r in unique}) == 3000  # the generator repeats nothing itself


@pytest.fixture(scope="module")
def scale_result():
    request = ScaleRequest(sizes=(120, 360), large=160, large_preset="tiny", compare=80)
    return run_scale(request, lambda m: None)


def test_scale_runs_report_the_measured_figures(scale_result):
    r = scale_result
    assert [x["tickets"] for x in r["tiny"]] == [120, 360]
    assert [x["name"] for x in r["large"]] == ["windows", "repeats", "no repeats"]
    assert [x["tickets"] for x in r["large"]] == [160, 80, 80]
    for x in r["tiny"] + r["large"]:
        assert x["rows"] == x["scored"] == x["tickets"] and x["errors"] == 0
        assert x["max_rss_mb"] > 20 and x["wall_seconds"] > x["job_seconds"] > 0
        assert 0 <= x["padding"] < 1 and x["items_per_s"] > 0 and x["tokenizer_share"] > 0
    w, g, u = r["large"]
    assert g["duplicates_in_file"] > 0.1 and g["duplicates_scored_once"] > 0
    assert u["duplicates_in_file"] == 0 and u["duplicates_scored_once"] == 0
    assert w["repeats_agree"] is True and g["repeats_agree"] is True and u["repeats_agree"] is None
    plans = {p["name"]: p for p in r["plans"]}
    assert [plans[k]["windows"] for k in ("global", "windows", "default")] == [1, 4, 1]
    assert plans["default"]["padded_tokens"] == plans["global"]["padded_tokens"]  # 160 < 16,384
    # the planned padding of 4 windows is the streamed run's own (its summary: 2 decimals)
    assert abs(plans["windows"]["padding"] - w["padding"]) < 0.0001
    assert r["tokenizer"]["tokens_per_s"] > 0
    trace = r["tiny"][-1]["rss_trace"]  # the child's resident size, sampled each second
    assert trace and all(0 < mb <= r["tiny"][-1]["max_rss_mb"] + 1 for _, mb in trace)
    assert len(r["targets"]) == 5 and all(isinstance(t["met"], bool) for t in r["targets"])
    text = format_scale(r)
    assert "projection to 10,000,000" in text and text.count("met") >= 5


def test_projection_comes_from_the_largest_runs(scale_result):
    p, b, a = scale_result["projection"], scale_result["tiny"][-1], scale_result["tiny"][-2]
    assert p["from_tickets"] == 360 and p["windows_measured"] == 1 and WINDOW_ROWS > 360
    assert p["seconds_per_window"] == pytest.approx(b["job_seconds"])
    expected = b["wall_seconds"] - b["job_seconds"] + b["job_seconds"] * PROJECT_TO / 360
    assert p["seconds"] == pytest.approx(expected)
    slope = (b["max_rss_mb"] - a["max_rss_mb"]) / 240
    assert p["max_rss_mb"] == pytest.approx(b["max_rss_mb"] + slope * (PROJECT_TO - 360))
    # Change a measurement: the projection and the targets follow it.
    doubled = copy.deepcopy(scale_result)
    doubled["tiny"][-1]["job_seconds"] *= 2
    doubled["tiny"][-1]["max_rss_mb"] = doubled["tiny"][0]["max_rss_mb"] + 500
    doubled["tiny"][-1]["items_per_s"] = doubled["tiny"][0]["items_per_s"] / 2
    q = assess(doubled)
    assert q["projection"]["seconds_per_window"] == pytest.approx(2 * p["seconds_per_window"])
    assert q["projection"]["max_rss_mb"] > p["max_rss_mb"]
    assert not q["targets"][0]["met"] and not q["targets"][1]["met"]


def test_scale_writes_json_and_plot(scale_result, tmp_path):
    from mlxbatch.bench.scale import plot_scale

    pytest.importorskip("matplotlib")
    plot_scale(scale_result, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads(json.dumps(scale_result))["projection"]["tickets"] == PROJECT_TO


def test_bad_scale_sizes_is_one_line_exit_2():
    r = CliRunner().invoke(cli, ["bench", "--scale", "--scale-sizes", "10k"])
    assert r.exit_code == 2 and "--scale-sizes" in r.output
