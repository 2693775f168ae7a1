"""Checks before any rank starts (a failure is exit 3, no rank started, no checkpoint touched).

check_run_dir: the run dir exists and is writable. env_checks: bin/envcheck's fast subset for the
chosen env (the provisioned env's own bookkeeping checks do not apply to the tool environment).

A recorded pass of the compile checks (the rule): envcheck's compile checks stay real proofs (each
compiles in a fresh process with empty throwaway caches), and they are the slow part of the preflight.
Once they pass (PASS, or WARN: the compile worked, with a caveat such as a system compiler, repeated on
reuse), RUN_DIR/preflight/<host>.json records the key they passed under: the node (hostname and
/proc/sys/kernel/random/boot_id), the env (its prefix and python, the sha256 of its completion manifest,
which carries the lock's content hash, the sha256 of the tool env's ready marker, the job's compiler
and path variables), the check set (the fast rows' names, compile_as_caller) and the check code (the
sha256 of provision/check/ and provision/probes/). A later attempt with the same key (a requeue onto the
same node, same boot, same env) does not rerun those compile checks, says so in one line, and still runs
every other check (variables, caches, filesystems, disk). Another node, a reboot, a changed or
reprovisioned env, changed variables or changed check code: the key differs and everything runs.
"""

from __future__ import annotations

import hashlib
import json
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

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


# The compile checks of the fast subset that a recorded pass on the same node and env stands for.
REUSABLE_CHECKS = ("compile.triton_build", "compile.inductor_cpp")
# The job's variables the compile checks depend on (compilers, where they and their headers are found).
KEY_VARIABLES = (
    "PATH", "CC", "CXX", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH",
    "LD_LIBRARY_PATH", "CFLAGS", "CXXFLAGS", "LDFLAGS", "CONDA_PREFIX", "LINGBOT_GPU_KIND",
    "CUDA_HOME", "TRITON_LIBCUDA_PATH",
)  # fmt: skip
RECORD_DIR = "preflight"
TOOL_MARKER = ".lingbot-ready"  # bin/_tool_env.sh: the sha256 of the pyproject.toml the .venv was built for


def _sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _code_sha() -> str:
    import provision.check
    import provision.probes

    digest = hashlib.sha256()
    for package in (provision.check, provision.probes):
        root = Path(package.__path__[0])
        for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".pyc"):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""  # no boot id: never matches a record (an empty id is never reused)


def preflight_key(choice: EnvChoice, env: dict[str, str], check_set: list[str]) -> dict[str, Any]:
    """What a recorded compile-check pass is valid for (see the module docstring)."""
    from provision.prefix import manifest_path

    return {
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "prefix": str(choice.prefix),
        "python": str(choice.python),
        "provisioned": choice.provisioned,
        "manifest_sha256": _sha256_file(manifest_path(choice.prefix)),
        "tool_env_marker_sha256": None if choice.provisioned else _sha256_file(choice.prefix / TOOL_MARKER),
        "variables": {k: env[k] for k in KEY_VARIABLES if k in env},
        "check_set": sorted(check_set),
        "compile_as_caller": not choice.provisioned,
        "check_code_sha256": _code_sha(),
    }


def record_path(run_dir: Path) -> Path:
    return run_dir / RECORD_DIR / f"{socket.gethostname()}.json"


