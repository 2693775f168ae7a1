"""A compiler-less worker, simulated on a machine that has gcc.

The cluster's workers (ubuntu:22.04) have no gcc, binutils or headers. To reproduce that here, a
command runs in a private mount namespace (``unshare --mount``, propagation private, i.e.
``mount --make-rprivate /``) where ``/usr`` is a read-only overlay whose top layer whites out
(character device 0:0) every file that ``dpkg -L`` lists for the toolchain and ``-dev`` packages,
plus whole directories (``/usr/include``, ``/usr/lib/gcc``, ``/usr/libexec/gcc``,
``/usr/local/include``, ``/usr/local/cuda*``), the system ``libgomp.so.1`` and the ``openssl``
command (worker images may lack it; Inductor's CPU precompiled header runs ``openssl sha512``).
Runtime libraries a worker does have (``libc.so.6``, ``libstdc++.so.6``, ``libgcc_s.so.1``) stay.
Compiler-like commands in PATH directories outside ``/usr`` get the same treatment through one
more overlay each.

The whiteout layers are built once per machine into a cache (default
``~/.cache/lingbot-fixtures/worker-sim/<key>``, key = hash of the dpkg file lists and the hidden
paths) and appear atomically (build in a temp dir, then rename).

Used by the tests' ``worker`` fixture and by ``bin/envcheck --simulate-worker``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from provision.worker_layers import STANDARD_PATH, ensure_layers, plan_layers

# What must hold inside: absent / present.
MUST_BE_ABSENT_COMMANDS = ("gcc", "cc", "g++", "c++", "ld", "as", "cpp", "openssl")
MUST_BE_ABSENT_FILES = ("crt1.o", "libc.so", "libc_nonshared.a", "libgomp.so.1")
MUST_BE_PRESENT_LIBS = ("libc.so.6", "libstdc++.so.6", "libgcc_s.so.1")
MUST_BE_ABSENT_PATHS = ("/usr/include/stdio.h", "/usr/lib/gcc")

_MOUNT_FAILED = 125  # exit status of the wrapper when it could not set the simulation up


def default_cache_dir() -> Path:
    base = os.environ.get("LINGBOT_FIXTURES_CACHE") or Path.home() / ".cache" / "lingbot-fixtures"
    return Path(base) / "worker-sim"


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, "") if this machine can make mount namespaces and overlays with whiteouts, else the reason."""
    if not sys.platform.startswith("linux"):
        return False, f"worker simulation needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "worker simulation needs root (unshare --mount, mknod whiteouts, overlay mounts)"
    for tool in ("unshare", "mount", "dpkg-query"):
        if shutil.which(tool) is None:
            return False, f"worker simulation needs `{tool}` on PATH (util-linux / dpkg)"
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError as exc:
        return False, f"cannot read /proc/filesystems: {exc}"
    if "overlay" not in filesystems.split():
        return False, "the kernel has no overlay filesystem (modprobe overlay)"
    # A real trial: an overlay whose top layer whites out one file, inside a new mount namespace.
    with tempfile.TemporaryDirectory(prefix="lingbot-worker-sim-probe-") as tmp:
        lower, top, mnt = (Path(tmp, name) for name in ("lower", "top", "mnt"))
        for d in (lower, top, mnt):
            d.mkdir()
        (lower / "hidden").write_text("x")
        (lower / "kept").write_text("x")
        try:
            os.mknod(top / "hidden", stat.S_IFCHR | 0o000, os.makedev(0, 0))
        except OSError as exc:
            return False, f"cannot create overlay whiteouts (mknod c 0 0): {exc}"
        script = (
            f"mount -t overlay probe -o ro,lowerdir={top}:{lower} {mnt} && "
            f"test ! -e {mnt}/hidden && test -e {mnt}/kept"
        )
        try:
            proc = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"unshare --mount failed: {exc}"
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"
            return False, f"mount namespaces with read-only overlays are not permitted here: {detail}"
    return True, ""


