"""The launcher's voice: every line it prints to the user's terminal goes through `say` (stderr)."""

from __future__ import annotations

import sys


def say(message: str) -> None:
    print(f"[bin/train] {message}", file=sys.stderr, flush=True)
