"""Checks of the env itself: it exists, is complete, matches its lock, runs the locked versions, and
gives a job the variables it promises (CC/CXX into the env, the env's sysroot), and the `openssl`
command Inductor's CPU precompiled header runs, found on the job's PATH."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from provision.check.context import Context, Outcome, inside, short_error
from provision.check.report import FAIL, PASS, SKIP, WARN
from provision.envvars import EnvVarsError, env_vars_path, expand, read_env_vars
from provision.lockfile import LockFile
from provision.prefix import completeness


def check_prefix(ctx: Context) -> Outcome:
    real = os.path.realpath(ctx.prefix)
    where = f"{ctx.name} at {ctx.prefix}" + (f" -> {real}" if real != str(ctx.prefix) else "")
    if not ctx.prefix.is_dir():
        return Outcome(FAIL, f"{where}: no such env ({ctx.chosen_by})", ctx.provision_fix())
    return Outcome(PASS, f"{where} ({ctx.chosen_by})")


def check_complete(ctx: Context) -> Outcome:
    ok, reason = completeness(ctx.prefix)
    if not ok:
        return Outcome(FAIL, reason, ctx.provision_fix())
    m = ctx.manifest
    return Outcome(PASS, f"provisioned completely at {m.get('time', '?')} ({m.get('installer', '?')})")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_lock(ctx: Context) -> Outcome:
    lock = ctx.lock
    if not isinstance(lock, LockFile):
        return Outcome(FAIL, lock, f"point --lockfile at the env's conda-lock.yml, or {ctx.provision_fix()}")
    if not ctx.manifest:
        return Outcome(
            FAIL, "the env has no completion manifest to compare with the lock", ctx.provision_fix()
        )
    plat = ctx.platform
    want, have = lock.content_hash.get(plat), ctx.manifest.get("lock_content_hash")
    if want is None:
        return Outcome(FAIL, f"{lock.path} has no content_hash for {plat}", ctx.relock_fix())
    if have != want:
        return Outcome(
            FAIL,
            f"the env was provisioned from a lock with content hash {str(have)[:12]}..., {lock.path} has "
            f"{want[:12]}... (the spec changed and was relocked since)",
            ctx.provision_fix(),
        )
    sha = ctx.manifest.get("lock_sha256")
    if sha and sha != lock.sha256:
        return Outcome(
            FAIL,
            f"{lock.path} was relocked after this env was provisioned (same spec, new solve)",
            ctx.provision_fix(),
        )
    return Outcome(PASS, f"matches {lock.path} ({plat}, content hash {want[:12]}...)")


def _pairs(d: Mapping[str, object]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def _same_version(have: str, locked: str) -> bool:
    """PEP 440's `==`: a locked version without a local label matches the installed one with any
    (torch's aarch64 wheel from PyPI, locked as 2.13.0, says torch.__version__ == "2.13.0+cu130")."""
    from packaging.version import InvalidVersion, Version

    try:
        want, got = Version(locked), Version(have)
    except InvalidVersion:
        return have == locked
    return got == want or (want.local is None and got.public == want.public)


def check_versions(ctx: Context) -> Outcome:
    v = ctx.locked_versions()
    locked = {
        "python": v.get(("conda", "python")),
        "torch": v.get(("pip", "torch")) or v.get(("conda", "pytorch")),
        "triton": v.get(("pip", "triton")) or v.get(("conda", "triton")),
    }
    wanted = {k: val for k, val in locked.items() if val}
    own = ctx.prefix / "bin" / "python"
    run = ctx.interpreter_run
    if run is None:
        if wanted:
            return Outcome(
                FAIL, f"the env has no bin/python, but the lock has {_pairs(wanted)}", ctx.provision_fix()
            )
        return Outcome(
            SKIP, f"the lock has none of python, torch, triton and the env has no python ({ctx.lock_path})"
        )
    if run.timed_out:
        return Outcome(
            FAIL,
            f"{own} did not finish importing torch and triton in {run.seconds:.0f} s (its limit"
            f"{'' if ctx.timeout_scale == 1 else f', {ctx.timeout_scale}x under emulation'}): a job on this "
            f"node would stall as long before its first step",
            f"see what slows this node (top; a cold or overloaded filesystem under the env: time {own} -c "
            f"'import torch'), then rerun envcheck",
        )
    if not run.ok:
        return Outcome(FAIL, f"{own} failed to start: {short_error(run.failure_text())}", ctx.provision_fix())
    got = run.result
    if not wanted:
        have = {k: got.get(k) or "missing" for k in ("python", "torch", "triton")}
        return Outcome(SKIP, f"the lock has none of python, torch, triton; the env has {_pairs(have)}")
    wrong = []
    for name, version in wanted.items():
        found = got.get(name)
        if found is None or not _same_version(found, version):
            why = got.get(f"{name}_error", "")
            wrong.append(
                f"{name} {found or 'missing'} (locked {version}){': ' + short_error(why, 300) if why else ''}"
            )
    if wrong:
        return Outcome(FAIL, "not as locked: " + "; ".join(wrong), ctx.provision_fix(), {"interpreter": got})
    return Outcome(PASS, f"as locked: {_pairs({k: got[k] for k in wanted})}", "", {"interpreter": got})


def check_variables_file(ctx: Context) -> Outcome:
    job = ctx.job
    try:
        entries = read_env_vars(ctx.prefix)
    except (OSError, EnvVarsError) as exc:  # the message names the file
        return Outcome(FAIL, str(exc), ctx.provision_fix())
    env = job.env or {}
    # Every promised variable must hold what the env's file says, given what the job has above it.
    names = {e.name for e in entries}
    scope = {k: val for k, val in env.items() if k not in names}
    scope["CONDA_PREFIX"] = env.get("CONDA_PREFIX") or str(ctx.prefix)
    wrong = []
    for entry in entries:
        value, have = expand(entry.value, scope), env.get(entry.name)
        if entry.mode == "prepend":
            good = have is not None and (have == value or have.startswith(f"{value}:"))
        elif entry.mode == "default":  # the env's value, or the job's own non-empty one that stays
            good = bool(have)
        else:
            good = have == value
        if not good:
            wrong.append(f"{entry.name}={have!r}, the env says {entry.mode} {value!r}")
        scope[entry.name] = have if have is not None else value
    details = {"resolved": {e.name: env.get(e.name) for e in entries}, "as": job.how}
    if wrong:
        fix = (
            "re-activate the env (conda deactivate, then conda activate with it); "
            "something overrode the hooks"
            if job.activated
            else ctx.provision_fix()
        )
        return Outcome(FAIL, f"as seen by {job.how}: " + "; ".join(wrong), fix, details)
    listed = ", ".join(e.name for e in entries)
    return Outcome(
        PASS,
        f"{len(entries)} variables ({listed}) from {env_vars_path(ctx.prefix)} as seen by {job.how}",
        "",
        details,
    )


def check_compiler_var(ctx: Context, var: str) -> Outcome:
    env = ctx.job_env
    package = ctx.compiler_package(var)
    value = env.get(var)
    if not value:
        return Outcome(
            FAIL,
            f"{var} is not set for a job: the env's variables ({env_vars_path(ctx.prefix)}) define no {var} "
            f"because the env has no {package}",
            ctx.package_fix(package),
        )
    path = value if os.sep in value else shutil.which(value, path=env.get("PATH", ""))
    if not path or not os.path.exists(path):
        return Outcome(FAIL, f"{var}={value}: no such file", ctx.package_fix(package))
    if not os.access(path, os.X_OK):
        return Outcome(FAIL, f"{var}={value} is not executable", ctx.package_fix(package))
    real = os.path.realpath(path)
    if not inside(real, ctx.prefix):
        return Outcome(
            FAIL,
            f"{var}={value} resolves to {real}, outside the env: workers have no system compiler",
            ctx.package_fix(package),
        )
    return Outcome(PASS, f"{var}={value}" + (f" -> {real}" if real != value else ""))


def check_sysroot(ctx: Context) -> Outcome:
    """The env's compilers must link against the env's sysroot, not the node's libc dev files."""
    env, found, outside, missing = ctx.job_env, {}, [], []
    for var, name in (("CC", "crt1.o"), ("CC", "libc.so"), ("CXX", "libstdc++.so")):
        proc = subprocess.run(
            [env[var], f"-print-file-name={name}"], env=env, capture_output=True, text=True, timeout=60
        )
        path = proc.stdout.strip()
        found[name] = path
        if proc.returncode != 0 or not os.path.isabs(path) or not os.path.exists(path):
            missing.append(f"{name} ({env[var]} -print-file-name: {path or proc.stderr.strip()})")
        elif not inside(path, ctx.prefix):
            outside.append(f"{name} from {os.path.realpath(path)}")
    if missing or outside:
        what = "; ".join(
            [f"cannot find {m}" for m in missing] + [f"links {o}, outside the env" for o in outside]
        )
        return Outcome(
            FAIL,
            f"{what}: a worker has no such files",
            ctx.package_fix(ctx.sysroot_package),
            {"files": found},
        )
    return Outcome(PASS, "crt1.o, libc.so, libstdc++.so all from the env's sysroot", "", {"files": found})


def check_openssl(ctx: Context) -> Outcome:
    """TorchInductor's CPU precompiled header hashes its preprocessed header with `openssl sha512`
    (torch/_inductor/codecache.py, by name on PATH): a job without one fails with FileNotFoundError."""
    env = ctx.job_env
    found = shutil.which("openssl", path=env.get("PATH", ""))
    why = "TorchInductor's CPU precompiled header runs `openssl sha512`"
    if found is None:
        return Outcome(
            FAIL,
            f"no openssl on the job's PATH ({env.get('PATH', '')}): {why} and fails with FileNotFoundError",
            ctx.package_fix("openssl"),
        )
    real = os.path.realpath(found)
    with tempfile.NamedTemporaryFile("w", suffix=".h") as header:
        header.write("#include <vector>\n")
        header.flush()
        proc = subprocess.run(
            ["openssl", "sha512", header.name], env=env, capture_output=True, text=True, timeout=60
        )
    digest = proc.stdout.split()[-1] if proc.stdout.split() else ""
    if proc.returncode != 0 or not re.fullmatch(r"[0-9a-f]{128}", digest):
        return Outcome(
            FAIL,
            f"{found} sha512 failed (exit {proc.returncode}): {short_error(proc.stderr or proc.stdout)}",
            ctx.package_fix("openssl"),
            {"openssl": real},
        )
    if not inside(real, ctx.prefix) and not (ctx.compile_as_caller and ctx.job.how.startswith("the caller")):
        return Outcome(
            WARN,
            f"openssl is {real}, the system's: worker images may have none ({why})",
            ctx.package_fix("openssl"),
            {"openssl": real},
        )
    return Outcome(PASS, f"openssl sha512 works with {real} ({why})", "", {"openssl": real})
