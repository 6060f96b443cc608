"""The MLXBATCH_* switches, read one way: 1/true/yes/on is on, 0/false/no/off or empty is off
(any case, spaces ignored), anything else is refused with a line naming the variable."""

from __future__ import annotations

import os

from ..errors import UsageError

NO_FAST_BLAS = "MLXBATCH_NO_FAST_BLAS"  # keep MLX on its bundled reference BLAS
HOST_KERNELS = "MLXBATCH_HOST_KERNELS"  # the host elementwise kernels (on unless set off)
BLAS_PROBE = "MLXBATCH_BLAS_PROBE"  # set in the BLAS probe's subprocess: never recurse
SWITCHES = {NO_FAST_BLAS: False, HOST_KERNELS: True, BLAS_PROBE: False}  # name -> when unset
ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def flag(name: str) -> bool:
    """Whether switch `name` is on (its default when unset); UsageError for another value."""
    raw = os.environ.get(name)
    if raw is None:
        return SWITCHES[name]
    value = raw.strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    raise UsageError(
        f"{name}={raw[:40]!r} is not a switch: 1, true, yes or on turns it on; "
        "0, false, no, off or empty turns it off"
    )


def problem() -> str | None:
    """Why a switch set in the environment cannot be read, or None."""
    for name in SWITCHES:
        try:
            flag(name)
        except UsageError as e:
            return str(e)
    return None
