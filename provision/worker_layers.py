"""The worker simulation's whiteout layers: what a compiler-less worker lacks, planned from dpkg's
file lists and PATH, and built once per machine into a cache (provision/worker_sim.py mounts them).

Contract: `plan_layers()` returns {"packages", "dpkg_lists_sha256", "targets": {dir: {"dirs", "files"}}};
`ensure_layers(cache_dir, plan)` returns (layer dir, build seconds; 0 when cached); the layer dir
(keyed by the plan and LAYOUT_VERSION) appears atomically with its manifest.json.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

LAYOUT_VERSION = "2"  # bump when the layer format or the hiding rules change

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
# Commands a worker image lacks besides the compilers, hidden in every PATH directory too: `openssl`
# (Inductor's CPU precompiled header runs `openssl sha512`; the env must carry its own).
WORKER_ABSENT_COMMANDS = ("openssl",)
# Standard PATH directories probed for compilers besides $PATH.
STANDARD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


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


def plan_layers() -> dict:
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
                any(fnmatch.fnmatchcase(entry, p) for p in COMPILER_COMMAND_PATTERNS + WORKER_ABSENT_COMMANDS)
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


def ensure_layers(cache_dir: Path, plan: dict) -> tuple[Path, float]:
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
