"""conda-lock.yml: solve environment.yml's conda part with py-rattler, lock its pip part against PyPI
with hashes, and write conda-lock's v1 format with conda-lock's own models and writer.

Drift detection: metadata.content_hash[platform] is conda-lock's own content hash
(conda_lock.content_hash.compute_content_hashes) of conda-lock's parse of environment.yml plus the
virtual packages the solve assumed (kept in metadata.custom_metadata, so the hash can be recomputed).
Local pip paths and `variables:` are not part of it: they are not locked. The sha256 of the spec file
is kept in metadata.inputs_metadata, so an unchanged spec is recognised without importing conda-lock
(the fast path of a no-op provision); only when the file changed is the content hash recomputed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform as host
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from provision.spec import EnvSpec

REPO_ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = REPO_ROOT.parent / "shared" / "conda-forge-snapshot"  # offline conda-forge repodata subset
PYPI_INDEX = "https://pypi.org/simple"
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_CUSTOM_VPKGS = "lingbot_virtual_packages"


class LockError(ValueError):
    """A lock that cannot be made or used; the message names the file and the fix."""


def current_platform() -> str:
    system = {"Linux": "linux", "Darwin": "osx", "Windows": "win"}.get(host.system(), host.system().lower())
    machine = {"x86_64": "64", "AMD64": "64", "aarch64": "aarch64", "arm64": "arm64"}.get(
        host.machine(), host.machine()
    )
    return f"{system}-{machine}"


@dataclass(frozen=True)
class VirtualPackages:
    """What the workers provide: ubuntu 22.04 (glibc 2.35, kernel 5.15), the cluster's CUDA driver."""

    glibc: str = "2.35"
    cuda: str = "13.0"  # torch 2.13's PyPI wheel is built for CUDA 13.0: driver >= 580 on the nodes
    linux: str = "5.15"
    archspec: str = "x86_64"

    def as_dict(self) -> dict[str, str]:
        out = {
            "__unix": "0",
            "__linux": self.linux,
            "__glibc": self.glibc,
            "__archspec": f"1 {self.archspec}",
        }
        if self.cuda:
            out["__cuda"] = self.cuda
        return out

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> VirtualPackages:
        return cls(
            glibc=d["__glibc"],
            cuda=d.get("__cuda", ""),
            linux=d["__linux"],
            archspec=d["__archspec"].split()[-1],
        )

    def for_rattler(self) -> list:
        from rattler import BuildString, GenericVirtualPackage, PackageName, Version

        out = []
        for name, spec in self.as_dict().items():
            version, _, build = spec.partition(" ")
            out.append(GenericVirtualPackage(PackageName(name), Version(version), BuildString(build or "0")))
        return out


def channel_url(channel: str, base: Path) -> str:
    """conda's channel names to URLs: a name -> conda.anaconda.org, a path (relative to `base`) -> file://."""
    if "://" in channel:
        return channel.rstrip("/")
    if channel.startswith(("/", ".", "~")):
        return (base / Path(channel).expanduser()).resolve().as_uri()
    return f"https://conda.anaconda.org/{channel}"


def default_mirrors(spec: EnvSpec) -> list[str] | None:
    """Offline default: solve conda-forge against the repodata snapshot next to the checkout."""
    if spec.channels == ["conda-forge"] and (SNAPSHOT / "noarch" / "repodata.json").exists():
        return [SNAPSHOT.as_uri()]
    return None


# --- conda part -----------------------------------------------------------------------------------


