"""bin/envcheck: prove an env on the node a job will run on, before a 24-hour job waits in the queue.

Every check is named and ends PASS, WARN, FAIL or SKIP (not applicable here, or a prerequisite failed:
the message names it), with its time and, on FAIL, a fix to run. The report is ok only when nothing
FAILed. The checks are one declarative table (table.py) of small functions over a typed context
(context.py): the env (checks_env.py), real compiles (checks_compile.py), the node (checks_node.py).

With --worker the job's environment is what a non-activated, non-interactive process gets on a
worker: a scrubbed base (PATH=/usr/bin:/bin, HOME, USER, LANG) plus the env's variables from the one
file the hooks read (provision/envvars.py). A compile that works only because the login node has a
system gcc is then a FAIL: the worker has none. Compiles are real, each in a fresh process with
throwaway caches that are empty when the run starts (provision/probes/; on CPU FlexAttention reuses the
Inductor probe's, checks_compile.py), so a warm cache cannot hide a missing compiler.

Public API (bin/train's preflight uses it): run_checks, Check, Report, PASS/WARN/FAIL/SKIP,
scrubbed_environment, cache_filesystem_verdict.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from provision.check.checks_node import cache_filesystem_verdict
from provision.check.context import Context, env_name_of, scrubbed_environment
from provision.check.report import FAIL, PASS, REPORT_FORMAT, SKIP, STATUSES, WARN, Check, Report
from provision.check.table import TABLE, CheckSpec, run_table, select

__all__ = [
    "FAIL",
    "PASS",
    "REPORT_FORMAT",
    "SKIP",
    "STATUSES",
    "TABLE",
    "WARN",
    "Check",
    "Report",
    "cache_filesystem_verdict",
    "run_checks",
    "scrubbed_environment",
]


def run_checks(
    prefix: Path,
    *,
    worker: bool,
    fast: bool = False,
    only: list[str] | None = None,
    env: Mapping[str, str] | None = None,
    lockfile: Path | None = None,
    mountinfo: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    chosen_by: str = "given",
    compile_as_caller: bool = False,
    table: tuple[CheckSpec, ...] = TABLE,
) -> Report:
    """Check the env at `prefix` as a job on this node would use it; see the module docstring.

    `env` is the caller's environment (default os.environ); `fast` is bin/train's preflight subset
    (variables, the Triton C build and one small Inductor kernel, caches, filesystems, node); `only`: the
    rows named (patterns allowed) and the rows they need (table.select: ValueError for a name of none);
    `mountinfo` replaces /proc/self/mountinfo (tests); `progress` receives lines for the slow checks;
    `compile_as_caller`: for a prefix that is no provisioned env (bin/train's tool-env fallback), run the
    compile checks with the caller's environment instead of skipping them (never under --worker);
    `table`: the rows to run (bin/train's preflight leaves out compile checks a recorded pass stands for)."""
    prefix = Path(prefix)
    ctx = Context(
        prefix=prefix,
        worker=worker,
        fast=fast,
        caller_env=dict(os.environ if env is None else env),
        lockfile=Path(lockfile) if lockfile else None,
        mountinfo=os.fspath(mountinfo) if mountinfo is not None else None,
        progress=progress,
        chosen_by=chosen_by,
        compile_as_caller=compile_as_caller,
    )
    if only:
        table = select(table, only, ctx)
    report = Report(
        str(prefix),
        env_name_of(prefix),
        worker,
        fast,
        socket.gethostname(),
        time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        only=list(only or []),
    )
    started = time.perf_counter()
    report.checks = run_table(ctx, table)
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def main() -> None:
    from provision.check.cli import main as cli_main

    cli_main(prog_name="bin/envcheck")
