"""The launcher's voice: every line it prints to the user's terminal goes through `say` (stderr).

And what of torchrun's stderr (the ranks' included) reaches the terminal: `TracebackFilter` keeps every
line except Python tracebacks (a rank's uncaught exception, torchrun's own ChildFailedError and its
"Root Cause" banner); those go only to the attempt's node<N>.log, which receives every line
(trainer/launcher/supervise.py). A failure is said in one line by the launcher, naming that log.
"""

from __future__ import annotations

import re
import sys

_PREFIX = re.compile(r"^(\[rank\d+\]:\s?|\[default\d+\]:\s?)")  # torchrun's per-rank line prefixes
_CHAIN = ("The above exception was the direct cause", "During handling of the above exception")


def say(message: str) -> None:
    print(f"[bin/train] {message}", file=sys.stderr, flush=True)


class TracebackFilter:
    """Line by line: `keep(line)` is False for the lines of a Python traceback block.

    A block starts at "Traceback (most recent call last):"; its frames are indented; it ends with the
    exception's line (not indented), possibly chained to another traceback, and, for torchrun's
    ChildFailedError, followed by a banner between two lines of '='."""

    def __init__(self) -> None:
        self.state = "text"  # text | frames | after (the exception's line seen) | banner
        self.banner_rules = 0

    def keep(self, line: str) -> bool:
        text = _PREFIX.sub("", line.rstrip("\n"))
        if self.state == "text":
            if text.startswith("Traceback (most recent call last):"):
                self.state = "frames"
                return False
            return True
        if self.state == "frames":
            if not text.strip() or text[:1].isspace() or text.startswith(_CHAIN):
                return False
            self.state = "after"  # the exception's own line
            return False
        if self.state == "after":
            if not text.strip() or text.startswith(_CHAIN):
                return False
            if text.startswith("Traceback (most recent call last):"):
                self.state = "frames"
                return False
            if text.startswith("====="):
                self.state, self.banner_rules = "banner", 1
                return False
            self.state = "text"
            return True
        # banner: until its closing line of '='
        if text.startswith("====="):
            self.banner_rules += 1
            if self.banner_rules >= 2:
                self.state = "text"
        return False
