"""--json / --json-file: the one convention of bin/provision, bin/envcheck and bin/train (its one owner).

    --json            stdout carries exactly one JSON object, the outcome; every other line goes to stderr
                      (bin/train points fd 1 at fd 2 for the whole run, so torchrun and the ranks inherit
                      it); the exit status does not change
    --json-file FILE  the same object written to FILE atomically; stdout and stderr as without it

Every object has "ok" (exit status 0) and "exit_code" (the exit status); the rest is the command's
result (bin/provision: what it did; bin/envcheck: the report; bin/train: RUN_DIR/summary.json as the run
left it), or "error" for a bad command line. Both flags are read from argv before the parser runs, so a
usage error is JSON too (run_click does this for the click commands).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from provision.atomic import write_atomic


@dataclass
class JsonRequest:
    """Where the outcome object goes (neither: nowhere)."""

    stdout: bool = False
    file: Path | None = None
    _real_stdout: int | None = None

    @classmethod
    def from_argv(cls, argv: list[str], legacy_json_file: bool = False) -> JsonRequest:
        """`legacy_json_file`: bin/envcheck's old spelling `--json FILE` (FILE not `-`) is --json-file."""
        request = cls()
        for i, arg in enumerate(argv):
            if arg == "--":
                break
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if arg == "--json" and legacy_json_file and nxt is not None and not nxt.startswith("-"):
                request.file = Path(nxt)
            elif arg == "--json":
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

    def emit(self, outcome: dict[str, Any]) -> bool:
        """Write the object where asked; False when --json-file could not be written (said on stderr):
        the command then must not exit 0, the output it was asked for being missing."""
        text = json.dumps(outcome, indent=1, sort_keys=True, default=str) + "\n"
        written = True
        if self.file is not None:
            try:
                write_atomic(self.file, text)
            except OSError as exc:
                print(f"could not write --json-file {self.file}: {exc}", file=sys.stderr)
                written = False
        if self.stdout:
            sys.stdout.flush()
            fd = self._real_stdout if self._real_stdout is not None else 1
            os.write(fd, text.encode())
            if self._real_stdout is not None:
                os.dup2(self._real_stdout, 1)
                os.close(self._real_stdout)
                self._real_stdout = None
        return written


def outcome(exit_code: int, body: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """The object: `body` (a summary's JSON) or `fields`, with ok/exit_code always set from the exit."""
    result = dict(body or {})
    result.update(fields)
    result["ok"] = exit_code == 0
    result["exit_code"] = exit_code
    return result


def run_click(
    command: click.Command, prog_name: str, argv: list[str] | None = None, legacy_json_file: bool = False
) -> NoReturn:
    """Run a click command; a usage error is click's text on stderr and, under --json/--json-file, the
    JSON object {"ok": false, "exit_code": 2, "error": ...}. `legacy_json_file`: bin/envcheck's old
    `--json FILE` (only there: `bin/evaluate --json RUN_DIR --bogus` must not write over RUN_DIR)."""
    argv = sys.argv[1:] if argv is None else argv
    request = JsonRequest.from_argv(argv, legacy_json_file=legacy_json_file)
    try:
        command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Exit as exc:  # --help
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        if request.wanted:
            request.emit(outcome(exc.exit_code, error=exc.format_message()))
        sys.exit(exc.exit_code)
    except click.Abort:  # Ctrl-C (click turns KeyboardInterrupt into Abort): 128 + SIGINT, never "failed"
        print(f"{prog_name}: stopped by SIGINT (Ctrl-C)", file=sys.stderr)
        if request.wanted:
            request.emit(outcome(130, error="stopped by SIGINT (Ctrl-C)"))
        sys.exit(130)
    sys.exit(0)
