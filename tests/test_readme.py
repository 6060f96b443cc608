"""The README's first screen runs as written: every shell and Python block is run here on the
tiny model, the two set-up blocks are checked against `.ci/run` and `pyproject.toml` instead
(they install the package and run the whole suite), and every link of the README and the pages
under docs/ leads somewhere. The docs, the package and the tests' names and docstrings name
no issue, stop or round numbers."""

from __future__ import annotations

import ast
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DEMO = "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && mlxbatch demo"
# A block preceded by this comment is not run; only for what cannot run on one machine here.
OPT_OUT = "<!-- readme-test: not run"


def blocks(text: str) -> list[tuple[str, str, bool]]:
    """(info string, body, opted out) for each fenced block, in order."""
    found = []
    for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.M | re.S):
        before = text[: m.start()].rstrip().splitlines()[-1:] or [""]
        found.append((m.group(1), m.group(2), before[0].startswith(OPT_OUT)))
    return found


def readme_blocks(kind: str) -> list[str]:
    return [body for info, body, skip in blocks(README.read_text()) if info == kind and not skip]


def is_setup(body: str) -> bool:
    return "python3 -m venv" in body


def test_the_demo_block_is_the_one_line_set_up():
    setups = [b.strip() for b in readme_blocks("bash") if is_setup(b)]
    assert setups[0] == DEMO


def test_the_test_block_is_what_ci_runs():
    """The README's test command installs what `.ci/run` installs and runs what it runs."""
    (tests,) = [b.strip() for b in readme_blocks("bash") if is_setup(b) and "pytest" in b]
    ci = (ROOT / ".ci" / "run").read_text()
    torch = re.search(r'"(torch==[^"]+)"', ci).group(1)
    steps = [s.strip() for s in tests.split("&&")]
    assert steps[:2] == ["python3 -m venv .venv", ". .venv/bin/activate"]
    assert f"pip install {torch}" in steps
    assert 'pip install -e ".[dev]"' in steps and '-e ".[dev]"' in ci
    assert steps[-1] == "python -m pytest" and ci.rstrip().endswith("python -m pytest")
    assert "\ndev = [" in (ROOT / "pyproject.toml").read_text()


def test_the_python_floor_is_pyprojects():
    floor = re.search(r'^requires-python = ">=(\S+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert f"Python {floor.group(1)} or later" in " ".join(README.read_text().split())


def test_json_blocks_are_json_lines():
    for body in readme_blocks("json"):
        for line in body.splitlines():
            json.loads(line)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def newcomer(tiny_model_dir, tmp_path) -> tuple[Path, dict]:
    """A folder where the demo has run (the tiny model stands in for its synthetic one) and an
    environment whose `mlxbatch` and `python` are this checkout's."""
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "qwen2.5-0.5b-synthetic").symlink_to(tiny_model_dir)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "mlxbatch"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mlxbatch "$@"\n')
    shim.chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    env.pop("MLXBATCH_WEIGHTS", None)
    return tmp_path, env


RUNNABLE = [b for b in readme_blocks("bash") if not is_setup(b)]


@pytest.mark.parametrize("body", RUNNABLE, ids=[b.split()[1] for b in RUNNABLE])
def test_shell_block_runs(newcomer, body):
    cwd, env = newcomer
    port = str(free_port())  # the default 8765 may be taken on a shared machine
    script = body.replace("mlxbatch serve", f"mlxbatch serve --port {port}")
    script = script.replace("localhost:8765", f"localhost:{port}")
    # `wait`: a server sent SIGTERM by the block has drained and exited before the test ends;
    # the trap ends one the block left running when a command of it failed
    script = f"trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}\nwait\n"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
    if "--questions" in script:
        rows = [json.loads(x) for x in (cwd / "answers.jsonl").read_text().splitlines()]
        assert len(rows) == 20 and all(
            set(r["answers"]) == {"intent", "urgency", "tags"} for r in rows
        )
        assert "verify: 100.00% label agreement" in done.stderr, done.stderr
    elif "mlxbatch classify" in script:
        rows = [json.loads(x) for x in (cwd / "labels.jsonl").read_text().splitlines()]
        assert len(rows) == 40 and all(
            r["label"] in {"billing", "technical", "account"} for r in rows
        )
        assert "verify: 100.00% label agreement" in done.stderr, done.stderr
    if "mlxbatch serve" in script:
        reply = json.loads(done.stdout)
        assert {d["label"] for d in reply["data"]} <= {"billing", "technical", "account"}
        assert [d["index"] for d in reply["data"]] == [0, 1]


