"""The pip part of a lock and the env's projects installed by THIS machine's Python, running none of the
env's programs: how bin/provision fills an env for another platform (an aarch64 env from an x86 login
node; provision/crossarch.py says what runs where). On the env's own platform the env's own pip does it
(provision/install.py), as before.

Contract: `install_from_host(p, gen, entries, index, find_links, progress)` does what the env's
own `pip install --no-deps` would, with the host's tools, and returns the manifest's pip records:
1. the host's pip (`sys.executable -m pip download`, `--isolated`, PIP_CONFIG_FILE=/dev/null: the
   user's pip config does not decide what a cluster env holds) downloads exactly the locked files:
   `name @ url --hash` without a mirror, `name==version --hash` from `--index-url` / `--no-index
   --find-links` with one; `--no-deps --require-hashes --only-binary :all:`, the target's wheel tags
   (manylinux of the glibc the lock recorded for the platform, `pip_lock.manylinux_platforms`),
   `--python-version` the env's (the lock's python record, checked against `gen/lib/pythonX.Y`) and
   `--implementation cp`;
2. pypa's `installer` unpacks each wheel into the env's scheme (`lib/pythonX.Y/site-packages`, `bin`,
   `include/pythonX.Y/<dist>`, data = the prefix), console scripts with `#!<gen>/bin/python` (what pip
   running in the env writes), INSTALLER, REQUESTED and, for a file by URL or a local project,
   direct_url.json (as pip writes them) beside RECORD, so `pip list` / `pip uninstall` in the env work;
   byte-compiled only when this Python is the env's (CPython, same major.minor: pyc files are
   version-specific), otherwise not, and the progress says so;
3. each project (this checkout) is built into a wheel by the host's pip (`pip wheel --no-deps
   --no-build-isolation --no-index`), which must be pure Python (a wheel tagged for this machine is
   refused: it would be the wrong architecture), and installed the same way.
Downloads and built wheels go to a temporary directory inside `gen` itself (the env's filesystem, which
holds the GBs they unpack into anyway; a login node's /tmp may be a small tmpfs), deleted before the
manifest is written; pip's own HTTP cache spares a re-download. Everything goes into `gen`, which the
caller deletes on any failure, and which the next provision removes as a leftover generation after a
kill (provision/install.py `_clean_stale`): a killed download never stays behind. Errors are
ProvisionError naming the package or file and the fix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from provision import vpkgs
from provision.lockfile import LockedPackage, LockError, LockFile
from provision.pip_lock import manylinux_platforms, pip_arch, requirement_lines
from provision.plan import Plan, ProvisionError
from provision.project import source_copy

# the dist-info INSTALLER of what the host installs (pip writes "pip")
INSTALLER_NAME = b"lingbot-provision\n"


def pip_env() -> dict[str, str]:
    """The host pip's environment: no user config, no user site (as the native step's)."""
    return {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PYTHONNOUSERSITE": "1"}


def env_python_version(gen: Path, lock: LockFile, platform: str) -> str:
    """The env's python as major.minor: the lock's python record, which the linked prefix must hold."""
    found = sorted(
        d.name.removeprefix("python")
        for d in (gen / "lib").glob("python*")
        if re.fullmatch(r"python\d+\.\d+", d.name) and d.is_dir()
    )
    locked = next((d.version for d in lock.for_platform(platform, "conda") if d.name == "python"), None)
    version = ".".join(locked.split(".")[:2]) if locked else (found[0] if len(found) == 1 else None)
    if version is None or version not in found:
        held = ", ".join(f"python{v}" for v in found) or "no pythonX.Y directory"
        raise ProvisionError(
            f"cannot tell the env's python version for its {platform} wheels: {lock.path} locks python "
            f"{locked or '(none)'} and {gen / 'lib'} holds {held}; add python to the spec and relock"
        )
    return version


def target_platforms(lock: LockFile, platform: str) -> list[str]:
    """The wheel platform tags of `platform`'s nodes: manylinux up to the glibc the lock was made for."""
    glibc = (lock.recorded_vpkgs_for(platform) or vpkgs.platform_default(platform)).glibc
    try:
        return manylinux_platforms(glibc, pip_arch(platform))
    except LockError as exc:
        raise ProvisionError(str(exc)) from None


