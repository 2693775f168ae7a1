"""Stop signals that arrive before the launcher is ready: recorded, never fatal, handed to main().

Under Slurm a stop signal can come at any moment, also while bin/train is still starting (bash, the tool
env, Python's imports): SIGUSR1's default action is to terminate, which Slurm would record as FAILED.
bin/train (bash) traps the signals until it execs Python and passes one that came in
LINGBOT_EARLY_SIGNAL (ignoring them across the exec); trainer/launcher/__main__.py calls capture() before any
heavy import; main() asks pending() once its own handlers are in place and stops before anything runs.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

EARLY_ENV = "LINGBOT_EARLY_SIGNAL"
CAPTURED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
_seen: list[str] = []


def _record(signum: int, frame: FrameType | None) -> None:
    _seen.append(signal.Signals(signum).name)


def capture() -> None:
    """Record stop signals from now on (called first thing in the launcher process)."""
    for sig in CAPTURED:
        signal.signal(sig, _record)


def pending() -> str | None:
    """The first stop signal that arrived before main() was ready (bin/train's or Python's), if any.
    Takes LINGBOT_EARLY_SIGNAL out of os.environ: it is for this process, not for the ranks."""
    inherited = os.environ.pop(EARLY_ENV, "")
    if inherited:
        return inherited if inherited.startswith("SIG") else f"SIG{inherited}"
    return _seen[0] if _seen else None
