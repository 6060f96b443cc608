"""Release: the wheel and the sdist build, install into a fresh venv and run `mlxbatch`."""

from __future__ import annotations

import re
import site
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pyproject_version() -> str:
    return re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def run(*cmd, cwd: Path | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist, and the wheel built from it, as `python -m build` makes them for a release."""
    out = tmp_path_factory.mktemp("dist")
    had_build_dir = (ROOT / "build").exists()
    # --no-isolation: setuptools and build come from this environment (the dev extra), no network.
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT, cwd=out)
    assert had_build_dir or not (ROOT / "build").exists(), "the build left build/ in the repo"
    (wheel,) = out.glob("mlxbatch-*.whl")
    (sdist,) = out.glob("mlxbatch-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_wheel_holds_every_module(dists):
    # A subpackage the package finder misses would only fail once installed.
    source = {p.relative_to(ROOT).as_posix() for p in (ROOT / "mlxbatch").rglob("*.py")}
    with zipfile.ZipFile(dists["wheel"]) as whl:
        packed = {n for n in whl.namelist() if n.startswith("mlxbatch/")}
    assert source - packed == set()
    assert dists["wheel"].name.split("-")[1] == pyproject_version()


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_command_runs(dists, kind, tmp_path):
    wheel = dists["wheel"]
    if kind == "sdist":  # what `pip install mlxbatch-X.tar.gz` does: build a wheel, install it
        run(
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "-w",
            tmp_path / "from-sdist",
            dists["sdist"],
        )
        (wheel,) = (tmp_path / "from-sdist").glob("mlxbatch-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python, mlxbatch = venv / "bin" / "python", venv / "bin" / "mlxbatch"
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "-q",
        "--no-deps",
        "--no-index",
        wheel,
    )
    # Only now let the venv see this environment's dependencies (mlx, click, ...): its own
    # site-packages stays first, and pip never saw (or offered to replace) the mlxbatch here.
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    Path(purelib.strip(), "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    where = run(python, "-c", "import mlxbatch; print(mlxbatch.__file__)", cwd=tmp_path)
    assert Path(where.strip()).is_relative_to(venv)  # the installed copy, not this checkout
    assert run(mlxbatch, "--version", cwd=tmp_path) == f"mlxbatch {pyproject_version()}\n"
    demo = run(mlxbatch, "demo", "--help", cwd=tmp_path)
    assert demo.startswith("Usage: mlxbatch demo [OPTIONS]")
    assert "--tickets" in demo


def test_version_falls_back_to_pyproject(monkeypatch):
    from mlxbatch import cli

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "version", not_installed)
    assert cli.version() == pyproject_version()


def _lowest(spec: str) -> tuple[int, ...]:
    """The lowest Python a `Requires-Python` of the form ">=X.Y" admits."""
    found = re.search(r">=\s*(\d+(?:\.\d+)*)", spec or "")
    return tuple(int(x) for x in found.group(1).split(".")) if found else (0,)


def test_requires_python_is_what_every_dependency_requires():
    """`requires-python` promised 3.10 while mlx-lm 0.32 needs 3.11: on 3.10 `pip install`
    failed with "No matching distribution found for mlx-lm>=0.32" instead of naming Python."""
    ours = _lowest(
        re.search(r'^requires-python = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(
            1
        )
    )
    for req in metadata.requires("mlxbatch") or []:
        if "extra ==" in req:
            continue
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
        try:
            theirs = _lowest(metadata.metadata(name).get("Requires-Python"))
        except metadata.PackageNotFoundError:  # a platform's dependency not on this one
            continue
        assert ours >= theirs[:2], f"{name} requires Python {theirs}, pyproject says {ours}"