def run_async(coro):
    """Run a py-rattler coroutine in a private loop (callers may already be inside one)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def solve_conda(
    spec: EnvSpec, platform: str, vpkgs: VirtualPackages, mirrors: list[str] | None, cache_dir: Path
) -> list[tuple]:
    """Solve the conda part; returns (record, canonical_url) pairs, canonical = the spec's channel."""
    from rattler import Channel, Gateway, solve

    canonical = [channel_url(c, spec.path.parent) for c in spec.channels]
    sources = [m.rstrip("/") for m in mirrors] if mirrors else canonical
    if len(sources) != len(canonical):
        raise LockError(
            f"--channel was given {len(sources)} times; {spec.path} lists {len(canonical)} channels"
        )
    try:
        records = await solve(
            sources=[Channel(s) for s in sources],
            specs=spec.conda,
            gateway=Gateway(cache_dir=cache_dir),
            platforms=[platform, "noarch"],
            virtual_packages=vpkgs.for_rattler(),
        )
    except Exception as exc:  # rattler raises its own exception types with the solver's explanation
        raise LockError(
            f"cannot solve the conda part of {spec.path} for {platform} against {', '.join(sources)}:\n{exc}\n"
            f"(a package missing from an offline channel shows up here: add it to the mirror)"
        ) from None
    out = []
    for rec in records:
        url = str(rec.url)
        for src, canon in zip(sources, canonical, strict=True):
            if url.startswith(src + "/"):
                url = canon + url[len(src) :]
        out.append((rec, url))
    return out


def _conda_locked(rec, url: str, platform: str):
    from conda_lock.lockfile.v2prelim.models import HashModel, LockedDependency

    if rec.md5 is None or rec.sha256 is None:
        raise LockError(f"{url}: the channel's repodata gives no md5 or sha256; both are required")
    deps = {}
    for dep in rec.depends:
        name, _, constraint = dep.partition(" ")
        deps[name] = constraint.strip() or "*"
    return LockedDependency(
        name=rec.name.normalized,
        version=str(rec.version),
        manager="conda",
        platform=platform,
        dependencies=deps,
        url=url,
        hash=HashModel(md5=rec.md5.hex(), sha256=rec.sha256.hex()),
        categories={"main"},
        build=str(rec.build),
    )


# --- pip part -------------------------------------------------------------------------------------


def manylinux_platforms(glibc: str, arch: str = "x86_64") -> list[str]:
    major, minor = (int(x) for x in glibc.split(".")[:2])
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]


