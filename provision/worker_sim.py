"""A compiler-less worker, simulated on a machine that has gcc.

The cluster's workers (ubuntu:22.04) have no gcc, binutils or headers. To reproduce that here, a
command runs in a private mount namespace (``unshare --mount``, propagation private, i.e.
``mount --make-rprivate /``) where ``/usr`` is a read-only overlay whose top layer whites out
(character device 0:0) every file that ``dpkg -L`` lists for the toolchain and ``-dev`` packages,
plus whole directories (``/usr/include``, ``/usr/lib/gcc``, ``/usr/libexec/gcc``,
``/usr/local/include``, ``/usr/local/cuda*``) and the system ``libgomp.so.1``. Runtime libraries a
worker does have (``libc.so.6``, ``libstdc++.so.6``, ``libgcc_s.so.1``) stay. Compiler-like commands
in PATH directories outside ``/usr`` get the same treatment through one more overlay each.

The whiteout layers are built once per machine into a cache (default
``~/.cache/lingbot-fixtures/worker-sim/<key>``, key = hash of the dpkg file lists and the hidden
paths) and appear atomically (build in a temp dir, then rename).

Used by the tests' ``worker`` fixture and by ``bin/envcheck --simulate-worker``.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

LAYOUT_VERSION = "1"  # bump when the layer format or the hiding rules change

# Packages a worker does not have. Matched against `dpkg-query -W` names (fnmatch).
TOOLCHAIN_PACKAGE_PATTERNS = (
    "*-dev",
    "gcc*", "g++*", "cpp*", "gfortran*",
    "binutils*", "libbinutils", "libctf*", "libgprofng*", "libjansson*",
    "build-essential", "dpkg-dev", "make", "pkg-config", "pkgconf*", "manpages-dev",
    "clang*", "llvm*", "lld*", "libclang*",
    "libc-dev-bin", "libc6-dev", "libcrypt-dev", "linux-libc-dev",
    "libgcc-*-dev", "libstdc++-*-dev",
    # gcc's own runtime and helper libraries: present only because gcc is installed.
    "libasan*", "libtsan*", "liblsan*", "libubsan*", "libhwasan*", "libitm*", "libatomic*",
    "libquadmath*", "libcc1-*", "libgomp*", "libisl*", "libmpc[0-9]*", "libmpfr*", "libobjc*",
)  # fmt: skip
# Packages that match a pattern above but that a worker has (runtime parts, or only docs).
KEPT_PACKAGE_PATTERNS = ("*-base", "libgcc-s*", "libstdc++[0-9]*", "libc6", "libclang-cpp*", "libllvm*")

# Hidden as whole directories (globbed, relative to /usr).
HIDDEN_USR_DIRS = ("include", "lib/gcc", "libexec/gcc", "local/include", "local/cuda*")
# Hidden as files (globbed, relative to /usr) whatever package owns them.
HIDDEN_USR_FILES = ("lib/*-linux-gnu/libgomp.so*", "lib/*-linux-gnu/libgomp.a", "lib64/libgomp.so*")
# Names of commands that compile, assemble or link, hidden in every PATH directory.
COMPILER_COMMAND_PATTERNS = (
    "cc", "c++", "c89", "c99", "gcc", "gcc-*", "g++", "g++-*", "cpp", "cpp-*", "as",
    "ld", "ld.bfd", "ld.gold", "ld.lld", "ld.mold",  # not ld.so: that is glibc's loader
    "clang", "clang++", "clang-[0-9]*", "clang++-*", "*-gcc", "*-gcc-*", "*-g++", "*-g++-*",
    "*-cc", "*-c++", "*-ld", "*-ld.*", "*-as", "nvcc", "ptxas", "tcc", "icc", "icx", "icpx", "zig",
)  # fmt: skip
# Standard PATH directories probed for compilers besides $PATH.
STANDARD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

# What must hold inside: absent / present.
MUST_BE_ABSENT_COMMANDS = ("gcc", "cc", "g++", "c++", "ld", "as", "cpp")
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
        plan = _plan_layers()
        self.layer_dir, self.build_seconds = _ensure_layers(self.cache_dir, plan)
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


# -- layer planning and building -----------------------------------------------------------------


def _installed_packages() -> list[str]:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${binary:Package}\\t${db:Status-Status}\\n"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sorted(line.split("\t")[0] for line in out.splitlines() if line.endswith("\tinstalled"))


def packages_workers_lack(installed: Sequence[str]) -> list[str]:
    """The installed packages a worker does not have, chosen by name from dpkg's list."""

    def matches(name: str, patterns: Sequence[str]) -> bool:
        bare = name.split(":")[0]
        return any(fnmatch.fnmatchcase(bare, p) for p in patterns)

    return [
        p
        for p in installed
        if matches(p, TOOLCHAIN_PACKAGE_PATTERNS) and not matches(p, KEPT_PACKAGE_PATTERNS)
    ]


def _dpkg_listing(packages: Sequence[str]) -> str:
    if not packages:
        return ""
    return subprocess.run(["dpkg-query", "-L", *packages], capture_output=True, text=True).stdout


@functools.cache
def _realpath(path: str) -> str:
    return os.path.realpath(path)


