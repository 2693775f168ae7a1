"""Checks before any rank starts (a failure is exit 3, no rank started, no checkpoint touched).

check_run_dir: the run dir exists and is writable. env_checks: bin/envcheck's fast subset for the
chosen env (the provisioned env's own bookkeeping checks do not apply to the tool environment).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from trainer.config import RunConfig
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


def space_check(run_dir: Path, cfg: RunConfig, world_size: int) -> list[str]:
    """The run dir's filesystem must hold checkpoint.keep + 1 checkpoints (keep, plus the one being
    written), counting the space its existing checkpoints already take; PreflightError names both numbers.
    Returns notes (the estimate; a warning when checkpoint.skip_space_check overrides a refusal)."""
    from provision.nodeinfo import free_bytes, mount_of
    from trainer.checkpoint import scan
    from trainer.checkpoint_size import estimate_bytes, model_size
    from trainer.diskspace import human

    one = estimate_bytes(cfg, model_size(cfg), world_size)
    count = cfg.checkpoint.keep + 1
    complete, _ = scan(run_dir / "checkpoints")
    existing = sum(f.stat().st_size for c in complete for f in c.path.iterdir() if f.is_file())
    free = free_bytes(run_dir)
    needed = count * one - existing
    mount = mount_of(run_dir)
    where = f"{run_dir} ({mount.mount_point}, {mount.fstype})"
    note = (
        f"checkpoint size estimate {human(one)}; checkpoint.keep + 1 = {count} need {human(count * one)}; "
        f"{where} has {human(free)} free" + (f" + {human(existing)} in its checkpoints" if existing else "")
    )
    if needed <= free:
        return [note]
    message = (
        f"{where} cannot hold checkpoint.keep + 1 = {count} checkpoints of ~{human(one)}: needs "
        f"{human(needed)} more, has {human(free)} free; fix: free space there, lower checkpoint.keep, "
        f"or move --run-dir (--set checkpoint.skip_space_check=true runs anyway)"
    )
    if cfg.checkpoint.skip_space_check:
        return [f"WARNING: {message} -- checkpoint.skip_space_check=true: running anyway"]
    raise PreflightError(message)