def reusable_passes(run_dir: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The record of an earlier pass under exactly `key` (same node, boot, env, checks), else None."""
    try:
        record = json.loads(record_path(run_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key or not key["boot_id"]:
        return None
    passed = record.get("passed")
    ok = isinstance(passed, list) and passed and all(isinstance(c, dict) and "name" in c for c in passed)
    return record if ok else None


def write_record(run_dir: Path, key: dict[str, Any], passed: list[dict[str, str]]) -> None:
    """passed: {name, status, message} of each reusable compile check that passed (PASS or WARN)."""
    from provision.atomic import write_json_atomic

    path = record_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"key": key, "passed": passed, "passed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def _fast_table(choice: EnvChoice, env: dict[str, str]) -> tuple[list[str], Any]:
    """The fast subset's row names (the check set of the key), and the full table."""
    from provision.check import TABLE
    from provision.check.context import Context

    ctx = Context(prefix=choice.prefix, worker=False, fast=True, caller_env=dict(env))
    return [spec.name for spec in TABLE if spec.only is None or spec.only(ctx)], TABLE


def _reuse(choice: EnvChoice, env: dict[str, str], run_dir: Path) -> tuple[dict, dict | None, list[str]]:
    """The key, a matching recorded pass (or None), and the notes that say it is reused."""
    from provision.check import WARN

    check_set, _ = _fast_table(choice, env)
    key = preflight_key(choice, env, check_set)
    record = reusable_passes(run_dir, key)
    if record is None:
        return key, None, []
    names = [c["name"] for c in record["passed"]]
    notes = [
        f"envcheck {', '.join(names)}: passed on this node (boot {key['boot_id'][:8]}) with this env at "
        f"{record.get('passed_at')} ({record_path(run_dir)}): not rerun"
    ]
    notes += [
        f"envcheck WARN {c['name']}: {c.get('message')} (recorded)"
        for c in record["passed"]
        if c.get("status") == WARN
    ]
    return key, record, notes


def _record_pass(run_dir: Path, key: dict, checks: list[Any]) -> list[str]:
    from provision.check import PASS, WARN

    passed = [
        {"name": c.name, "status": c.status, "message": c.message}
        for c in checks
        if c.name in REUSABLE_CHECKS and c.status in (PASS, WARN)
    ]
    if not passed:
        return []
    try:
        write_record(run_dir, key, passed)
    except OSError as exc:
        return [f"could not record the preflight pass in {record_path(run_dir)}: {exc}"]
    return []


def env_checks(choice: EnvChoice, env: dict[str, str], run_dir: Path | None = None) -> list[str]:
    """bin/envcheck's fast subset (compilers, caches, node): notes; PreflightError on a FAIL.
    With `run_dir`: the recorded-pass rule of the module docstring."""
    from provision.check import FAIL, SKIP, WARN, run_checks

    notes: list[str] = []
    kwargs: dict[str, Any] = {}
    key, record = None, None
    if run_dir is not None:
        key, record, notes = _reuse(choice, env, run_dir)
        if record is not None:
            _, table = _fast_table(choice, env)
            reused = {c["name"] for c in record["passed"]}
            kwargs["table"] = tuple(spec for spec in table if spec.name not in reused)
    report = run_checks(
        choice.prefix, worker=False, fast=True, env=env, compile_as_caller=not choice.provisioned, **kwargs
    )
    failures, not_applicable, skipped = [], [], []  # skipped: Check objects
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
    if run_dir is not None and key is not None and record is None and not failures:
        notes += _record_pass(run_dir, key, report.checks)
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


def sim_platform_check(cfg: RunConfig) -> None:
    """eval.sim: the launcher's evaluator needs the simulator env on this node (node 0): PreflightError on a
    platform its locks have no wheels for (trainer/sim/env.py check_platform), not an evaluation per step
    that fails to build it."""
    if cfg.eval.sim == "none":
        return
    from trainer.sim.env import SimEnvError, check_platform

    try:
        check_platform(
            cfg.eval.sim,
            "set eval.sim=none, and run bin/evaluate RUN_DIR --sim libero on such a node after the run",
        )
    except SimEnvError as exc:
        raise PreflightError(f"eval.sim={cfg.eval.sim}: {exc}") from None


def space_check(run_dir: Path, cfg: RunConfig, world_size: int) -> list[str]:
    """The run dir's filesystem must hold checkpoint.keep + 1 checkpoints (keep, plus the one being
    written), and one more when the best held-out checkpoint is pinned (checkpoint.best_by with
    validation, or by simulator success rate: pruning keeps it even when it is older than the newest keep),
    and one more with eval.sim (the checkpoint under evaluation is pinned while read), counting the space its
    existing checkpoints already take; PreflightError names both numbers.
    Returns notes (the estimate; a warning when checkpoint.skip_space_check overrides a refusal)."""
    from provision.nodeinfo import free_bytes, mount_of
    from trainer.checkpoint.diskspace import human
    from trainer.checkpoint.layout import scan
    from trainer.checkpoint.size import estimate_bytes, model_size

    one = estimate_bytes(cfg, model_size(cfg), world_size)
    pinned = cfg.checkpoint.validate and cfg.checkpoint.best_by != "none" and cfg.data.val_episodes != 0
    pinned = pinned or cfg.eval.best_by == "sim"
    simulated = cfg.eval.sim != "none"
    count = cfg.checkpoint.keep + 1 + int(pinned) + int(simulated)
    what = (
        f"checkpoint.keep + 1 = {cfg.checkpoint.keep + 1} checkpoints"
        + (
            (
                " and the best one by success rate"
                if cfg.eval.best_by == "sim"
                else " and the best held-out one"
            )
            if pinned
            else ""
        )
        + (" and the one under simulator evaluation" if simulated else "")
        + (f" ({count})" if count > cfg.checkpoint.keep + 1 else "")
    )
    complete, _ = scan(run_dir / "checkpoints")
    existing = sum(f.stat().st_size for c in complete for f in c.path.iterdir() if f.is_file())
    free = free_bytes(run_dir)
    needed = count * one - existing
    mount = mount_of(run_dir)
    where = f"{run_dir} ({mount.mount_point}, {mount.fstype})"
    note = (
        f"checkpoint size estimate {human(one)}; {what} need {human(count * one)}; "
        f"{where} has {human(free)} free" + (f" + {human(existing)} in its checkpoints" if existing else "")
    )
    if needed <= free:
        return [note]
    message = (
        f"{where} cannot hold {what} of ~{human(one)}: needs "
        f"{human(needed)} more, has {human(free)} free; fix: free space there, lower checkpoint.keep, "
        f"or move --run-dir (--set checkpoint.skip_space_check=true runs anyway)"
    )
    if cfg.checkpoint.skip_space_check:
        return [f"WARNING: {message} -- checkpoint.skip_space_check=true: running anyway"]
    raise PreflightError(message)


def plan_check(cfg: RunConfig, world_size: int, nnodes: int) -> list[str]:
    """The plan (trainer/plan/) for the GPU found here: notes; PreflightError when the traced peak does
    not fit (1 - plan.margin) of its memory (plan.allow_overfit=true: a warning instead)."""
    import torch

    from trainer.plan.report import preflight_plan

    notes, refusal = preflight_plan(cfg, world_size, nnodes, torch.cuda.get_device_name(0))
    if refusal:
        raise PreflightError(refusal)
    return notes
