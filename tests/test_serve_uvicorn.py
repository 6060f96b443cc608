"""`mlxbatch serve` runs only on the uvicorn versions its HTTP protocol is tested with."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from cli_run import invoke, one_line_error

from mlxbatch.cli.serve import need_uvicorn


@pytest.mark.parametrize("found", ["0.28.1", "0.56.0", "1.0", "weird"])
def test_a_uvicorn_outside_the_tested_range_is_one_line(found, tmp_path, monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: found if name == "uvicorn" else real(name)
    )
    r = invoke(["serve", "--model", tmp_path / "absent"], tmp_path)
    one_line_error(
        r,
        f"mlxbatch serve needs uvicorn >=0.29,<0.56 (found {found})",
        "pip install 'uvicorn>=0.29,<0.56'",
        alone=True,
    )


@pytest.mark.parametrize("found", ["0.29.0", "0.55.0", "0.55.1rc1"])
def test_a_uvicorn_in_the_tested_range_passes(found):
    need_uvicorn(found)


def test_the_range_is_the_one_the_extras_pin():
    text = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    assert text.count('"uvicorn>=0.29,<0.56"') == 2