def resolve_pip(requirements: list[str], python_version: str, glibc: str, index_url: str) -> list[dict]:
    """pip's resolution for the worker (python, manylinux tags) from PEP 658 metadata, no downloads.
    The user's pip config (constraints, find-links) is ignored on purpose: the lock is for the cluster."""
    if not requirements:
        return []
    cmd = [
        sys.executable,
        "-m",
        "pip",
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
    for tag in manylinux_platforms(glibc):
        cmd += ["--platform", tag]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    proc = subprocess.run(cmd + requirements, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise LockError(
            f"pip could not resolve the pip part ({' '.join(requirements)}):\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout)["install"]


def _pip_locked(
    items: list[dict], conda_versions: dict[str, str], platform: str, python_version: str, warn
) -> list:
    """conda-lock entries for pip's resolution; packages conda already provides at a version every
    requirement accepts are left to conda (conda-lock does the same)."""
    from conda_lock.lockfile.v2prelim.models import HashModel, LockedDependency
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    marker_env = {
        **default_environment(),
        "python_version": python_version,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "extra": "",
    }
    requires: dict[str, list[tuple[str, Requirement]]] = {}
    for item in items:
        for text in item["metadata"].get("requires_dist") or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(marker_env):
                requires.setdefault(canonicalize_name(req.name), []).append((item["metadata"]["name"], req))
    out = []
    for item in items:
        meta = item["metadata"]
        name = canonicalize_name(meta["name"])
        if name in conda_versions:
            conda_version = Version(conda_versions[name])
            unmet = [
                f"{who} needs {r}" for who, r in requires.get(name, []) if conda_version not in r.specifier
            ]
            if not unmet:
                continue
            warn(f"pip overrides conda's {name} {conda_version}: {'; '.join(unmet)}")
        info = item["download_info"]
        sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha256:
            raise LockError(f"{info['url']}: the index gives no sha256; the pip part needs hashes")
        deps = {}
        for text in meta.get("requires_dist") or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(marker_env):
                # "" not "*" for "any version": rattler's lock parser rejects "*" as a PEP 440 specifier
                deps[canonicalize_name(req.name)] = str(req.specifier)
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


# --- content hash and drift -----------------------------------------------------------------------


def content_hash(spec: EnvSpec, platform: str, vpkgs: VirtualPackages) -> str:
    """conda-lock's content hash of the lockable part of `spec` for `platform` (see module doc)."""
    from conda_lock.content_hash import compute_content_hashes
    from conda_lock.src_parser import make_lock_spec
    from conda_lock.virtual_package import virtual_package_repo_from_specification

    with tempfile.TemporaryDirectory(prefix="lingbot-lock-") as tmp:
        deps: list = list(spec.conda)
        if spec.pip or spec.pip_local:
            deps.append({"pip": list(spec.pip)})
        lockable = Path(tmp, "environment.yml")
        channels = [
            channel_url(c, spec.path.parent) if c.startswith(("/", ".", "~")) else c for c in spec.channels
        ]
        lockable.write_text(yaml.safe_dump({"name": spec.name, "channels": channels, "dependencies": deps}))
        vp_file = Path(tmp, "virtual-packages.yml")
        vp_file.write_text(yaml.safe_dump({"subdirs": {platform: {"packages": vpkgs.as_dict()}}}))
        mapping = Path(tmp, "pypi-mapping.json")  # names map to themselves; no download of conda-lock's map
        mapping.write_text("{}")
        lock_spec = make_lock_spec(
            src_files=[lockable], platform_overrides=[platform], mapping_url=str(mapping)
        )
        repo = virtual_package_repo_from_specification(vp_file)
        return compute_content_hashes(lock_spec, repo)[platform]


def spec_sha256(spec_path: Path) -> str:
    # conda-lock's InputMeta hashes the text read as UTF-8
    return hashlib.sha256(Path(spec_path).read_text().encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class LockHeader:
    path: Path
    platforms: list[str]
    content_hash: dict[str, str]
    virtual_packages: VirtualPackages
    sha256: str  # of the lock file's bytes: any relock changes it


def read_header(lock_path: Path) -> LockHeader:
    """The lock's metadata, read with PyYAML only (fast path; the install reads it with conda-lock)."""
    try:
        raw = Path(lock_path).read_bytes()
    except FileNotFoundError:
        raise LockError(f"{lock_path}: no lock file; create it with `bin/provision NAME --relock`") from None
    try:
        data = yaml.load(raw, Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{lock_path}:{mark.line + 1}" if mark else str(lock_path)
        raise LockError(
            f"{where}: malformed YAML ({getattr(exc, 'problem', exc)}); relock with --relock"
        ) from None
    if not isinstance(data, dict) or data.get("version") != 1 or "metadata" not in data:
        raise LockError(f"{lock_path}: not a conda-lock v1 file; relock with `bin/provision NAME --relock`")
    meta = data["metadata"]
    custom = meta.get("custom_metadata") or {}
    try:
        vpkgs = VirtualPackages.from_dict(json.loads(custom[_CUSTOM_VPKGS]))
    except (KeyError, ValueError) as exc:
        raise LockError(
            f"{lock_path}: metadata.custom_metadata.{_CUSTOM_VPKGS} missing or bad ({exc}); "
            f"the lock was not made by bin/provision: relock"
        ) from None
    return LockHeader(
        Path(lock_path),
        list(meta.get("platforms", [])),
        dict(meta.get("content_hash", {})),
        vpkgs,
        hashlib.sha256(raw).hexdigest(),
    )


def check_lock(spec: EnvSpec, lock_path: Path, platform: str) -> LockHeader:
    """Refuse a lock without `platform` or one that no longer matches `spec` (drift)."""
    header = read_header(lock_path)
    relock = f"relock with `bin/provision {spec.name} --relock` (file {spec.path})"
    if platform not in header.platforms or platform not in header.content_hash:
        raise LockError(
            f"{lock_path} has no packages for platform {platform} (it has "
            f"{', '.join(header.platforms) or 'none'}); add {platform} to `platforms:` and {relock}"
        )
    data = yaml.load(Path(lock_path).read_bytes(), Loader=_YAML_LOADER)
    inputs = (data["metadata"].get("inputs_metadata") or {}).values()
    if spec_sha256(spec.path) in {i.get("sha256") for i in inputs}:
        return header  # the very file this lock was made from
    if content_hash(spec, platform, header.virtual_packages) != header.content_hash[platform]:
        raise LockError(
            f"{lock_path} does not match {spec.path} (drift: the dependencies or channels changed "
            f"since it was locked); {relock}"
        )
    return header


# --- writing --------------------------------------------------------------------------------------


def make_lock(
    spec: EnvSpec,
    lock_path: Path,
    *,
    vpkgs: VirtualPackages,
    mirrors: list[str] | None,
    cache_dir: Path,
    pip_index: str = PYPI_INDEX,
    log=print,
) -> dict:
    """Solve and write `lock_path` atomically; returns a summary."""
    from conda_lock.lockfile import write_conda_lock_file
    from conda_lock.lockfile.v1.models import InputMeta, LockMeta, MetadataOption, TimeMeta
    from conda_lock.lockfile.v2prelim.models import Lockfile
    from conda_lock.models.channel import Channel

    lock_path = Path(lock_path).absolute()
    summary: dict = {"lockfile": str(lock_path), "platforms": {}}
    packages, hashes = [], {}
    for platform in spec.platforms:
        log(
            f"solving conda part for {platform} against {', '.join(mirrors or spec.channels)} "
            f"(virtual packages {vpkgs.as_dict()})"
        )
        solved = run_async(solve_conda(spec, platform, vpkgs, mirrors, cache_dir))
        conda = [_conda_locked(rec, url, platform) for rec, url in solved]
        python = next((p for p in conda if p.name == "python"), None)
        pip: list = []
        if spec.pip:
            if python is None:
                raise LockError(f"{spec.path}: a pip part needs python among the conda packages")
            py_version = ".".join(python.version.split(".")[:2])
            log(
                f"resolving pip part for python {py_version} manylinux (glibc {vpkgs.glibc}) against {pip_index}"
            )
            items = resolve_pip(spec.pip, py_version, vpkgs.glibc, pip_index)
            pip = _pip_locked(items, {p.name: p.version for p in conda}, platform, py_version, log)
        packages += conda + pip
        hashes[platform] = content_hash(spec, platform, vpkgs)
        summary["platforms"][platform] = {"conda": len(conda), "pip": len(pip)}

    try:
        source = os.path.relpath(spec.path, lock_path.parent)
    except ValueError:
        source = str(spec.path)
    meta = LockMeta(
        content_hash=hashes,
        channels=[
            Channel.from_string(channel_url(c, spec.path.parent) if c.startswith(("/", ".", "~")) else c)
            for c in spec.channels
        ],
        platforms=list(spec.platforms),
        sources=[source],
        time_metadata=TimeMeta.create(),
        inputs_metadata={
            source: InputMeta.create({MetadataOption.InputMd5, MetadataOption.InputSha}, spec.path)
        },
        custom_metadata={
            _CUSTOM_VPKGS: json.dumps(vpkgs.as_dict(), sort_keys=True),
            "lingbot_locked_by": "bin/provision --relock (provision/lock.py)",
        },
    )
    # written under its own name in a private directory (the writer puts the name in its help text),
    # then renamed over the old lock: a killed relock never leaves a half-written lock
    with tempfile.TemporaryDirectory(prefix=f".{lock_path.name}.", dir=lock_path.parent) as tmp:
        staged = Path(tmp, lock_path.name)
        write_conda_lock_file(
            Lockfile(package=packages, metadata=meta),
            staged,
            metadata_choices={MetadataOption.TimeStamp, MetadataOption.InputMd5, MetadataOption.InputSha},
        )
        os.replace(staged, lock_path)
    summary["content_hash"] = hashes
    return summary