def download_command(
    reqs: Path, dest: Path, python_version: str, platforms: list[str], index: str | None,
    find_links: str | None,
) -> list[str]:  # fmt: skip
    """The host pip's download of exactly the locked wheels of another platform."""
    cmd = [sys.executable, "-m", "pip", "download", "--isolated", "--disable-pip-version-check", "--no-deps",
           "--require-hashes", "--only-binary", ":all:", "--python-version", python_version,
           "--implementation", "cp", *(a for tag in platforms for a in ("--platform", tag)),
           "--dest", str(dest), "-r", str(reqs)]  # fmt: skip
    if index:
        cmd += ["--index-url", index]
    if find_links:
        cmd += ["--no-index", "--find-links", find_links]
    return cmd


def byte_compiles(python_version: str) -> bool:
    """pyc files written by this Python are valid for the env's only if it is the same CPython minor."""
    return sys.implementation.name == "cpython" and f"{sys.version_info[0]}.{sys.version_info[1]}" == (
        python_version
    )


def env_scheme(gen: Path, python_version: str, dist: str) -> dict[str, str]:
    """Where pip running in the env puts a wheel's parts (conda's prefix layout, not a venv's)."""
    site = str(gen / "lib" / f"python{python_version}" / "site-packages")
    return {
        "purelib": site,
        "platlib": site,
        "headers": str(gen / "include" / f"python{python_version}" / dist),
        "scripts": str(gen / "bin"),
        "data": str(gen),
    }


def install_wheel(wheel: Path, gen: Path, python_version: str, metadata: dict[str, bytes], name: str) -> None:
    """Unpack `wheel` (the distribution `name`, as its requirement names it) into the env `gen` as pip
    running there would (see the module docstring)."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.exceptions import InstallerError
    from installer.sources import WheelFile

    try:
        with WheelFile.open(wheel) as source:
            destination = SchemeDictionaryDestination(
                env_scheme(gen, python_version, name),
                interpreter=str(gen / "bin" / "python"),
                script_kind="posix",
                bytecode_optimization_levels=(0,) if byte_compiles(python_version) else (),
                overwrite_existing=True,  # as pip: wheels may share a file (nvidia/__init__.py)
            )
            install(source, destination, {"INSTALLER": INSTALLER_NAME, "REQUESTED": b"", **metadata})
    except (OSError, ValueError, zipfile.BadZipFile, InstallerError) as exc:
        raise ProvisionError(
            f"installing {wheel.name} into {gen} failed: {exc}; if the disk is full, free space under "
            f"{gen.parent}; else the wheel itself is unusable for this env: relock (bin/provision NAME "
            f"--relock) or install the env on its own platform"
        ) from None


def _direct_url(url: str, sha256: str | None = None) -> dict[str, bytes]:
    """PEP 610's record pip writes for a requirement given by URL (an archive) or a local directory."""
    info = (
        {"archive_info": {"hash": f"sha256={sha256}", "hashes": {"sha256": sha256}}}
        if sha256
        else {"dir_info": {}}
    )
    return {"direct_url.json": json.dumps({"url": url, **info}, sort_keys=True).encode()}


def _run_pip(cmd: list[str]) -> str | None:
    """Run the host's pip, its output shown as it comes; None if it succeeded, else what it said last
    from its first ERROR line on (the package and the reason)."""
    lines: list[str] = []
    with subprocess.Popen(cmd, env=pip_env(), stderr=subprocess.PIPE, text=True, errors="replace") as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            lines.append(line.strip())
    if proc.returncode == 0:
        return None
    first = next((i for i, line in enumerate(lines) if line.startswith("ERROR:")), max(len(lines) - 6, 0))
    return " ".join(line for line in lines[first : first + 10] if line) or f"exit {proc.returncode}"


