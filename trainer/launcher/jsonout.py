"""bin/train's --json / --json-file: the one convention of bin/provision, bin/envcheck and bin/train.

    --json            stdout carries exactly one JSON object, the outcome; every other byte the launcher,
                      torchrun or a rank writes goes to stderr (fd 1 is pointed at fd 2 for the whole run,
                      so child processes inherit it); the exit status does not change
    --json-file FILE  the same object written to FILE atomically; stdout and stderr as without it

The object is RUN_DIR/summary.json as this invocation left it (status, exit_code, losses, ...) plus
"ok" (exit status 0) and "exit_code" (the exit status); where no summary applies (a usage error, an
sbatch script, --preflight-only, a run dir that cannot be written) it is {"ok": ..., "exit_code": ...,
"error"/"sbatch"/"preflight": ...}. Both flags are read before argparse so a usage error is JSON too.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.atomic import write_atomic


@dataclass
class JsonRequest:
    """Where the outcome object goes (neither: nowhere)."""

    stdout: bool = False
    file: Path | None = None
    _real_stdout: int | None = None

    @classmethod
    def from_argv(cls, argv: list[str]) -> JsonRequest:
        request = cls()
        for i, arg in enumerate(argv):
            if arg == "--":
                break
            if arg == "--json":
                request.stdout = True
            elif arg == "--json-file" and i + 1 < len(argv):
                request.file = Path(argv[i + 1])
            elif arg.startswith("--json-file="):
                request.file = Path(arg.split("=", 1)[1])
        return request

    @property
    def wanted(self) -> bool:
        return self.stdout or self.file is not None

    def capture_stdout(self) -> None:
        """With --json, from here on fd 1 is stderr (for us and every child); the object alone goes to
        the real stdout at the end."""
        if not self.stdout or self._real_stdout is not None:
            return
        sys.stdout.flush()
        self._real_stdout = os.dup(1)
        os.dup2(2, 1)

    def emit(self, outcome: dict[str, Any]) -> None:
        text = json.dumps(outcome, indent=1, sort_keys=True, default=str) + "\n"
        if self.file is not None:
            try:
                write_atomic(self.file, text)
            except OSError as exc:
                print(f"[bin/train] could not write --json-file {self.file}: {exc}", file=sys.stderr)
        if self.stdout:
            sys.stdout.flush()
            fd = self._real_stdout if self._real_stdout is not None else 1
            os.write(fd, text.encode())
            if self._real_stdout is not None:
                os.dup2(self._real_stdout, 1)
                os.close(self._real_stdout)
                self._real_stdout = None


def outcome(exit_code: int, body: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """The object: `body` (a summary's JSON) or `fields`, with ok/exit_code always set from the exit."""
    result = dict(body or {})
    result.update(fields)
    result["ok"] = exit_code == 0
    result["exit_code"] = exit_code
    return result
