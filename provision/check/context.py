"""The typed input of every envcheck check (`Context`) and its typed result (`Outcome`).

Contract: a check is `fn(ctx: Context) -> Outcome`. The context holds what the run was asked (prefix,
--worker, --fast, the caller's environment, the lock to compare with) and facts derived from it once,
on first use, by pure functions: the manifest, the lock (read by provision.lockfile, the one reader),
the job's environment (`JobEnv`: what a non-activated job, an activated shell or a worker sees), the
interpreter facts. No check sets state another check reads; what a check needs from another check's
result it declares as a prerequisite in the table (provision/check/table.py) and reads via `result()`.
One exception, on disk only: the run's compile scratch (`compile_scratch`: an empty TORCHINDUCTOR_CACHE_DIR
and TMPDIR made on first use, removed by `release_compile_scratch` when run_table returns). The Inductor
probe compiles into it, then CPU FlexAttention, which the table makes wait for that probe not to FAIL,
reuses its ISA probe and precompiled header; it holds nothing from outside this run, so it cannot stand
in for a missing compiler either. Every other probe's caches are its own (provision/probes/).
Every fix names a command a user can run as written (`provision_fix`, `relock_fix`, `package_fix`).
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from provision import nodeinfo, probes
from provision.check.report import FAIL, Check
from provision.envvars import EnvVarsError, job_environment, read_env_vars
from provision.lockfile import LockError, LockFile, read_lock
from provision.paths import RepoRootError, repo_root
from provision.prefix import DEFAULT_ENV_NAME, envs_dir, read_manifest

WORKER_PATH = "/usr/bin:/bin"  # what a batch job's non-login shell starts with
INTERPRETER_TIMEOUT_S = 300  # the env's python imports torch and triton: cold on a shared filesystem, minutes
# qemu-user runs an aarch64 program many times slower than a real core: in the emulated worker
# (--simulate-worker --platform linux-aarch64, which sets QEMU_CPU) a probe's limit is this many times
# its own. Measured (docs/platforms.md): inductor_cpp 87 s alone, 544 s beside a 2-core host's test
# suite (its limit: 900 s).
EMULATED_TIMEOUT_SCALE = 4


def compiler_package(platform: str, var: str) -> str:
    """conda-forge's package that provides `var` (CC/CXX) for `platform`: gcc_linux-aarch64, gxx_linux-64."""
    return f"{'gcc' if var == 'CC' else 'gxx'}_{platform}"


def sysroot_package(platform: str) -> str:
    """conda-forge's glibc sysroot for `platform`: sysroot_linux-64, sysroot_linux-aarch64."""
    return f"sysroot_{platform}"


@dataclass(frozen=True)
class Outcome:
    """What a check found: status, message, the fix (a runnable command on FAIL) and details."""

    status: str
    message: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobEnv:
    """The environment a job gets: `env` None when the env's variables file cannot be read."""

    env: dict[str, str] | None
    how: str
    activated: bool
    error: str = ""


def scrubbed_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What a non-activated, non-interactive job process starts with on a worker (not the login shell)."""
    try:
        user = env.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    scrubbed = {
        "PATH": WORKER_PATH,
        "HOME": env.get("HOME") or os.path.expanduser("~"),
        "USER": user,
        "LANG": env.get("LANG") or "C.UTF-8",
    }
    if env.get("QEMU_CPU"):  # the emulated worker's CPU (provision/emulation.py); read only by qemu-user
        scrubbed["QEMU_CPU"] = env["QEMU_CPU"]
    return scrubbed


def env_name_of(prefix: Path) -> str:
    """The env's name: the symlink's name (or, for a generation dir, the env it belongs to)."""
    match = re.fullmatch(r"\.(.+)\.gens", prefix.parent.name)
    return match.group(1) if match else prefix.name


def inside(path: str | None, prefix: Path) -> bool:
    if not path:
        return False
    root = os.path.realpath(prefix)
    return os.path.realpath(path) == root or os.path.realpath(path).startswith(root + os.sep)


def short_error(text: str, limit: int = 1500) -> str:
    """The error chain as the probe saw it, without Dynamo's boilerplate hints, each line once."""
    boilerplate = (
        "Set TORCHDYNAMO_VERBOSE",
        "You can suppress this exception",
        "    import torch._dynamo",
        "    torch._dynamo.config",
    )
    lines, seen = [], set()
    for line in text.splitlines():
        line = line.rstrip()
        if line and not line.startswith(boilerplate) and line not in seen:
            seen.add(line)
            lines.append(line)
    out = "\n".join(lines)
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _default_spec_name() -> str:
    try:
        import yaml

        name = yaml.safe_load((repo_root() / "environment.yml").read_text()).get("name")
        return str(name) if name else DEFAULT_ENV_NAME
    except (OSError, RepoRootError, ValueError, AttributeError):
        return DEFAULT_ENV_NAME