def download(
    entries: list[LockedPackage], reqs: Path, dest: Path, python_version: str, platforms: list[str],
    index: str | None, find_links: str | None,
) -> dict[str, Path]:  # fmt: skip
    """The locked wheels fetched by the host's pip into `dest`: {locked name: file}."""
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
    from packaging.version import Version

    cmd = download_command(reqs, dest, python_version, platforms, index, find_links)
    source = f"--index-url {index}" if index else f"--find-links {find_links}" if find_links else "their URLs"
    said = _run_pip(cmd)
    if said is not None:
        raise ProvisionError(
            f"this machine's pip could not download the locked wheels for python {python_version} "
            f"{platforms[0]} from {source}: {said}; fix: the network, or a mirror holding exactly the "
            f"locked files (--pip-index, --pip-find-links, or --export DIR / --from DIR); the env is "
            f"untouched"
        )
    have = {}
    for f in dest.glob("*.whl"):
        try:
            name, version, _, _ = parse_wheel_filename(f.name)
        except InvalidWheelFilename:
            continue  # named below as missing, if it was one of the locked wheels
        have[(name, version)] = f
    out = {}
    for d in entries:
        wheel = have.get((canonicalize_name(d.name), Version(d.version)))
        if wheel is None:
            raise ProvisionError(
                f"pip download left no wheel of {d.name} {d.version} in {dest} (from {source}); the "
                f"mirror must hold the locked file {d.file_name}"
            )
        out[d.name] = wheel
    return out


def build_project_wheel(project: Path, out: Path, platform: str) -> Path:
    """`project` built into a pure-Python wheel by the host's pip (no index, this Python's backend)."""
    from packaging.utils import parse_wheel_filename

    source = source_copy(project, out / "source")
    cmd = [sys.executable, "-m", "pip", "wheel", "--isolated", "--disable-pip-version-check", "--no-deps",
           "--no-build-isolation", "--no-index", "--wheel-dir", str(out), str(source)]  # fmt: skip
    said = _run_pip(cmd)
    if said is not None:
        raise ProvisionError(
            f"this machine's pip could not build a wheel of {project}: {said}; its build backend must be "
            f"installed in {sys.prefix} (--no-build-isolation: for this checkout setuptools, which "
            f"pyproject.toml gives the tool env); the env is untouched"
        )
    built = sorted(out.glob("*.whl"))
    if len(built) != 1:
        raise ProvisionError(f"pip wheel {project} left {len(built)} wheels in {out}, expected one")
    wheel = built[0]
    tags = {t.platform for t in parse_wheel_filename(wheel.name)[3]}
    if tags != {"any"}:
        raise ProvisionError(
            f"{project} builds {wheel.name} here, a wheel for this machine and not for {platform}; "
            f"install it on a {platform} node, or remove it from the spec's pip part"
        )
    return wheel


def install_from_host(
    p: Plan, gen: Path, entries: list[LockedPackage], index: str | None, find_links: str | None,
    progress: Callable[[str], None],
) -> list[dict]:  # fmt: skip
    """The pip part, then the projects, into `gen` by this machine's Python (the module docstring)."""
    python_version = env_python_version(gen, p.lock, p.platform)
    platforms = target_platforms(p.lock, p.platform) if entries else []
    here = f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]}"
    if byte_compiles(python_version):
        compiling = f"byte-compiling with it (the env's python is {python_version} too)"
    else:
        compiling = f"not byte-compiling: the env's python is cpython {python_version}, and pyc files are "
        compiling += "version-specific (it compiles on import)"
    progress(f"pip for {p.platform} by this machine's python ({here}), none of the env's: {compiling}")
    with tempfile.TemporaryDirectory(prefix=".lingbot-pip-host-", dir=gen) as tmp:
        if entries:
            reqs = gen / "conda-meta" / "lingbot-pip-requirements.txt"  # as the native step writes it
            reqs.write_text("\n".join(requirement_lines(entries, bool(index or find_links))) + "\n")
            progress(f"pip: downloading {len(entries)} locked wheels with hashes (python {python_version}, "
                     f"{platforms[0]} and older)")  # fmt: skip
            wheels = download(entries, reqs, Path(tmp), python_version, platforms, index, find_links)
            for n, d in enumerate(entries, 1):
                by_url = {} if (index or find_links) else _direct_url(d.url, d.sha256)
                install_wheel(wheels[d.name], gen, python_version, by_url, d.name)
                progress(f"pip: installed {n}/{len(entries)} {d.name} {d.version}")
        for i, local in enumerate(p.projects):
            progress(f"pip: building {local} into a wheel here and installing it (--no-deps, not locked)")
            wheel = build_project_wheel(local, Path(tmp, f"project-{i}"), p.platform)
            name = wheel.name.split("-", 1)[0].replace("_", "-")
            install_wheel(wheel, gen, python_version, _direct_url(local.resolve().as_uri()), name)
    return [{"name": d.name, "version": d.version, "sha256": d.sha256} for d in entries]
