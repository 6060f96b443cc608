"""The test seam: the one place where a job or the service can be paused at a named moment.

A job calls `after_batch(n)` once n batches are durable, the live scheduler `held()` before
each round; both are no-ops unless a test monkeypatches them or sets a variable:

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
    """Block forever once `done` durable batches reach the variable's N. Call it from the main
    thread, so signals act there as they would mid-job."""
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
    """Whether a live scheduler must not start a round: `MLXBATCH_TEST_HOLD_FILE` exists."""
    path = os.environ.get(HOLD_FILE)
    return bool(path) and os.path.exists(path)
