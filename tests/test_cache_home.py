"""XDG_CACHE_HOME too long to hold mlxbatch's cache: --help and --version never look at the
cache; every other command refuses it in one line naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NAME_TOO_LONG = "/tmp/" + "a" * 300
PATH_TOO_LONG = "/tmp/" + "/".join(["b" * 200] * 25)  # 5,000 bytes, each name allowed


def mlxbatch(*args, cache):
    env = {**os.environ, "XDG_CACHE_HOME": cache}
    return subprocess.run(
        [sys.executable, "-m", "mlxbatch", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize("cache", [NAME_TOO_LONG, PATH_TOO_LONG])
def test_help_and_version_never_touch_the_cache(cache):
    for args in (["--version"], ["--help"], ["classify", "--help"]):
        r = mlxbatch(*args, cache=cache)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert mlxbatch("--version", cache=cache).stdout.startswith("mlxbatch ")


@pytest.mark.parametrize("cache", [NAME_TOO_LONG, PATH_TOO_LONG])
def test_a_command_refuses_a_cache_home_too_long_in_one_line(cache, tmp_path):
    out = tmp_path / "t.jsonl"
    r = mlxbatch("tickets", "3", "-o", str(out), cache=cache)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: XDG_CACHE_HOME (") and "cannot hold" in lines[0]
    assert not out.exists()


def test_only_a_request_for_help_or_the_version_skips_the_start():
    from mlxbatch.cli import asks_for_text

    assert asks_for_text([]) and asks_for_text(["--version"]) and asks_for_text(["--help"])
    assert asks_for_text(["classify", "in.jsonl", "--help"])
    assert not asks_for_text(["classify", "--system-prompt", "--help"])  # a value, not a flag
    assert not asks_for_text(["classify", "--version"]) and not asks_for_text(["models"])
