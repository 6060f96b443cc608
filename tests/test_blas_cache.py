"""The renamed OpenBLAS copy and the caches behind it, where they go wrong on a user's machine:
a copy cut short, a cache that cannot be written, processes starting together on an empty
cache, and an OPENBLAS_CORETYPE this CPU cannot run."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mlxbatch.runtime import cpu, elf, scipy_openblas

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux"
    or scipy_openblas.library() is None
    or scipy_openblas.patchelf()[0] is None,
    reason="the renamed scipy-openblas32 copy is made on Linux, with patchelf",
)
MADE = "from mlxbatch.runtime import scipy_openblas; print(scipy_openblas.renamed()[0])"


def python(code: str, cache: Path, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )


def test_a_copy_cut_short_is_made_again_not_loaded(tmp_path):
    """A truncated copy killed every later command with SIGBUS at load (`--version` too)."""
    made = python(MADE, tmp_path)
    copy = Path(made.stdout.strip())
    assert made.returncode == 0 and copy.is_file(), made.stderr
    whole = copy.stat().st_size
    os.truncate(copy, whole // 2)
    run = python(
        "import mlxbatch; from mlxbatch import Classifier; import mlx.core as mx;"
        "a = mx.ones((64, 64)); mx.eval(a @ a);"
        "from mlxbatch.runtime import blas; print(blas.ACTIVE['source'])",
        tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["scipy-openblas32"]
    assert copy.stat().st_size == whole and elf.whole(copy)


LOADS = (
    "import mlxbatch; from mlxbatch import Classifier; import mlx.core as mx;"
    "a = mx.ones((64, 64)); mx.eval(a @ a);"
    "from mlxbatch.runtime import blas; print(blas.ACTIVE['source'])"
)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("keep_mtime", [True, False])
def test_a_damaged_copy_is_made_again_not_loaded(tmp_path, keep_mtime):
    """Bytes overwritten in the copy, its size (and mtime) kept, killed every later command and
    `from mlxbatch import Classifier` with SIGSEGV; with its mtime changed, every later run
    stayed on the reference BLAS (its probe crashed) and the copy was never made again."""
    made = python(MADE, tmp_path)
    copy = Path(made.stdout.strip())
    assert made.returncode == 0 and copy.is_file(), made.stderr
    good, st = digest(copy), copy.stat()
    with open(copy, "r+b") as f:  # the code, not the headers: elf.whole() still passes
        f.seek(st.st_size // 3)
        f.write(b"\xcc" * (1 << 20))
    if keep_mtime:
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert copy.stat().st_size == st.st_size and elf.whole(copy) and digest(copy) != good
    run = python(LOADS, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["scipy-openblas32"]
    notes = [x for x in run.stderr.splitlines() if "damaged" in x]
    assert len(notes) == 1 and str(copy) in notes[0], run.stderr
    assert digest(copy) == good
    again = python(LOADS, tmp_path)  # made again once: no note the next time
    assert again.returncode == 0 and "damaged" not in again.stderr, again.stderr


def test_a_copy_unchanged_since_its_digest_is_not_hashed_again(tmp_path, monkeypatch):
    """The check costs a stat: the 25 MB copy is hashed only where its stat changed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    copy = Path(scipy_openblas.renamed()[0])

    def hashed(path):
        raise AssertionError(f"{path} hashed again")

    monkeypatch.setattr(scipy_openblas, "_digest", hashed)
    assert scipy_openblas.renamed() == (str(copy), None)
    os.utime(copy)  # touched: hashed now, found whole, its new stat recorded
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert scipy_openblas.renamed() == (str(copy), None)
    monkeypatch.setattr(scipy_openblas, "_digest", hashed)
    assert scipy_openblas.renamed() == (str(copy), None)


def test_a_cache_that_cannot_be_made_leaves_the_fast_blas_and_says_so(tmp_path, tiny_model_dir):
    """XDG_CACHE_HOME naming a file was a traceback from every command; now the copy is made in
    this user's own folder of the temporary directory (reused: `doctor` marks it chosen) and
    the CLI notes that nothing is cached."""
    afile, temp = tmp_path / "afile", tmp_path / "tmp"
    afile.write_text("not a directory\n")
    temp.mkdir()
    run = python(
        "from mlxbatch.runtime import blas; print(blas.activate_in_process(), "
        "blas.ACTIVE.get('source'), any(r.get('chosen') for r in blas.tried()))",
        afile,
        TMPDIR=str(temp),
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "scipy-openblas32", "True"]
    (private,) = (temp / f"mlxbatch-{os.getuid()}" / "blas-libs").iterdir()
    assert (private / "libopenblas.so").is_file()
    for level in (private.parent.parent, private.parent):  # mlxbatch-<uid>, blas-libs
        assert level.stat().st_mode & 0o777 == 0o700 and level.stat().st_uid == os.getuid()
    env = {**os.environ, "XDG_CACHE_HOME": str(afile), "TMPDIR": str(temp)}
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxbatch",
            "classify",
            "-",
            "--model",
            str(tiny_model_dir),
            "--labels",
            "a,b",
        ],
        input="hello\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert cli.returncode == 0, cli.stderr
    assert "Traceback" not in cli.stderr and "reference BLAS" not in cli.stderr
    assert f"note: the cache {afile}/mlxbatch cannot be made" in cli.stderr
    assert "set XDG_CACHE_HOME to a writable directory" in cli.stderr