@pytest.mark.parametrize("body", readme_blocks("python"))
def test_python_block_runs(newcomer, body):
    cwd, env = newcomer
    done = subprocess.run(
        [sys.executable, "-c", body], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2, done.stdout


DOCS = [
    README,
    ROOT / "CHANGELOG.md",
    ROOT / "BENCHMARKS.md",
    *sorted((ROOT / "docs").glob("*.md")),
]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_lead_somewhere(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: {target}"
        if anchor and dest.suffix == ".md":
            heads = {slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)}
            assert anchor in heads, f"{page.name}: {target}"


HISTORY = re.compile(
    r"\bissues? ?#?\d+|(?<![\w&/])#\d+\b|\bstop \d+|\b(?:this|the previous|the next|a later|"
    r"that) stop\b|\bround (?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven)\b"
    r"|\bfound by (?:this|a|the|CI)\b|\bhostile (?:pass|tester)\b|\breview round\b|\bfresh pass\b",
    re.I,
)
NUMBERED = re.compile(r"(?:issue|stop|round)_?\d", re.I)  # in a test file's or test's name


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_tell_no_history(page):
    """Readers want what the tool does, not which issue, stop or round of work changed it."""
    found = [m.group(0) for m in HISTORY.finditer(page.read_text())]
    assert not found, f"{page.name}: {found}"


def test_the_code_tells_no_history():
    """Comments and docstrings say why the code is as it is, not who or what changed it."""
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)!r}"
        for path in sorted((ROOT / "mlxbatch").rglob("*.py"))
        for m in HISTORY.finditer(path.read_text())
    ]
    assert not found, found


def _history_in_tests(paths) -> list[str]:
    """What the names and docstrings of test files and tests say of the work's history."""
    found = [p.name for p in paths if NUMBERED.search(p.stem)]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)):
                continue
            name = getattr(node, "name", "")
            found += [f"{path.name}: {name}"] if NUMBERED.search(name) else []
            doc = ast.get_docstring(node, clean=False) or ""
            found += [f"{path.name}: {name}: {m.group(0)!r}" for m in HISTORY.finditer(doc)]
    return found


def test_the_tests_tell_no_history():
    """A test's file name, name and docstring say what it checks, not what asked for it."""
    found = _history_in_tests(sorted((ROOT / "tests").glob("test_*.py")))
    assert not found, found


@pytest.mark.parametrize(
    "text",
    [
        "fixed for issue #12",
        "see #34",
        "stop 7 added it",
        "as round five asked",
        "a hostile pass found it",
        "Found by CI: a race",
        "after the review round",
    ],
)
def test_the_history_check_catches_history(text):
    assert HISTORY.search(text)


@pytest.mark.parametrize(
    "text",
    ["a round of batches", "each round (one batch a lane)", "the stop signal", "issue a warning"],
)
def test_the_history_check_passes_plain_words(text):
    assert not HISTORY.search(text)


def test_the_test_check_catches_numbered_names_and_history_docstrings(tmp_path):
    numbered = tmp_path / "test_issue12.py"
    numbered.write_text('def test_round_4_fix():\n    """Found by CI."""\n')
    plain = tmp_path / "test_rounds.py"
    plain.write_text('def test_a_round_ends():\n    """Each round takes one batch a lane."""\n')
    assert len(_history_in_tests([numbered])) == 3
    assert _history_in_tests([plain]) == []
