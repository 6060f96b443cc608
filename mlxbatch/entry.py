"""The `mlxbatch` command's entry point: SIGINT and SIGTERM are taken before anything heavy is
imported, so a signal while the command starts ends it in one line too."""

from __future__ import annotations

import os
import signal
import sys


def _starting(signum, frame) -> None:
    sys.stderr.write("error: interrupted\n")
    sys.stderr.flush()
    os._exit(128 + signum)  # nothing is written yet: no cleanup to run


def main() -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(s) is not signal.SIG_IGN:  # a background job keeps Ctrl-C ignored
            signal.signal(s, _starting)
    from .cli import main as command

    command()
