"""bin/envcheck: prove an env on the node a job will run on, before a 24-hour job waits in the queue.

Every check is named and ends PASS, WARN, FAIL or SKIP (not applicable here, with the reason), with
its time and, on FAIL, the fix. The report is ok only when nothing FAILed.

With --worker the job's environment is what a non-activated, non-interactive process gets on a
worker: a scrubbed base (PATH=/usr/bin:/bin, HOME, USER, LANG) plus the env's variables from the one
file the hooks read (provision/envvars.py). A compile that works only because the login node has a
system gcc is then a FAIL: the worker has none. Compiles are real, each in a fresh process with empty
throwaway caches (provision/probes.py), so a warm cache cannot hide a missing compiler.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click
import yaml

from provision import nodeinfo, probes
from provision.atomic import write_atomic
from provision.envvars import EnvVarsError, env_vars_path, expand, job_environment, read_env_vars
from provision.prefix import completeness, envs_dir, read_manifest, resolve_prefix

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
STATUSES = (PASS, WARN, FAIL, SKIP)
REPORT_FORMAT = 1  # bump when the JSON report's shape changes (bin/train's preflight reads it)
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LOCKFILE = REPO_ROOT / "conda-lock.yml"
WORKER_PATH = "/usr/bin:/bin"  # what a batch job's non-login shell starts with
GIB = 1 << 30
MIN_FREE, LOW_FREE = 1 * GIB, 5 * GIB  # below MIN_FREE: FAIL; below LOW_FREE: WARN
NETWORK_FS_RACES = (
    "Triton's and Inductor's caches race on network filesystems (triton#11512, pytorch#173679): "
    "half-written kernels, lock timeouts, jobs hanging at their first compile"
)
NODE_LOCAL_FIX = (
    "use a node-local cache per job: bin/train points TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR at "
    "node-local disk ($SLURM_TMPDIR or /tmp) for each job; or set them to a local path yourself"
)
COMPILER_PACKAGES = {"CC": "gcc_linux-64", "CXX": "gxx_linux-64"}
_LOCK_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class Check:
    name: str
    status: str  # PASS | WARN | FAIL | SKIP
    seconds: float
    message: str
    fix: str = ""
    details: dict = field(default_factory=dict)


@dataclass
class Report:
    prefix: str
    env_name: str
    worker: bool
    fast: bool
    node: str
    started: str
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.status == FAIL]

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r} in the report (checks: {', '.join(c.name for c in self.checks)})")

    def to_dict(self) -> dict:
        out = {"format": REPORT_FORMAT, **asdict(self)}
        out["ok"] = self.ok
        out["failed"] = self.failed
        out["counts"] = {s: sum(c.status == s for c in self.checks) for s in (PASS, WARN, FAIL, SKIP)}
        out["summary"] = self._summary(out["counts"])
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def summary(self) -> str:
        return self._summary({s: sum(c.status == s for c in self.checks) for s in (PASS, WARN, FAIL, SKIP)})

    def _summary(self, counts_by_status: dict[str, int]) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in counts_by_status.items() if n)
        where = f"{self.env_name} ({self.prefix}) on {self.node}"
        if self.ok:
            return f"envcheck: OK: {where}: {counts} in {self.seconds:.1f} s"
        return f"envcheck: FAILED {', '.join(self.failed)}: {where}: {counts} in {self.seconds:.1f} s"

    def render(self) -> str:
        width = max((len(c.name) for c in self.checks), default=10)
        lines = [
            f"envcheck {self.env_name} ({self.prefix}){' --worker' if self.worker else ''}"
            f"{' --fast' if self.fast else ''} on {self.node}"
        ]
        for c in self.checks:
            body = c.message.replace("\n", "\n" + " " * (width + 15))
            lines.append(f"  {c.status:4}  {c.name:{width}}  {c.seconds:6.2f}s  {body}")
            if c.fix and c.status in (FAIL, WARN):
                lines.append(f"  {'':4}  {'':{width}}           fix: {c.fix}")
        lines.append(self.summary())
        return "\n".join(lines) + "\n"


def scrubbed_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What a non-activated, non-interactive job process starts with on a worker (not the login shell)."""
    try:
        user = env.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {
        "PATH": WORKER_PATH,
        "HOME": env.get("HOME") or os.path.expanduser("~"),
        "USER": user,
        "LANG": env.get("LANG") or "C.UTF-8",
    }


def env_name_of(prefix: Path) -> str:
    """The env's name: the symlink's name (or, for a generation dir, the env it belongs to)."""
    match = re.fullmatch(r"\.(.+)\.gens", prefix.parent.name)
    return match.group(1) if match else prefix.name


