"""Checks before any rank starts (a failure is exit 3, no rank started, no checkpoint touched).

check_run_dir: the run dir exists and is writable. env_checks: bin/envcheck's fast subset for the
chosen env (the provisioned env's own bookkeeping checks do not apply to the tool environment).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from trainer.launcher.envchoice import EnvChoice
from trainer.launcher.errors import PreflightError


def check_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise PreflightError(
            f"run dir {run_dir} is not writable ({exc}); pass a writable --run-dir"
        ) from None


# Checks of a provisioned env's own bookkeeping (manifest, lock, variables file, sysroot): they cannot
# apply to the tool environment, which bin/provision did not make.
TOOL_ENV_NOT_APPLICABLE = frozenset(
    {
        "env.complete",
        "env.lock",
        "variables.file",
        "variables.CC",
        "variables.CXX",
        "toolchain.sysroot",
        "node.glibc",
    }
)


def env_checks(choice: EnvChoice, env: dict[str, str]) -> list[str]:
    """bin/envcheck's fast subset (compilers, caches, node): notes; PreflightError on a FAIL."""
    from provision.check import FAIL, SKIP, WARN, run_checks

    report = run_checks(
        choice.prefix, worker=False, fast=True, env=env, compile_as_caller=not choice.provisioned
    )
    notes, failures, not_applicable, skipped = [], [], [], []  # skipped: Check objects
    for check in report.checks:
        if check.status == FAIL and not choice.provisioned and check.name in TOOL_ENV_NOT_APPLICABLE:
            not_applicable.append(check.name)
        elif check.status == FAIL:
            failures.append(
                f"{check.name}: {check.message}" + (f"\n    fix: {check.fix}" if check.fix else "")
            )
        elif check.status == WARN:
            notes.append(f"envcheck WARN {check.name}: {check.message}")
        elif check.status == SKIP and not choice.provisioned:
            skipped.append(check)
    if failures:
        raise PreflightError(f"bin/envcheck --fast failed for {choice.prefix}:\n  " + "\n  ".join(failures))
    if not_applicable:
        notes.append(f"tool environment: not applicable, skipped: {', '.join(not_applicable)}")
    by_reason: dict[str, list[str]] = {}
    for check in skipped:
        by_reason.setdefault(check.message, []).append(check.name)
    for reason, names in by_reason.items():
        notes.append(f"tool environment: envcheck skipped {', '.join(names)}: {reason}")
    return notes
