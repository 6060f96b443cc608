"""The test seam: the one place where a job or the service can be paused at a named moment.

A job's row loop calls `after_batch(n)` once n batches are durable, and the live scheduler asks
`held()` before each round; both are no-ops unless a test sets them. In-process tests
monkeypatch these functions; subprocess tests (a real CLI or service, to interrupt or signal
at a known point instead of racing it) set an environment variable read here and nowhere else:

- `MLXBATCH_TEST_HOLD_AFTER=N`: a job blocks for good once N batches are durable.
- `MLXBATCH_TEST_HOLD_FILE=PATH`: the service starts no round while PATH exists.
"""

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