def _usr_relative(path: str) -> str | None:
    """Map a dpkg path to a path relative to /usr (merged-/usr aware); None if outside /usr."""
    real_parent = _realpath(os.path.dirname(path))
    full = os.path.join(real_parent, os.path.basename(path))
    if full == "/usr" or not full.startswith("/usr/"):
        return None
    return full[len("/usr/") :]


def _plan_layers() -> dict:
    """What to hide: {"packages": [...], "dpkg_lists_sha256": str,
    "targets": {dir: {"dirs": [...], "files": [...]}}}."""
    installed = _installed_packages()
    packages = packages_workers_lack(installed)
    listing = _dpkg_listing(packages)
    # A file that a kept package also ships (Multi-Arch: same docs, shared symlinks) stays visible.
    kept_files = {
        line.strip() for line in _dpkg_listing([p for p in installed if p not in set(packages)]).splitlines()
    }
    usr = Path("/usr")
    hidden_dirs = sorted({str(p.relative_to(usr)) for pat in HIDDEN_USR_DIRS for p in usr.glob(pat)})
    hidden_files: set[str] = {str(p.relative_to(usr)) for pat in HIDDEN_USR_FILES for p in usr.glob(pat)}
    for line in listing.splitlines():
        line = line.strip()
        if not line.startswith("/") or line in kept_files:
            continue  # "package diverts others to: ..." and similar notes
        rel = _usr_relative(line)
        if rel is None or (
            os.path.isdir(os.path.join("/usr", rel)) and not os.path.islink(os.path.join("/usr", rel))
        ):
            continue
        if os.path.lexists(os.path.join("/usr", rel)):
            hidden_files.add(rel)

    targets: dict[str, dict[str, list[str]]] = {"/usr": {"dirs": hidden_dirs, "files": []}}
    # Compiler-like commands anywhere on PATH, and shims that exec into a hidden tree (e.g. a CUDA
    # toolkit's /usr/local/bin/nvcc wrapper).
    path_dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d] + list(STANDARD_PATH)
    hidden_roots = tuple(f"/usr/{d}" for d in hidden_dirs)
    for d in dict.fromkeys(os.path.realpath(d) for d in path_dirs):
        if not os.path.isdir(d):
            continue
        for entry in sorted(os.listdir(d)):
            full = os.path.join(d, entry)
            if not (
                any(fnmatch.fnmatchcase(entry, p) for p in COMPILER_COMMAND_PATTERNS)
                or _execs_into(full, hidden_roots)
            ):
                continue
            rel = _usr_relative(full)
            if rel is not None:
                hidden_files.add(rel)
            else:
                targets.setdefault(d, {"dirs": [], "files": []})["files"].append(entry)
    covered = tuple(d + "/" for d in hidden_dirs)
    targets["/usr"]["files"] = sorted(
        f for f in hidden_files if not f.startswith(covered) and f not in hidden_dirs
    )
    return {
        "packages": packages,
        "dpkg_lists_sha256": hashlib.sha256(listing.encode()).hexdigest(),
        "targets": targets,
    }


def _execs_into(path: str, roots: tuple[str, ...]) -> bool:
    """True for a small script that names a path under one of ``roots`` (a wrapper into a hidden tree)."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > 4096:
            return False
        with open(path, "rb") as f:
            text = f.read()
    except OSError:
        return False
    return text.startswith(b"#!") and any(root.encode() in text for root in roots)


def _plan_key(plan: dict) -> str:
    blob = json.dumps({"version": LAYOUT_VERSION, **plan}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _ensure_layers(cache_dir: Path, plan: dict) -> tuple[Path, float]:
    """Return (layer dir, seconds spent building it; 0 when cached)."""
    final = cache_dir / _plan_key(plan)
    if (final / "manifest.json").is_file():
        return final, 0.0
    start = time.perf_counter()
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache_dir))
    try:
        layers, count = [], 0
        for i, (target, hide) in enumerate(sorted(plan["targets"].items())):
            layer = f"layer{i}"
            top = tmp / layer
            top.mkdir()
            _copy_dir_attrs(Path(target), top)
            for rel in hide["dirs"] + hide["files"]:
                _whiteout(Path(target), top, rel)
                count += 1
            layers.append({"target": target, "layer": layer, "hidden": hide})
        manifest = {
            "layout_version": LAYOUT_VERSION,
            "packages": plan["packages"],
            "dpkg_lists_sha256": plan["dpkg_lists_sha256"],
            "hidden_count": count,
            "layers": layers,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "manifest.json").is_file():  # not a concurrent builder winning the race
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, time.perf_counter() - start


def _whiteout(target: Path, top: Path, rel: str) -> None:
    """Create ``top/rel`` as an overlay whiteout; parents copy the real directories' mode and owner."""
    parts = Path(rel).parts
    real, layer = target, top
    for part in parts[:-1]:
        real, layer = real / part, layer / part
        if not layer.exists():
            layer.mkdir()
            _copy_dir_attrs(real, layer)
    os.mknod(layer / parts[-1], stat.S_IFCHR | 0o000, os.makedev(0, 0))


def _copy_dir_attrs(real: Path, layer: Path) -> None:
    # The top layer's directory attributes are what the merged view shows: keep them identical.
    st = real.stat()
    os.chown(layer, st.st_uid, st.st_gid)
    os.chmod(layer, stat.S_IMODE(st.st_mode))
