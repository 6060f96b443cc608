"""A signal at any moment of a command: one line and 128 + the signal (130 for SIGINT, 143 for
SIGTERM), or 0 after the service's clean drain on SIGTERM; never a traceback, never
`terminate called` (an abort). The real CLI runs in a subprocess; each signal is sent at a
point the test sees: a probe child started, a job held after a batch, the service's startup
line."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlxbatch.runtime.testhold import VARIABLE as HOLD_AFTER
from tests.test_serve import free_port

LINUX = platform.system() == "Linux"
CODE = {signal.SIGINT: 130, signal.SIGTERM: 143}


def start(args, env=None, **kw) -> subprocess.Popen:
    # SIGINT at its default: a suite started in the background leaves it ignored in children
    return subprocess.Popen(
        [sys.executable, "-m", "mlxbatch", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **kw,
    )


def children(pid: int) -> list[str]:
    """The command lines of `pid`'s children."""
    try:
        ids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    out = []
    for child in ids:
        try:
            out.append(Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            pass
    return out


def ended_cleanly(proc: subprocess.Popen, code: int, last: str = "error: interrupted") -> str:
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err and "terminate called" not in err, err[-2000:]
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines and lines[-1].startswith(last), err[-2000:]
    assert sum("interrupted" in x for x in lines) == 1, err[-2000:]
    return err


@pytest.mark.skipif(not LINUX, reason="the BLAS probe runs on Linux only")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_blas_probe_is_one_line(tmp_path, sig):
    """Before any command runs, the BLAS is probed in child processes (a few seconds on a
    machine with nothing cached): a signal there was a KeyboardInterrupt traceback."""
    proc = start(["doctor"], env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    deadline = time.monotonic() + 120  # a bound for a hung start, not a race
    while not any("import mlx.core" in c for c in children(proc.pid)):
        assert proc.poll() is None and time.monotonic() < deadline, "no probe was started"
        time.sleep(0.01)
    proc.send_signal(sig)
    err = ended_cleanly(proc, CODE[sig])
    assert len([x for x in err.splitlines() if x.strip()]) == 1, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_job_keeps_the_journal_and_names_resume(tiny_model_dir, tmp_path, sig):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(f'{{"text": "ticket {i} about billing"}}\n' for i in range(40)))
    out = tmp_path / "out.jsonl"
    args = ["classify", src, "--model", tiny_model_dir, "-o", out, "--max-batch", "4"]
    proc = start(args, env={HOLD_AFTER: "1"})
    seen = b""
    while b"held after" not in seen:
        line = proc.stderr.readline()
        assert line, seen.decode()
        seen += line
    proc.send_signal(sig)
    err = ended_cleanly(proc, CODE[sig], last="error: ")
    assert "--resume" in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_service_loads_never_aborts(tiny_model_dir, tmp_path, sig):
    """The model loads in a thread while uvicorn starts: a signal just after "Application
    startup complete" ended the process as that thread was inside MLX, and finalizing the
    interpreter under it aborted (exit 134) at most timings. Several timings, each bounded."""
    for delay in (0.0, 0.05, 0.15, 0.3):
        proc = start(["serve", "--model", tiny_model_dir, "--port", free_port()])
        seen = b""
        while b"Application startup complete" not in seen:
            line = proc.stderr.readline()
            assert line, seen.decode()
            seen += line
        time.sleep(delay)
        proc.send_signal(sig)
        err = proc.communicate(timeout=120)[1].decode()
        assert proc.returncode == (130 if sig == signal.SIGINT else 0), (delay, err[-2000:])
        assert "Traceback" not in err and "terminate called" not in err, (delay, err[-2000:])


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc")
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_command_is_still_importing_is_one_line(tmp_path, signum, code):
    """Sent as soon as NumPy's extension is mapped (the CLI's own imports under way, before its
    handlers): one line and 128 + the signal, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxbatch", "tickets", "3"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    maps = Path(f"/proc/{proc.pid}/maps")
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if "_multiarray_umath" in maps.read_text():
                break
        except OSError:
            pass
        time.sleep(0.002)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the command ended before the signal")
    assert proc.returncode == code, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: "), err
