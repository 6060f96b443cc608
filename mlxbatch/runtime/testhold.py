"""A hold point for tests: MLXBATCH_TEST_HOLD_AFTER=N stops a job for good once N batches are
durable, so a test that interrupts it (Ctrl-C, SIGKILL, a killed rank) does so at a known
point instead of racing a job that may already have finished."""

from __future__ import annotations

import os
import sys
import time

from ..errors import UsageError

VARIABLE = "MLXBATCH_TEST_HOLD_AFTER"


def after_batch(done: int) -> None:
    """Block forever once `done` (the batches this run has made durable) reaches the variable's
    N; a no-op when it is unset. Call it from the main thread: its sleep lets SIGINT raise
    KeyboardInterrupt there, and SIGTERM's handler and SIGKILL act as they would mid-job."""
    value = os.environ.get(VARIABLE)
    if not value:
        return
    try:
        hold = int(value)
    except ValueError:
        raise UsageError(f"{VARIABLE}={value!r}: expected a number of batches") from None
    if done < hold:
        return
    sys.stderr.write(f"held after {hold} batches ({VARIABLE})\n")
    sys.stderr.flush()
    while True:
        time.sleep(3600)


HOLD_FILE = "MLXBATCH_TEST_HOLD_FILE"


def held() -> bool:
    """Whether a live scheduler must not start a round: `MLXBATCH_TEST_HOLD_FILE` names a file
    that exists. A service test creates it to keep what is queued queued (a full queue, a
    drain with work in it) for as long as it needs, and removes it to let the work go."""
    path = os.environ.get(HOLD_FILE)
    return bool(path) and os.path.exists(path)