@dataclass
class Context:
    prefix: Path
    worker: bool
    fast: bool
    caller_env: dict[str, str]
    lockfile: Path | None = None
    mountinfo: str | None = None
    progress: Callable[[str], None] | None = None
    chosen_by: str = "given"
    compile_as_caller: bool = False
    results: dict[str, Check] = field(default_factory=dict)  # filled by the table runner, in order
    # slow checks running now (the table runner's threads): result() waits for one that is asked for
    running: dict[str, Future[Check]] = field(default_factory=dict)
    _interpreter_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _interpreter_memo: dict[str, probes.ProbeRun | None] = field(default_factory=dict, repr=False)
    _scratch_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _scratch: dict[str, str] = field(default_factory=dict, repr=False)  # "root" and the shared dirs

    @property
    def name(self) -> str:
        return env_name_of(self.prefix)

    def result(self, name: str) -> Check | None:
        """Check `name`'s outcome: waits while it is still running; None when it is not (yet) run."""
        running = self.running.get(name)
        if running is not None:
            return running.result()
        return self.results.get(name)

    # -- facts, each computed once -----------------------------------------------------------------
    @property
    def timeout_scale(self) -> int:
        """How many times its own limit a probe gets: EMULATED_TIMEOUT_SCALE under qemu-user, else 1."""
        return EMULATED_TIMEOUT_SCALE if self.caller_env.get("QEMU_CPU") else 1

    @cached_property
    def manifest(self) -> dict[str, Any]:
        try:
            return read_manifest(self.prefix)
        except (OSError, ValueError):
            return {}

    @property
    def platform(self) -> str:
        """The platform the env was provisioned for (its manifest), else this machine's."""
        from provision.lock import current_platform

        return str(self.manifest.get("platform") or current_platform())

    def compiler_package(self, var: str) -> str:
        return compiler_package(self.platform, var)

    @property
    def sysroot_package(self) -> str:
        return sysroot_package(self.platform)

    @cached_property
    def lock_path(self) -> Path:
        if self.lockfile is not None:
            return Path(self.lockfile)
        if self.manifest.get("lockfile"):
            return Path(self.manifest["lockfile"])
        try:
            return repo_root() / "conda-lock.yml"
        except RepoRootError:
            return Path("conda-lock.yml").absolute()

    @cached_property
    def lock(self) -> LockFile | str:
        """The lock, or why it cannot be read."""
        try:
            return read_lock(self.lock_path)
        except LockError as exc:
            return str(exc)

    def locked_versions(self) -> dict[tuple[str, str], str]:
        return self.lock.versions(self.platform) if isinstance(self.lock, LockFile) else {}

    @cached_property
    def job(self) -> JobEnv:
        caller = self.caller_env
        try:
            read_env_vars(self.prefix)
        except (OSError, EnvVarsError) as exc:
            if self.compile_as_caller and not self.worker:
                # A plain python environment (bin/train's tool-env fallback) promises no variables:
                # still compile for real, with the caller's environment.
                return JobEnv(dict(caller), "the caller's environment (no env variables)", False, str(exc))
            return JobEnv(None, "", False, str(exc))
        active = caller.get("CONDA_PREFIX")
        activated = (
            not self.worker
            and bool(active)
            and os.path.realpath(str(active)) == os.path.realpath(self.prefix)
        )
        if self.worker:
            how = f"a non-activated job on a worker (scrubbed base PATH={WORKER_PATH}, HOME, USER, LANG)"
            return JobEnv(job_environment(self.prefix, scrubbed_environment(caller)), how, False)
        if activated:
            return JobEnv(dict(caller), "this activated shell (values the activate.d hooks exported)", True)
        return JobEnv(
            job_environment(self.prefix, caller), "a non-activated job started from this shell", False
        )

    @property
    def job_env(self) -> dict[str, str]:
        return self.job.env or {}

    @cached_property
    def interpreter(self) -> dict[str, Any] | None:
        """The env's python's facts (versions, CUDA, NCCL), None when it has no python or it fails."""
        run = self.interpreter_run
        return run.result if run is not None and run.ok else None

    @property
    def interpreter_run(self) -> probes.ProbeRun | None:
        """The interpreter probe, run once even when two checks' threads ask at the same time."""
        with self._interpreter_lock:
            if "run" not in self._interpreter_memo:
                own = self.prefix / "bin" / "python"
                self._interpreter_memo["run"] = (
                    probes.run_probe(
                        "interpreter",
                        probes.script("interpreter"),
                        str(own),
                        self.job_env,
                        timeout=INTERPRETER_TIMEOUT_S * self.timeout_scale,
                        progress=self.progress,
                        activity="still starting",
                    )
                    if os.access(own, os.X_OK)
                    else None
                )
            return self._interpreter_memo["run"]

    # -- running probes ----------------------------------------------------------------------------
    def probe_python(self) -> tuple[str, str]:
        own = self.prefix / "bin" / "python"
        if os.access(own, os.X_OK):
            return str(own), "the env's python"
        return sys.executable, f"the tool python {sys.executable} (the env has no bin/python)"

    def probe(
        self, name: str, args: dict[str, Any], timeout: float, shared: dict[str, str] | None = None
    ) -> probes.ProbeRun:
        """Probe `name` in the job's environment; `shared`: the run's compile scratch (else its own).
        `timeout`: the limit on a real node (scaled by `timeout_scale`)."""
        python, _ = self.probe_python()
        return probes.run_probe(
            name,
            probes.script(name),
            python,
            self.job_env,
            args=args,
            timeout=timeout * self.timeout_scale,
            progress=self.progress,
            shared=shared,
        )

    def compile_scratch(self) -> dict[str, str]:
        """This run's TORCHINDUCTOR_CACHE_DIR and TMPDIR for `probe(shared=...)`: made empty on first use
        (under a fresh mkdtemp), the same dirs for every later caller until release_compile_scratch."""
        with self._scratch_lock:
            if not self._scratch:
                root = Path(tempfile.mkdtemp(prefix="envcheck-run-"))
                self._scratch.update(probes.shared_scratch(root), root=str(root))
            return {k: v for k, v in self._scratch.items() if k != "root"}

    def release_compile_scratch(self) -> None:
        """Remove the compile scratch (if one was made); a later compile_scratch makes a fresh one."""
        with self._scratch_lock:
            root = self._scratch.pop("root", None)
            self._scratch.clear()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def require_under(self) -> str | None:
        """Under --worker, compilers must resolve into the env."""
        return str(self.prefix) if self.worker else None

    # -- fixes: commands a user can run as written -------------------------------------------------
    @cached_property
    def spec_name(self) -> str:
        return str(self.manifest.get("env_name") or _default_spec_name())

    def _spec_flag(self) -> str:
        spec = self.manifest.get("spec")
        try:
            default = repo_root() / "environment.yml"
        except RepoRootError:
            default = None
        return f" -f {spec}" if spec and default is not None and Path(spec) != default else ""

    def provision_fix(self) -> str:
        name = self.spec_name
        made_by_other = (
            self.prefix.is_dir()
            and not self.prefix.is_symlink()
            and not self.manifest
            and any(self.prefix.iterdir())
        )
        if made_by_other:  # e.g. the tool venv: bin/provision never builds into a directory it did not make
            return (
                f"{self.prefix} is not a provisioned env: provision one (bin/provision {name}) and check "
                f"it (bin/envcheck --env {name})"
            )
        at = "" if self.prefix == envs_dir() / name else f" --prefix {self.prefix}"
        return f"provision the env: bin/provision {name}{self._spec_flag()}{at}"

    def relock_fix(self) -> str:
        return (
            f"relock: bin/provision {self.spec_name}{self._spec_flag()} --relock, then {self.provision_fix()}"
        )

    def package_fix(self, package: str) -> str:
        if nodeinfo.installed_package(self.prefix, package):
            return f"{package} is installed but broken or incomplete: {self.provision_fix()}"
        if ("conda", package) in self.locked_versions():
            lock = self.lock_path.name
            return f"the env lacks {package}, which {lock} locks: {self.provision_fix()}"
        return (
            f"the env lacks {package}: add it to environment.yml, relock (bin/provision {self.spec_name}"
            f"{self._spec_flag()} --relock), then {self.provision_fix()}"
        )


def fail_unexpected(exc: Exception) -> Outcome:
    """A bug or an unexpected node state must not hide the other checks."""
    return Outcome(
        FAIL,
        f"envcheck could not run this check: {type(exc).__name__}: {exc}",
        "an unexpected state of the env or node (message above); if it persists, report it with "
        "`bin/envcheck --json > report.json`",
    )
