"""Running the CLI in-process from a folder, and what a refusal must look like: the helpers the
CLI's tests share."""

from __future__ import annotations

import os

from click.testing import CliRunner

from mlxbatch.cli import cli


def invoke(args, cwd=None, env=None, **kw):
    """`mlxbatch ARGS` run in `cwd` (then back), its arguments as strings; `kw` as CliRunner's
    (`input=`, `catch_exceptions=`)."""
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, [str(a) for a in args], env=env, **kw)
    finally:
        os.chdir(old)


def one_line_error(r, *words, alone: bool = False):
    """Exit 2 with a first line "error: ..." holding `words`, no traceback (`alone`: and no
    other line on stderr)."""
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.exit_code == 2 and lines and lines[0].startswith("error: "), r.output
    assert not alone or len(lines) == 1, r.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in r.output
