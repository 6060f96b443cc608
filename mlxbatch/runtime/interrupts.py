"""How the command line ends on a signal: SIGINT and SIGTERM raise KeyboardInterrupt in the
main thread, and the process exits with one line and 128 + the first signal (130, 143); a
second signal exits at once, without a traceback."""

from __future__ import annotations

import os
import signal
import sys
import threading

RECEIVED: list[int] = []  # the signals that interrupted this process, first first
CAUGHT = (signal.SIGINT, signal.SIGTERM)


def install() -> None:
    """Take SIGTERM, and SIGINT unless this process was started with it ignored (a job run in
    the background without job control must not stop at the terminal's Ctrl-C)."""
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _interrupt)


def _interrupt(signum, frame) -> None:
    RECEIVED.append(signum)
    for s in CAUGHT:
        if signal.getsignal(s) is _interrupt:
            signal.signal(s, _exit_now)
    raise KeyboardInterrupt


def exit_code() -> int:
    """128 + the signal that interrupted this process (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + (RECEIVED[0] if RECEIVED else signal.SIGINT)


def ending() -> None:
    """From here on a signal exits at once: the process has said its last line."""
    _SAID.append(True)
    for s in CAUGHT:
        if signal.getsignal(s) is _interrupt:
            signal.signal(s, _exit_now)


_SAID: list[bool] = []


def _exit_now(signum, frame) -> None:
    if not _SAID:
        sys.stderr.write("error: interrupted\n")
    RECEIVED.append(signum)
    exit_at_once(exit_code())


def exit_at_once(code: int) -> None:
    """Exit without finalizing the interpreter: a thread still in native code (MLX loading)
    would exit through C++ frames that may not be unwound (`terminate called ...`)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader gone: nothing more can be said
            pass
    os._exit(code)


def native_threads_running() -> bool:
    """Whether a daemon thread (one the interpreter would not wait for) is still running."""
    return any(t.daemon and t.is_alive() for t in threading.enumerate())