def test_the_private_folder_is_private_under_a_group_umask(tmp_path):
    """A review found: under umask 002 (Ubuntu's for users with their own group) the folder
    above `blas-libs` was made 0775 and then refused as not private, on every run: MLX stayed
    on the reference BLAS. Each level is made 0700, and one an older mlxbatch left open to
    the group is closed again."""
    afile, temp = tmp_path / "afile", tmp_path / "tmp"
    afile.write_text("not a directory\n")
    temp.mkdir()
    code = (
        "import os; os.umask(0o002); from mlxbatch.runtime import blas; "
        "print(blas.activate_in_process(), blas.ACTIVE.get('source'))"
    )
    run = python(code, afile, TMPDIR=str(temp))
    assert run.returncode == 0 and run.stdout.split() == ["True", "scipy-openblas32"], run.stderr
    root = temp / f"mlxbatch-{os.getuid()}"
    assert [oct(d.stat().st_mode & 0o777) for d in (root, root / "blas-libs")] == ["0o700"] * 2
    os.chmod(root, 0o775)  # as an older mlxbatch made it
    again = python(code, afile, TMPDIR=str(temp))
    assert again.stdout.split() == ["True", "scipy-openblas32"], again.stderr
    assert root.stat().st_mode & 0o777 == 0o700


def test_a_copy_in_a_cache_read_only_since_is_used_without_patchelf(tmp_path, monkeypatch):
    """A review found: where the cache could not be written, a whole copy already in it was
    never looked at: without patchelf the fast BLAS was lost, with it a second copy was made."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # gettempdir() is read once
    made = Path(scipy_openblas.renamed()[0])
    assert made.is_relative_to(tmp_path / "cache")
    monkeypatch.setattr(scipy_openblas, "cache_problem", lambda: "the cache is not writable")
    monkeypatch.setattr(scipy_openblas, "patchelf", lambda: (None, "patchelf is not installed"))
    assert scipy_openblas.renamed() == (str(made), None)
    assert not (tmp_path / f"mlxbatch-{os.getuid()}").exists()  # no second copy


def test_processes_making_the_copy_together_all_get_it(tmp_path):
    """Processes started together on an empty cache shared one symbol-map file: one's clean-up
    removed it under another's patchelf (3 of 32 failed), which then ran on the reference."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MADE],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert all(out.strip() not in ("", "None") for out, _ in outs), outs
    (made,) = (tmp_path / "mlxbatch" / "blas-libs").iterdir()
    assert sorted(p.name for p in made.iterdir()) == [
        "libopenblas.so",
        "libopenblas.so.sha256.json",
    ]
    assert elf.whole(made / "libopenblas.so")


@pytest.mark.skipif(
    platform.machine() != "x86_64"
    or cpu.AVX512 <= cpu.flags()
    or not {"avx2", "fma"} <= cpu.flags(),
    reason="needs an x86_64 CPU with AVX2 and without AVX-512",
)
def test_a_coretype_this_cpu_cannot_run_is_one_line_not_a_sigill(tmp_path):
    """OPENBLAS_CORETYPE=SkylakeX on an AVX2 CPU died of SIGILL (NumPy's OpenBLAS reads it too)."""
    env = {**os.environ, "OPENBLAS_CORETYPE": "SkylakeX", "XDG_CACHE_HOME": str(tmp_path)}
    cli = subprocess.run(
        [sys.executable, "-m", "mlxbatch", "tickets", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert cli.returncode == 2, (cli.returncode, cli.stderr)
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: OPENBLAS_CORETYPE=SkylakeX names")
    assert "avx512f" in lines[0] and "Haswell" in lines[0]
    api = python("from mlxbatch import Classifier", tmp_path, OPENBLAS_CORETYPE="skylakex")
    assert api.returncode == 1 and "UsageError: OPENBLAS_CORETYPE=skylakex" in api.stderr
    fine = python("from mlxbatch import Classifier", tmp_path, OPENBLAS_CORETYPE="Haswell")
    assert fine.returncode == 0, fine.stderr


@pytest.mark.skipif(
    platform.machine() != "x86_64" or "avx" not in cpu.flags(),
    reason="needs an x86_64 CPU with AVX",
)
def test_a_coretype_older_than_the_cpu_is_noted(tmp_path, tiny_model_dir):
    """OPENBLAS_CORETYPE=Prescott ran products at 13 GFLOP/s against 70, and nothing said so."""
    env = {**os.environ, "OPENBLAS_CORETYPE": "Prescott", "XDG_CACHE_HOME": str(tmp_path)}
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxbatch",
            "classify",
            "-",
            "--model",
            str(tiny_model_dir),
            "--labels",
            "a,b",
        ],
        input="hello\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert cli.returncode == 0, cli.stderr
    assert "note: OPENBLAS_CORETYPE=Prescott picks OpenBLAS kernels older than" in cli.stderr