def _inside(path: str | None, prefix: Path) -> bool:
    if not path:
        return False
    root = os.path.realpath(prefix)
    return os.path.realpath(path) == root or os.path.realpath(path).startswith(root + os.sep)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _short_error(text: str, limit: int = 1500) -> str:
    """The error chain as the probe saw it, without Dynamo's boilerplate hints, each line once."""
    lines, seen = [], set()
    for line in text.splitlines():
        line = line.rstrip()
        if not line or line.startswith(
            (
                "Set TORCHDYNAMO_VERBOSE",
                "You can suppress this exception",
                "    import torch._dynamo",
                "    torch._dynamo.config",
            )
        ):
            continue
        if line not in seen:
            seen.add(line)
            lines.append(line)
    out = "\n".join(lines)
    return out if len(out) <= limit else out[: limit - 3] + "..."


@dataclass
class _Lock:
    path: Path
    content_hash: dict
    packages: dict  # (manager, name) -> version, for the platform
    error: str = ""


def _read_lock(path: Path, platform_name: str) -> _Lock:
    try:
        data = yaml.load(path.read_bytes(), Loader=_LOCK_LOADER)
        meta = data["metadata"]
        packages = {
            (p["manager"], p["name"]): str(p["version"])
            for p in data.get("package") or []
            if p.get("platform") == platform_name
        }
        return _Lock(path, dict(meta.get("content_hash") or {}), packages)
    except FileNotFoundError:
        return _Lock(path, {}, {}, f"{path} does not exist")
    except (yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        return _Lock(
            path, {}, {}, f"{path} is not a readable conda-lock v1 file ({type(exc).__name__}: {exc})"
        )


class _Checker:
    def __init__(
        self,
        prefix: Path,
        *,
        worker: bool,
        fast: bool,
        env: Mapping[str, str],
        lockfile: Path | None,
        mountinfo: str | None,
        progress: Callable[[str], None] | None,
        chosen_by: str,
        compile_as_caller: bool = False,
    ):
        self.prefix = prefix
        self.name = env_name_of(prefix)
        self.worker, self.fast, self.caller_env = worker, fast, dict(env)
        self.mountinfo = mountinfo
        self.progress = progress
        self.chosen_by = chosen_by
        self.compile_as_caller = compile_as_caller
        self.manifest: dict = {}
        self.lockfile = lockfile
        self.lock: _Lock | None = None
        self.job_env: dict[str, str] | None = None
        self.activated = False
        self.interpreter: dict | None = None
        self.var_status: dict[str, Check] = {}
        self.report = Report(
            str(prefix), self.name, worker, fast, socket.gethostname(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
        )

    # -- plumbing --------------------------------------------------------------------------------
    def run(self, name: str, fn: Callable[[], tuple], slow: str = "") -> Check:
        if slow and self.progress:
            self.progress(f"{name}: {slow} ...")
        start = time.perf_counter()
        try:
            status, message, fix, *rest = fn()
        except Exception as exc:  # a bug or an unexpected node state must not hide the other checks
            status, message, rest = (
                FAIL,
                f"envcheck could not run this check: {type(exc).__name__}: {exc}",
                [],
            )
            fix = "an unexpected state of the env or node (message above); if it persists, report it with --json"
        check = Check(
            name, status, round(time.perf_counter() - start, 3), message, fix, rest[0] if rest else {}
        )
        self.report.checks.append(check)
        if slow and self.progress:
            self.progress(f"{name}: {status} in {check.seconds:.1f} s")
        return check

    def skip(self, name: str, reason: str) -> Check:
        check = Check(name, SKIP, 0.0, reason)
        self.report.checks.append(check)
        return check

    def provision_fix(self) -> str:
        under_default = self.prefix.parent == envs_dir()
        return f"provision the env: bin/provision {self.name}" + (
            "" if under_default else f" --prefix {self.prefix}"
        )

    def package_fix(self, package: str) -> str:
        if nodeinfo.installed_package(self.prefix, package):
            return f"{package} is installed but broken or incomplete: {self.provision_fix()}"
        if self.lock is not None and ("conda", package) in self.lock.packages:
            return f"the env lacks {package}, which {self.lock.path.name} locks: {self.provision_fix()}"
        return (
            f"the env lacks {package}: add it to environment.yml, relock (bin/provision {self.name} "
            f"--relock), provision (bin/provision {self.name})"
        )

    def probe_python(self) -> tuple[str, str]:
        own = self.prefix / "bin" / "python"
        if os.access(own, os.X_OK):
            return str(own), "the env's python"
        return sys.executable, f"the tool python {sys.executable} (the env has no bin/python)"

    def probe(self, name: str, script: str, args: dict, timeout: float) -> probes.ProbeRun:
        python, _ = self.probe_python()
        return probes.run_probe(
            name, script, python, self.job_env or {}, args=args, timeout=timeout, progress=self.progress
        )

    # -- the env ---------------------------------------------------------------------------------
    def check_prefix(self) -> tuple:
        real = os.path.realpath(self.prefix)
        where = f"{self.name} at {self.prefix}" + (f" -> {real}" if real != str(self.prefix) else "")
        if not self.prefix.is_dir():
            return FAIL, f"{where}: no such env ({self.chosen_by})", self.provision_fix()
        return PASS, f"{where} ({self.chosen_by})", ""

    def check_complete(self) -> tuple:
        ok, reason = completeness(self.prefix)
        if not ok:
            return FAIL, reason, self.provision_fix()
        self.manifest = read_manifest(self.prefix)
        return (
            PASS,
            f"provisioned completely at {self.manifest.get('time', '?')} ({self.manifest.get('installer', '?')})",
            "",
        )

    def load_lock(self) -> None:
        path = self.lockfile or Path(self.manifest.get("lockfile") or DEFAULT_LOCKFILE)
        self.lock = _read_lock(Path(path), self.manifest.get("platform") or "linux-64")

    def check_lock(self) -> tuple:
        lock = self.lock
        if lock.error:
            return (
                FAIL,
                lock.error,
                f"point --lockfile at the env's conda-lock.yml, or {self.provision_fix()}",
            )
        if not self.manifest:
            return FAIL, "the env has no completion manifest to compare with the lock", self.provision_fix()
        plat = self.manifest.get("platform") or "linux-64"
        want, have = lock.content_hash.get(plat), self.manifest.get("lock_content_hash")
        if want is None:
            return (
                FAIL,
                f"{lock.path} has no content_hash for {plat}",
                f"relock: bin/provision {self.name} --relock",
            )
        if have != want:
            return (
                FAIL,
                (
                    f"the env was provisioned from a lock with content hash {str(have)[:12]}..., "
                    f"{lock.path} has {want[:12]}... (the spec changed and was relocked since)"
                ),
                self.provision_fix(),
            )
        sha = self.manifest.get("lock_sha256")
        if sha and sha != _sha256(lock.path):
            return (
                FAIL,
                f"{lock.path} was relocked after this env was provisioned (same spec, new solve)",
                self.provision_fix(),
            )
        return PASS, f"matches {lock.path} ({plat}, content hash {want[:12]}...)", ""

    def check_versions(self) -> tuple:
        locked = {
            "python": self.lock.packages.get(("conda", "python")),
            "torch": self.lock.packages.get(("pip", "torch")) or self.lock.packages.get(("conda", "pytorch")),
            "triton": self.lock.packages.get(("pip", "triton"))
            or self.lock.packages.get(("conda", "triton")),
        }
        wanted = {k: v for k, v in locked.items() if v}
        own = self.prefix / "bin" / "python"
        if not os.access(own, os.X_OK):
            if wanted:
                return (
                    FAIL,
                    f"the env has no bin/python, but the lock has {_pairs(wanted)}",
                    self.provision_fix(),
                )
            return (
                SKIP,
                f"the lock has none of python, torch, triton and the env has no python ({self.lock.path})",
                "",
            )
        run = probes.run_probe("interpreter", probes.INTERPRETER, str(own), self.job_env or {}, timeout=120)
        if not run.ok:
            return FAIL, f"{own} failed to start: {_short_error(run.failure_text())}", self.provision_fix()
        self.interpreter = run.result
        if not wanted:
            return (
                SKIP,
                f"the lock has none of python, torch, triton; the env has {_pairs(_versions(run.result))}",
                "",
            )
        wrong = []
        for name, version in wanted.items():
            have = run.result.get(name)
            if have is None or not _same_version(have, version):
                why = run.result.get(f"{name}_error", "")
                wrong.append(
                    f"{name} {have or 'missing'} (locked {version}){': ' + _short_error(why, 300) if why else ''}"
                )
        if wrong:
            return (
                FAIL,
                "not as locked: " + "; ".join(wrong),
                self.provision_fix(),
                {"interpreter": run.result},
            )
        return (
            PASS,
            f"as locked: {_pairs({k: run.result[k] for k in wanted})}",
            "",
            {"interpreter": run.result},
        )

    # -- variables -------------------------------------------------------------------------------
    def check_variables_file(self) -> tuple:
        try:
            entries = read_env_vars(self.prefix)
        except (OSError, EnvVarsError) as exc:  # the message names the file
            return FAIL, str(exc), self.provision_fix()
        caller = self.caller_env
        active = caller.get("CONDA_PREFIX")
        self.activated = (
            not self.worker and bool(active) and os.path.realpath(active) == os.path.realpath(self.prefix)
        )
        if self.worker:
            self.job_env = job_environment(self.prefix, scrubbed_environment(caller))
            how = f"a non-activated job on a worker (scrubbed base PATH={WORKER_PATH}, HOME, USER, LANG)"
        elif self.activated:
            self.job_env = dict(caller)
            how = "this activated shell (values the activate.d hooks exported)"
        else:
            self.job_env = job_environment(self.prefix, caller)
            how = "a non-activated job started from this shell"
        # Every promised variable must hold what the env's file says, given what the job has above it.
        names = {e.name for e in entries}
        scope = {k: v for k, v in self.job_env.items() if k not in names}
        scope["CONDA_PREFIX"] = self.job_env.get("CONDA_PREFIX") or str(self.prefix)
        wrong = []
        for entry in entries:
            value, have = expand(entry.value, scope), self.job_env.get(entry.name)
            good = have is not None and (
                have.split(":")[0] == value if entry.mode == "prepend" else have == value
            )
            if not good:
                wrong.append(f"{entry.name}={have!r}, the env says {entry.mode} {value!r}")
            scope[entry.name] = have if have is not None else value
        details = {"resolved": {e.name: self.job_env.get(e.name) for e in entries}, "as": how}
        if wrong:
            fix = (
                "re-activate the env (conda deactivate; conda activate ...); something overrode the hooks"
                if self.activated
                else self.provision_fix()
            )
            return FAIL, f"as seen by {how}: " + "; ".join(wrong), fix, details
        listed = ", ".join(e.name for e in entries)
        return (
            PASS,
            f"{len(entries)} variables ({listed}) from {env_vars_path(self.prefix)} as seen by {how}",
            "",
            details,
        )

    def check_compiler_var(self, var: str) -> tuple:
        env = self.job_env
        package = COMPILER_PACKAGES[var]
        value = env.get(var)
        if not value:
            return (
                FAIL,
                (
                    f"{var} is not set for a job: the env's variables ({env_vars_path(self.prefix)}) "
                    f"define no {var} because the env has no {package}"
                ),
                self.package_fix(package),
            )
        path = value if os.sep in value else shutil.which(value, path=env.get("PATH", ""))
        if not path or not os.path.exists(path):
            return FAIL, f"{var}={value}: no such file", self.package_fix(package)
        if not os.access(path, os.X_OK):
            return FAIL, f"{var}={value} is not executable", self.package_fix(package)
        real = os.path.realpath(path)
        if not _inside(real, self.prefix):
            return (
                FAIL,
                (f"{var}={value} resolves to {real}, outside the env: workers have no system compiler"),
                self.package_fix(package),
            )
        return PASS, f"{var}={value}" + (f" -> {real}" if real != value else ""), ""

    def check_sysroot(self) -> tuple:
        """The env's compilers must link against the env's sysroot, not the node's libc dev files."""
        env, found, outside, missing = self.job_env, {}, [], []
        for var, name in (("CC", "crt1.o"), ("CC", "libc.so"), ("CXX", "libstdc++.so")):
            proc = subprocess.run(
                [env[var], f"-print-file-name={name}"], env=env, capture_output=True, text=True, timeout=60
            )
            path = proc.stdout.strip()
            found[name] = path
            if proc.returncode != 0 or not os.path.isabs(path) or not os.path.exists(path):
                missing.append(f"{name} ({env[var]} -print-file-name: {path or proc.stderr.strip()})")
            elif not _inside(path, self.prefix):
                outside.append(f"{name} from {os.path.realpath(path)}")
        if missing or outside:
            what = "; ".join(
                [f"cannot find {m}" for m in missing] + [f"links {o}, outside the env" for o in outside]
            )
            return (
                FAIL,
                f"{what}: a worker has no such files",
                self.package_fix("sysroot_linux-64"),
                {"files": found},
            )
        return PASS, "crt1.o, libc.so, libstdc++.so all from the env's sysroot", "", {"files": found}

    # -- compiles --------------------------------------------------------------------------------
    def _compile_verdict(self, run: probes.ProbeRun, var: str, what: str, passed: str) -> tuple:
        result = run.result
        details = {k: v for k, v in result.items() if k != "ok"}
        details["python"] = self.probe_python()[1]
        compiler, real = result.get("compiler"), result.get("compiler_path")
        var_check = self.var_status.get(var)
        var_fix = var_check.fix if var_check is not None and var_check.status == FAIL else ""
        if result.get("stage") == "locate":
            return (
                FAIL,
                (
                    f"{what} would use {compiler} ({real}), which is not in the env: it passes here only "
                    f"thanks to the system compiler, and a worker has none"
                ),
                var_fix or self.package_fix(COMPILER_PACKAGES[var]),
                details,
            )
        if not run.ok:
            error = _short_error(run.failure_text())
            details["error"] = run.failure_text()
            fix = var_fix or (
                f"{var}={compiler} cannot do this (error above): {self.provision_fix()}"
                if compiler
                else self.provision_fix()
            )
            return FAIL, f"{what} failed in the job's environment:\n{error}", fix, details
        if compiler and not _inside(real, self.prefix):
            return (
                WARN,
                (f"{passed}, but with {real}, a system compiler: a worker has none (run with --worker)"),
                var_fix or self.package_fix(COMPILER_PACKAGES[var]),
                details,
            )
        return PASS, passed, "", details

    def check_triton_build(self) -> tuple:
        args = {"nonce": probes.nonce(), "require_under": str(self.prefix) if self.worker else None}
        run = self.probe("triton_build", probes.TRITON_BUILD, args, timeout=180)
        passed = (
            f"triton.runtime.build compiled and imported a C extension with "
            f"{run.result.get('compiler')} in {run.result.get('compile_s', 0):.1f} s"
        )
        return self._compile_verdict(run, "CC", "Triton's C build (triton.runtime.build)", passed)

    def check_inductor(self) -> tuple:
        args = {"fast": self.fast, "require_under": str(self.prefix) if self.worker else None}
        run = self.probe("inductor_cpp", probes.INDUCTOR_CPP, args, timeout=900)
        r = run.result
        passed = (
            f"Inductor compiled a CPU kernel with {r.get('compiler')} in {r.get('compile_s', 0):.1f} s, "
            f"OpenMP parallel region in {r.get('kernels_with_openmp')} kernel(s), max error "
            f"{r.get('max_abs_error', float('nan')):.1e}{' (scalar code: --fast)' if self.fast else ''}"
        )
        if run.returncode == 0 and r.get("stage") == "done" and not r.get("ok"):
            r["error"] = (
                f"the compiled kernel is wrong or not parallel: max error {r.get('max_abs_error')}, "
                f"omp pragma {r.get('omp_pragma')}, kernels calling OpenMP {r.get('kernels_with_openmp')}"
            )
        return self._compile_verdict(run, "CXX", "TorchInductor's C++ build", passed)

    def check_flex(self) -> tuple:
        gpu = bool(self.interpreter and self.interpreter.get("cuda_available"))
        args = {"gpu": gpu, "require_under": str(self.prefix) if self.worker and not gpu else None}
        run = self.probe("flex_attention", probes.FLEX_ATTENTION, args, timeout=1200)
        r = run.result
        if run.returncode == 0 and r.get("stage") == "done" and not r.get("ok"):
            r["error"] = (
                f"FlexAttention disagrees with SDPA: forward max error {r.get('forward_max_abs_error')}"
                f", backward {r.get('backward_max_abs_error', 'n/a')}"
            )
        passed = (
            f"compiled FlexAttention ({r.get('device')}, {r.get('tokens')} tokens, LingBot block mask "
            f"{100 * r.get('masked_share', 0):.0f}% masked) in {r.get('compile_s', 0):.1f} s; vs SDPA: "
            f"forward max error {r.get('forward_max_abs_error', float('nan')):.1e}"
            + (
                f", backward {r['backward_max_abs_error']:.1e}"
                if "backward_max_abs_error" in r
                else " (forward only: FlexAttention has no CPU backward)"
            )
        )
        return self._compile_verdict(run, "CC" if gpu else "CXX", "FlexAttention under torch.compile", passed)

    # -- caches and filesystems ------------------------------------------------------------------
    def triton_cache_dir(self) -> tuple[str, bool]:
        value = (self.job_env or {}).get("TRITON_CACHE_DIR")
        if value:
            return value, True
        home = (self.job_env or {}).get("HOME") or os.path.expanduser("~")
        return os.path.join(home, ".triton", "cache"), False

    def inductor_cache_dir(self) -> str:
        env = self.job_env or {}
        if env.get("TORCHINDUCTOR_CACHE_DIR"):
            return env["TORCHINDUCTOR_CACHE_DIR"]
        user = env.get("USER") or getpass.getuser()
        return os.path.join(env.get("TMPDIR") or "/tmp", f"torchinductor_{user}")

    def check_triton_cache(self) -> tuple:
        path, is_set = self.triton_cache_dir()
        note = (
            ""
            if is_set
            else " (TRITON_CACHE_DIR is unset: Triton's default, shared by every env and GPU kind)"
        )
        target = Path(path)
        base = nodeinfo.existing_ancestor(target)
        if base != target and not base.is_dir():
            return FAIL, f"{path}: {base} is not a directory", "set TRITON_CACHE_DIR to a writable directory"
        try:
            fd, probe_file = tempfile.mkstemp(prefix=".envcheck-", dir=base)
            os.write(fd, b"envcheck\n")
            os.fsync(fd)
            os.close(fd)
            os.unlink(probe_file)
        except OSError as exc:
            return (
                FAIL,
                f"{path} is not writable: {exc}{note}",
                "make it writable or point TRITON_CACHE_DIR elsewhere",
            )
        free = nodeinfo.free_bytes(base)
        state = "exists" if base == target else f"does not exist yet; Triton creates it under {base}"
        message = f"{path} {state}, writable, {_gib(free)} free{note}"
        if free < MIN_FREE:
            return FAIL, message, f"free space on {base} or point TRITON_CACHE_DIR elsewhere"
        if free < LOW_FREE or not is_set:
            return (
                WARN,
                message,
                (
                    "free space there"
                    if is_set
                    else "provision the env from a spec that sets TRITON_CACHE_DIR (environment.yml variables:)"
                ),
            )
        return PASS, message, ""

    def check_cache_fs(self, label: str, path: str) -> tuple:
        return cache_filesystem_verdict(label, path, self.mountinfo)

    # -- GPU -------------------------------------------------------------------------------------
    def gpu_absent_reason(self) -> str:
        if nodeinfo.nvidia_device_nodes() or nodeinfo.cuda_driver_version() is not None:
            return ""
        return "CPU-only node: no /dev/nvidia[0-9]* and no loadable libcuda.so.1"

    def gpu_interpreter(self) -> dict | None:
        if self.interpreter is None and os.access(self.prefix / "bin" / "python", os.X_OK):
            run = probes.run_probe(
                "interpreter",
                probes.INTERPRETER,
                str(self.prefix / "bin" / "python"),
                self.job_env or {},
                timeout=120,
            )
            self.interpreter = run.result if run.ok else None
        return self.interpreter

    def check_cuda(self) -> tuple:
        info = self.gpu_interpreter()
        if info is None:
            return (
                FAIL,
                "the env's python cannot report torch's CUDA state (no python or torch)",
                self.provision_fix(),
            )
        if not info.get("torch_cuda"):
            return FAIL, f"torch {info.get('torch')} is a CPU build on a GPU node", self.provision_fix()
        if not info.get("cuda_available"):
            return (
                FAIL,
                f"torch {info.get('torch')} sees no GPU: {info.get('cuda_error', 'cuda unavailable')}",
                "check CUDA_VISIBLE_DEVICES and the job's GPU allocation (--gres/--gpus)",
            )
        devices = info.get("cuda_devices") or []
        return (
            PASS,
            f"{len(devices)} GPU(s) visible: {', '.join(devices)} (torch {info['torch']}, CUDA {info['torch_cuda']})",
            "",
        )

    def check_driver(self) -> tuple:
        driver = nodeinfo.cuda_driver_version()
        info = self.gpu_interpreter() or {}
        need = info.get("torch_cuda")
        if driver is None:
            return (
                FAIL,
                "libcuda.so.1 cannot be loaded: no NVIDIA driver usable here",
                "run on a node with the NVIDIA driver",
            )
        have = (driver // 1000, driver % 1000 // 10)
        if not need:
            return (
                FAIL,
                f"driver supports CUDA {have[0]}.{have[1]}; torch is not a CUDA build",
                self.provision_fix(),
            )
        want = nodeinfo.parse_version(need)[:2]
        text = f"the driver supports CUDA {have[0]}.{have[1]}, torch {info.get('torch')} is built for CUDA {need}"
        if have >= want:
            return PASS, text, ""
        fix = f"run on nodes whose driver supports CUDA {need} (CUDA 13 needs driver >= 580, 12.x >= 525), or lock a torch for CUDA {have[0]}.{have[1]}"
        if have[0] == want[0]:
            return WARN, text + " (minor-version compatibility: PTX JIT of newer kernels may fail)", fix
        return FAIL, text, fix

    def check_nccl(self) -> tuple:
        info = self.gpu_interpreter() or {}
        if info.get("nccl"):
            return PASS, f"NCCL {info['nccl']} loads", ""
        return (
            FAIL,
            f"NCCL does not load: {info.get('nccl_error', 'torch has no NCCL')}",
            self.provision_fix(),
        )

    def check_gpu_kind(self) -> tuple:
        info = self.gpu_interpreter() or {}
        expected = nodeinfo.gpu_kind((self.job_env or {}).get("LINGBOT_GPU_KIND", "")) or nodeinfo.gpu_kind(
            self.name
        )
        kinds = {nodeinfo.gpu_kind(d) for d in info.get("cuda_devices") or []}
        if not kinds:
            return FAIL, "no GPU name to compare", "see gpu.cuda"
        if expected is None:
            return (
                WARN,
                f"node has {', '.join(sorted(map(str, kinds)))}; the env names no GPU kind",
                "set LINGBOT_GPU_KIND in environment.yml variables:",
            )
        if kinds != {expected}:
            return (
                FAIL,
                (
                    f"the env {self.name} is for {expected}, the node has {', '.join(sorted(map(str, kinds)))}: "
                    f"kernels and caches are per GPU kind"
                ),
                f"use the env for this GPU kind (e.g. lingbot-{sorted(map(str, kinds))[0]})",
            )
        return PASS, f"node GPUs are {expected}, as the env expects", ""

    # -- node ------------------------------------------------------------------------------------
    def check_glibc(self) -> tuple:
        node, sysroot = nodeinfo.node_glibc(), nodeinfo.sysroot_glibc(self.prefix)
        if sysroot is None:
            return (
                FAIL,
                "the env has no sysroot_linux-64: nothing fixes the glibc its builds target",
                self.package_fix("sysroot_linux-64"),
            )
        if node is None:
            return (
                FAIL,
                "this node runs no glibc (musl?); the env's binaries need glibc",
                "run on a glibc node",
            )
        text = f"node glibc {node}, the env's sysroot targets {sysroot}"
        if nodeinfo.parse_version(node) < nodeinfo.parse_version(sysroot):
            return (
                FAIL,
                text + ": code built in the env will not load here",
                f"lock an older sysroot_linux-64 (<= {node}) in environment.yml, relock, provision",
            )
        return PASS, text, ""

    def check_disk(self) -> tuple:
        places = {
            "prefix": str(self.prefix),
            "TRITON_CACHE_DIR": self.triton_cache_dir()[0],
            "Inductor cache": self.inductor_cache_dir(),
            "TMPDIR": (self.job_env or {}).get("TMPDIR") or "/tmp",
        }
        free = {label: nodeinfo.free_bytes(path) for label, path in places.items()}
        text = ", ".join(f"{label} {places[label]}: {_gib(n)}" for label, n in free.items())
        low = [label for label, n in free.items() if n < MIN_FREE]
        if low:
            return (
                FAIL,
                f"under {_gib(MIN_FREE)} free: {text}",
                f"free disk space for {', '.join(low)}",
                {"free_bytes": free},
            )
        if any(n < LOW_FREE for n in free.values()):
            return WARN, f"low on space: {text}", "free disk space", {"free_bytes": free}
        return PASS, text, "", {"free_bytes": free}

    # -- the sequence ----------------------------------------------------------------------------
    def run_all(self) -> Report:
        started = time.perf_counter()
        if self.run("env.prefix", self.check_prefix).status == FAIL:  # nothing else can be checked
            self.report.seconds = round(time.perf_counter() - started, 3)
            return self.report
        self.run("env.complete", self.check_complete)
        if not self.manifest:
            try:
                self.manifest = read_manifest(self.prefix)
            except (OSError, ValueError):
                self.manifest = {}
        self.load_lock()
        self.run("env.lock", self.check_lock)
        vars_ok = (
            self.run("variables.file", self.check_variables_file).status != FAIL or self.job_env is not None
        )
        if not vars_ok and self.compile_as_caller and not self.worker:
            # A plain python environment (bin/train's tool-env fallback) promises no variables: still
            # compile for real, with the caller's environment, so a missing compiler shows up here.
            self.job_env, vars_ok = dict(self.caller_env), True
        if not vars_ok:
            for name in ("variables.CC", "variables.CXX", "toolchain.sysroot", "compile.*"):
                self.skip(name, "not run: the env's variables cannot be read (see variables.file)")
        else:
            if not self.fast:
                self.run("env.versions", self.check_versions, slow="starting the env's python")
            for var in ("CC", "CXX"):
                self.var_status[var] = self.run(f"variables.{var}", lambda v=var: self.check_compiler_var(v))
            if all(c.status == PASS for c in self.var_status.values()):
                self.run("toolchain.sysroot", self.check_sysroot)
            else:
                self.skip("toolchain.sysroot", "not run: CC/CXX do not resolve into the env")
            self.run("compile.triton_build", self.check_triton_build, slow="Triton C build (~1 s)")
            self.run(
                "compile.inductor_cpp",
                self.check_inductor,
                slow="TorchInductor CPU kernel with CXX + OpenMP (10-30 s cold)",
            )
            if not self.fast:
                # On CPU FlexAttention compiles through Inductor's C++ path, on a GPU through Triton.
                gpu = bool(self.interpreter and self.interpreter.get("cuda_available"))
                needs = "compile.triton_build" if gpu else "compile.inductor_cpp"
                if self.report.check(needs).status == FAIL:
                    self.skip(
                        "compile.flex_attention", f"not run: it needs the compiler {needs} found broken"
                    )
                else:
                    self.run(
                        "compile.flex_attention",
                        self.check_flex,
                        slow="FlexAttention vs SDPA under torch.compile (20-60 s cold)",
                    )
        self.run("cache.triton_dir", self.check_triton_cache)
        self.run(
            "fs.triton_cache", lambda: self.check_cache_fs("TRITON_CACHE_DIR", self.triton_cache_dir()[0])
        )
        self.run(
            "fs.inductor_cache", lambda: self.check_cache_fs("Inductor's cache", self.inductor_cache_dir())
        )
        if not self.fast:
            reason = self.gpu_absent_reason()
            for name, fn in (
                ("gpu.cuda", self.check_cuda),
                ("gpu.driver", self.check_driver),
                ("gpu.nccl", self.check_nccl),
                ("gpu.kind", self.check_gpu_kind),
            ):
                if reason:
                    self.skip(name, reason)
                else:
                    self.run(name, fn)
        self.run("node.glibc", self.check_glibc)
        self.run("node.disk", self.check_disk)
        self.report.seconds = round(time.perf_counter() - started, 3)
        return self.report


def cache_filesystem_verdict(label: str, path: str, mountinfo: str | os.PathLike[str] | None = None) -> tuple:
    """(status, message, fix, details) for a compile cache at `path`: WARN on a network filesystem.
    Also used by bin/train to decide on a node-local cache."""
    try:
        mount = nodeinfo.mount_of(path, mountinfo)
    except (OSError, ValueError) as exc:
        return (
            WARN,
            f"cannot tell which filesystem holds {label} {path}: {exc}",
            "check by hand that it is on node-local disk (df -T PATH)",
            {"path": path},
        )
    details = {"path": path, "mount_point": mount.mount_point, "fstype": mount.fstype, "source": mount.source}
    if nodeinfo.is_network_fs(mount.fstype):
        return (
            WARN,
            (
                f"{label} {path} is on {mount.fstype} ({mount.source} at {mount.mount_point}): "
                f"{NETWORK_FS_RACES}"
            ),
            NODE_LOCAL_FIX,
            details,
        )
    return PASS, f"{label} {path} is on {mount.fstype} (local, mounted at {mount.mount_point})", "", details


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pairs(d: Mapping[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def _versions(result: dict) -> dict:
    return {k: result.get(k) or "missing" for k in ("python", "torch", "triton")}


def _same_version(have: str, locked: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(have) == Version(locked)
    except InvalidVersion:
        return have == locked


def run_checks(
    prefix: Path,
    *,
    worker: bool,
    fast: bool = False,
    env: Mapping[str, str] | None = None,
    lockfile: Path | None = None,
    mountinfo: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    chosen_by: str = "given",
    compile_as_caller: bool = False,
) -> Report:
    """Check the env at `prefix` as a job on this node would use it; see the module docstring.

    `env` is the caller's environment (default os.environ); `fast` is bin/train's preflight subset
    (variables, the Triton C build and one small Inductor kernel, caches, filesystems, node);
    `mountinfo` replaces /proc/self/mountinfo (tests); `progress` receives lines for the slow checks;
    `compile_as_caller`: for a prefix that is no provisioned env (bin/train's tool-env fallback), run the
    compile checks with the caller's environment instead of skipping them (never under --worker)."""
    checker = _Checker(
        Path(prefix),
        worker=worker,
        fast=fast,
        env=os.environ if env is None else env,
        lockfile=Path(lockfile) if lockfile else None,
        mountinfo=os.fspath(mountinfo) if mountinfo is not None else None,
        progress=progress,
        chosen_by=chosen_by,
        compile_as_caller=compile_as_caller,
    )
    return checker.run_all()


# --- command line ---------------------------------------------------------------------------------


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def _simulate(params: dict) -> int:
    from provision import worker_sim

    ok, reason = worker_sim.available()
    if not ok:
        click.echo(
            f"envcheck: --simulate-worker: {reason}. Run `bin/envcheck --worker` on a worker instead "
            f"(e.g. srun -N1 bin/envcheck --worker).",
            err=True,
        )
        return 2
    sim = worker_sim.WorkerSimulation()
    argv = [sys.executable, "-m", "provision.check", "--worker"]
    for flag in ("fast",):
        if params[flag]:
            argv.append(f"--{flag}")
    for option, key in (
        ("--env", "env_name"),
        ("--prefix", "prefix"),
        ("--json", "json_out"),
        ("--lockfile", "lockfile"),
        ("--mountinfo", "mountinfo"),
    ):
        if params[key] is not None:
            argv += [option, str(params[key])]
    click.echo(
        f"envcheck: re-running inside the worker simulation ({sim.hidden_count} toolchain paths "
        f"hidden): {' '.join(argv[1:])}",
        err=True,
    )
    return subprocess.run(sim.command(argv), env=os.environ, stdin=subprocess.DEVNULL).returncode


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--env",
    "env_name",
    metavar="NAME",
    help="Env name under the envs dir [default: the active env, else lingbot-b200].",
)
@click.option("--prefix", type=click.Path(path_type=Path), help="Env prefix (instead of --env).")
@click.option(
    "--worker", is_flag=True, help="Check as a non-activated job on a compiler-less worker sees it."
)
@click.option(
    "--json",
    "json_out",
    metavar="FILE|-",
    help="Write the JSON report to FILE ('-': stdout, text to stderr).",
)
@click.option(
    "--simulate-worker", is_flag=True, help="Re-run with --worker inside the worker simulation (needs root)."
)
@click.option("--fast", is_flag=True, help="bin/train's preflight subset: compilers, caches, node (seconds).")
@click.option(
    "--lockfile",
    type=click.Path(path_type=Path),
    help="Lock to compare with [default: the one the env was provisioned from].",
)
@click.option(
    "--mountinfo",
    type=click.Path(exists=True, dir_okay=False),
    help="Mount table to read instead of /proc/self/mountinfo.",
)
def main(env_name, prefix, worker, json_out, simulate_worker, fast, lockfile, mountinfo):
    """Prove an env on this node before a job is queued; exit 0 only if no check FAILed."""
    if env_name and prefix:
        raise click.UsageError("give --env NAME or --prefix PATH, not both")
    if simulate_worker:
        sys.exit(_simulate(click.get_current_context().params))
    chosen_by = (
        "--prefix"
        if prefix
        else "--env"
        if env_name
        else "the active env ($CONDA_PREFIX)"
        if os.environ.get("CONDA_PREFIX")
        else "the default env"
    )
    target = resolve_prefix(env_name, prefix)
    text_stream = sys.stderr if json_out == "-" else sys.stdout

    def progress(line: str) -> None:
        print(f"envcheck: {line}", file=sys.stderr, flush=True)

    report = run_checks(
        target,
        worker=worker,
        fast=fast,
        lockfile=lockfile,
        mountinfo=mountinfo,
        progress=progress,
        chosen_by=chosen_by,
    )
    print(report.render(), end="", file=text_stream, flush=True)
    if json_out == "-":
        sys.stdout.write(report.to_json())
    elif json_out:
        _write_atomically(Path(json_out), report.to_json())
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main(prog_name="bin/envcheck")