class WorkerSimulation:
    """Run commands as they would run on a compiler-less worker. Build once per process."""

    def __init__(self, cache_dir: Path | None = None):
        ok, reason = available()
        if not ok:
            raise RuntimeError(f"worker simulation unavailable: {reason}")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        plan = plan_layers()
        self.layer_dir, self.build_seconds = ensure_layers(self.cache_dir, plan)
        manifest = json.loads((self.layer_dir / "manifest.json").read_text())
        self.mounts: list[tuple[str, Path]] = [
            (entry["target"], self.layer_dir / entry["layer"]) for entry in manifest["layers"]
        ]
        for target, layer in self.mounts:
            if any(c in f"{target}{layer}" for c in ",:\n"):  # would break the overlay's option string
                raise RuntimeError(
                    f"worker simulation: path {layer} or {target} contains ',' or ':'; "
                    "set LINGBOT_FIXTURES_CACHE (or cache_dir=) to a plain path"
                )
        self.hidden_packages: list[str] = manifest["packages"]
        self.hidden_count: int = manifest["hidden_count"]
        self._mount = shutil.which("mount") or "/usr/bin/mount"
        self._strict_checked = False

    # -- running ---------------------------------------------------------------------------------
    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped so that it runs inside the simulation (the inner exit status is kept)."""
        if not argv:
            raise ValueError("WorkerSimulation.command: empty argv")
        mounts = " && ".join(
            f"{self._mount} -t overlay lingbot-worker -o ro,lowerdir={layer}:{target} {target}"
            for target, layer in self.mounts
        )
        script = (
            f"{mounts} || {{ echo 'worker-sim: could not mount the worker overlays' >&2; "
            f"exit {_MOUNT_FAILED}; }}\n"
            'exec "$@"'
        )
        # unshare execs sh, sh execs argv: the process the caller starts IS the inner command.
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            script,
            "worker-sim",
            *argv,
        ]

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        timeout: float | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess:
        """Like ``subprocess.run(argv, capture_output=True, text=True)`` but inside the simulation.

        On timeout the whole process tree is killed (its session and every descendant) and
        ``subprocess.TimeoutExpired`` is raised.
        """
        argv = [str(a) for a in argv]
        proc = subprocess.Popen(
            self.command(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            stdout, stderr = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout or 0.0, output=stdout, stderr=stderr) from None
        except BaseException:
            _kill_tree(proc)
            proc.communicate()
            raise
        result = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
        if proc.returncode == _MOUNT_FAILED and "worker-sim: could not mount" in stderr:
            raise RuntimeError(f"worker simulation could not be set up: {stderr.strip()}")
        if check:
            result.check_returncode()
        return result

    # -- strictness ------------------------------------------------------------------------------
    def assert_strict(self) -> None:
        """Raise AssertionError unless, inside, no compiler/binutils/crt/headers exist and libc.so.6 does."""
        result = self.run([sys.executable, "-c", _STRICTNESS_PROBE], timeout=60)
        if result.returncode != 0:
            raise AssertionError(
                f"worker simulation strictness probe failed (exit {result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        problems = json.loads(result.stdout)
        if problems:
            raise AssertionError(
                "worker simulation is not strict (layers in "
                + str(self.layer_dir)
                + "):\n  "
                + "\n  ".join(problems)
            )
        self._strict_checked = True


# Runs inside the simulation; prints a JSON list of violations.
_STRICTNESS_PROBE = f"""
import ctypes.util, glob, json, os, shutil
path = os.pathsep.join([os.environ.get("PATH", "")] + {list(STANDARD_PATH)!r})
problems = []
mounted = [l.split()[4] for l in open("/proc/self/mountinfo") if " - overlay " in l]
if "/usr" not in mounted:
    problems.append("/usr is not an overlay inside the simulation")
for cmd in {list(MUST_BE_ABSENT_COMMANDS)!r}:
    found = shutil.which(cmd, path=path)
    if found:
        problems.append(f"command {{cmd}} is present: {{found}}")
libdirs = ["/usr/lib", "/usr/lib64", "/usr/local/lib", *glob.glob("/usr/lib/*-linux-gnu")]
for name in {list(MUST_BE_ABSENT_FILES)!r}:
    for hit in [os.path.join(d, name) for d in libdirs if os.path.lexists(os.path.join(d, name))]:
        problems.append(f"{{name}} is present: {{hit}}")
for p in {list(MUST_BE_ABSENT_PATHS)!r}:
    if os.path.lexists(p):
        problems.append(f"{{p}} is present")
for lib in {list(MUST_BE_PRESENT_LIBS)!r}:
    try:
        ctypes.CDLL(lib)
    except OSError as exc:
        problems.append(f"runtime library {{lib}} cannot be loaded: {{exc}}")
print(json.dumps(problems))
"""


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process's session and every descendant (some may have left the session)."""
    try:
        import psutil

        descendants = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # the process may already be gone; psutil may be missing
        descendants = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for child in descendants:
        try:
            child.kill()
        except Exception:
            pass
