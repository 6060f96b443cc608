"""A bench peer in a child process of its own: a peer library that crashes ends the child, not
the bench; the crash is reported with its signal and the run goes on."""

from __future__ import annotations

import importlib
import json
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


def run_isolated(target: str, name: str, kwargs: dict) -> dict:
    """`target(**kwargs)` ("module:function") in a child; a death is reported under `name`."""
    with tempfile.TemporaryDirectory(prefix="mlxbatch-peer-") as tmp:
        args, out = Path(tmp) / "args.pickle", Path(tmp) / "result.json"
        args.write_bytes(pickle.dumps(kwargs))
        # its standard output is not the report's; its progress goes to standard error
        run = subprocess.run(
            [sys.executable, "-m", __name__, target, str(args), str(out)], stdout=subprocess.DEVNULL
        )
        if run.returncode < 0:
            try:
                why = signal.Signals(-run.returncode).name
            except ValueError:
                why = f"signal {-run.returncode}"
            return {"name": name, "error": f"crashed ({why})", "crashed": why}
        try:
            return dict(json.loads(out.read_text()))
        except (OSError, ValueError):
            return {"name": name, "error": f"exited with code {run.returncode} and no result"}


def _child(target: str, args: str, out: str) -> None:
    # Ctrl-C reaches the whole process group: the bench ends this child and says so itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ..runtime import blas

    blas.activate_in_process()  # as the bench's own process: before mlx is imported
    module, function = target.split(":")
    kwargs = pickle.loads(Path(args).read_bytes())
    try:
        result = getattr(importlib.import_module(module), function)(**kwargs)
    except Exception as e:  # a peer's failure is a line of the report, never the bench's end
        result = {
            "name": kwargs.get("name", target),
            "error": " ".join(str(e).split())[:300] or type(e).__name__,
        }
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    _child(*sys.argv[1:4])
