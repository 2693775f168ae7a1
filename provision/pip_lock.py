"""The pip part of a lock: pip's own resolution for the workers' python and manylinux tags, from the
index's metadata (no downloads), turned into conda-lock entries with sha256 hashes. Per platform: the
wheel tags and the PEP 508 markers (platform_machine) are the platform's (`pip_arch`: linux-64 ->
x86_64, linux-aarch64 -> aarch64), whatever machine runs the relock.

Contract: `resolve_pip` returns pip's `--report` install items; `conda_shortfalls` names the packages
both parts would own where conda's version does not satisfy a pip requirement (lock.make_lock gives
each one owner); `pip_locked` makes the entries, leaving out every name the conda part owns;
`requirement_lines` is how a locked pip part is asked of pip at install time (the env's own pip, or the
host's for another platform: provision/wheel_install.py), exactly the locked files by their sha256.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from provision.lockfile import LockedPackage, LockError

# conda subdir -> the machine name of its wheels' platform tags and of PEP 508's platform_machine
PIP_ARCH = {"linux-64": "x86_64", "linux-aarch64": "aarch64", "linux-ppc64le": "ppc64le"}


def pip_arch(platform: str) -> str:
    """The wheel architecture of conda subdir `platform` (linux-aarch64 -> aarch64); LockError if none."""
    try:
        return PIP_ARCH[platform]
    except KeyError:
        raise LockError(
            f"the pip part cannot be locked for {platform}: manylinux wheels exist for "
            f"{', '.join(PIP_ARCH)}; remove the pip part or that platform from `platforms:`"
        ) from None


def requirement_lines(entries: list[LockedPackage], mirror: bool) -> list[str]:
    """pip's requirement lines for the locked `entries`: the locked file by URL, or with a mirror
    (--index-url / --find-links) the same version from there; both with the lock's sha256."""
    lines = []
    for d in entries:
        sha = f"--hash=sha256:{d.sha256}"
        lines.append(f"{d.name}=={d.version} {sha}" if mirror else f"{d.name} @ {d.url} {sha}")
    return lines


def manylinux_platforms(glibc: str, arch: str) -> list[str]:
    major, minor = (int(x) for x in glibc.split(".")[:2])
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]


# pip picks wheels by --platform but evaluates environment markers (`; platform_machine == "x86_64"`) for
# the machine it runs on: run it with platform.machine() answering the target's, so a dependency that
# only one architecture needs is resolved for that architecture (pip reads it once, on first use).
_PIP_FOR_MACHINE = (
    "import platform, runpy, sys; machine = sys.argv.pop(1); platform.machine = lambda: machine; "
    "sys.argv[0] = 'pip'; runpy.run_module('pip', run_name='__main__', alter_sys=True)"
)


def resolve_pip(
    requirements: list[str], python_version: str, glibc: str, index_url: str, *, arch: str
) -> list[dict]:
    """pip's resolution for the worker (python, manylinux tags and markers of `arch`) from PEP 658
    metadata, no downloads. The user's pip config (constraints, find-links) is ignored on purpose: the
    lock is for the cluster."""
    if not requirements:
        return []
    cmd = [
        sys.executable,
        "-c",
        _PIP_FOR_MACHINE,
        arch,
        "install",
        "--isolated",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        "-",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "--abi",
        f"cp{python_version.replace('.', '')}",
        "--index-url",
        index_url,
    ]
    for tag in manylinux_platforms(glibc, arch):
        cmd += ["--platform", tag]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    proc = subprocess.run(cmd + requirements, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise LockError(
            f"pip could not resolve the pip part ({' '.join(requirements)}):\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout)["install"]


def _marker_env(python_version: str, arch: str) -> dict[str, str]:
    from packaging.markers import default_environment

    return {
        **{k: str(v) for k, v in default_environment().items()},
        "python_version": python_version,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": arch,
        "extra": "",
    }


def _requirements(item: dict, marker_env: dict[str, str]) -> list:
    from packaging.requirements import Requirement

    out = []
    for text in item["metadata"].get("requires_dist") or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(marker_env):
            out.append(req)
    return out


def conda_shortfalls(
    items: list[dict], conda_versions: dict[str, str], python_version: str, arch: str
) -> dict[str, list]:
    """Packages pip resolved that conda also provides, but at a version some pip requirement rejects:
    {name: [(who, Requirement), ...]}. Each must get one owner (see lock.make_lock)."""
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    marker_env = _marker_env(python_version, arch)
    conda_versions = {canonicalize_name(k): v for k, v in conda_versions.items()}
    requires: dict[str, list] = {}
    for item in items:
        for req in _requirements(item, marker_env):
            requires.setdefault(canonicalize_name(req.name), []).append((item["metadata"]["name"], req))
    out: dict[str, list] = {}
    for item in items:
        name = canonicalize_name(item["metadata"]["name"])
        if name in conda_versions:
            have = Version(conda_versions[name])
            unmet = [(who, r) for who, r in requires.get(name, []) if have not in r.specifier]
            if unmet:
                out[name] = unmet
    return out


def pip_locked(
    items: list[dict], conda_names: set[str], platform: str, python_version: str, arch: str
) -> list:
    """conda-lock entries for pip's resolution, leaving out every name the conda part owns."""
    from conda_lock.lockfile.v2prelim.models import HashModel, LockedDependency
    from packaging.utils import canonicalize_name

    marker_env = _marker_env(python_version, arch)
    conda_names = {canonicalize_name(n) for n in conda_names}
    out = []
    for item in items:
        meta = item["metadata"]
        name = canonicalize_name(meta["name"])
        if name in conda_names:
            continue
        info = item["download_info"]
        sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha256:
            raise LockError(f"{info['url']}: the index gives no sha256; the pip part needs hashes")
        # "" not "*" for "any version": rattler's lock parser rejects "*" as a PEP 440 specifier
        deps = {canonicalize_name(r.name): str(r.specifier) for r in _requirements(item, marker_env)}
        out.append(
            LockedDependency(
                name=name,
                version=meta["version"],
                manager="pip",
                platform=platform,
                dependencies=deps,
                url=info["url"],
                hash=HashModel(sha256=sha256),
                categories={"main"},
            )
        )
    return out
