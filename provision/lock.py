"""conda-lock.yml: solve environment.yml's conda part with py-rattler, lock its pip part against PyPI
with hashes, and write conda-lock's v1 format with conda-lock's own models and writer.

Drift detection (provision/drift.py): metadata.content_hash[platform] is conda-lock's own content hash
(conda_lock.content_hash.compute_content_hashes) of conda-lock's parse of environment.yml plus the
virtual packages the solve assumed (kept in metadata.custom_metadata, so the hash can be recomputed).
Local pip paths and `variables:` are not part of it: they are not locked. The sha256 of the spec file
is kept in metadata.inputs_metadata, so an unchanged spec is recognised without importing conda-lock
(the fast path of a no-op provision); only when the file changed is the content hash recomputed.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform as host
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from provision.drift import check_lock, content_hash
from provision.lockfile import CUSTOM_DROPPED, CUSTOM_VPKGS, LockError, LockFile, read_lock
from provision.paths import repo_root
from provision.spec import EnvSpec
from provision.vpkgs import VirtualPackages

__all__ = ["LockError", "LockFile", "VirtualPackages", "check_lock", "content_hash", "make_lock", "read_lock"]

PYPI_INDEX = "https://pypi.org/simple"


def snapshot_dir() -> Path:
    """The offline conda-forge repodata subset beside the checkout (../shared/conda-forge-snapshot)."""
    return repo_root().parent / "shared" / "conda-forge-snapshot"


def current_platform() -> str:
    system = {"Linux": "linux", "Darwin": "osx", "Windows": "win"}.get(host.system(), host.system().lower())
    machine = {"x86_64": "64", "AMD64": "64", "aarch64": "aarch64", "arm64": "arm64"}.get(
        host.machine(), host.machine()
    )
    return f"{system}-{machine}"


def channel_url(channel: str, base: Path) -> str:
    """conda's channel names to URLs: a name -> conda.anaconda.org, a path (relative to `base`) -> file://."""
    if "://" in channel:
        return channel.rstrip("/")
    if channel.startswith(("/", ".", "~")):
        return (base / Path(channel).expanduser()).resolve().as_uri()
    return f"https://conda.anaconda.org/{channel}"


def default_mirrors(spec: EnvSpec) -> list[str] | None:
    """Offline default: solve conda-forge against the repodata snapshot next to the checkout."""
    snapshot = snapshot_dir()
    if spec.channels == ["conda-forge"] and (snapshot / "noarch" / "repodata.json").exists():
        return [snapshot.as_uri()]
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
    # a mirror given as a directory is a file:// URL, so the solved URLs map back onto the spec's channel
    sources = [channel_url(m, Path.cwd()) for m in mirrors] if mirrors else canonical
    if len(sources) != len(canonical):
        raise LockError(
            f"--channel was given {len(sources)} times; {spec.path} lists {len(canonical)} channels"
        )
    try:
        records = await solve(
            sources=[Channel(s) for s in sources],
            specs=spec.conda,
            gateway=Gateway(cache_dir=cache_dir),
            platforms=[platform, "noarch"],  # type: ignore[list-item]  # rattler's Literal of subdirs
            virtual_packages=vpkgs.for_rattler(),
        )
    except Exception as exc:  # rattler raises its own exception types with the solver's explanation
        raise LockError(
            f"cannot solve the conda part of {spec.path} for {platform} against {', '.join(sources)}:"
            f"\n{exc}\n"
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


# --- writing --------------------------------------------------------------------------------------


def _conda_spec_for(name: str, unmet: list) -> str | None:
    """A conda match spec asking for a `name` that every pip requirement in `unmet` accepts, or None
    where the PEP 440 specifier has no plain conda equivalent."""
    parts = []
    for _, req in unmet:
        for s in req.specifier:
            if s.operator not in (">=", ">", "<", "<=", "==") or "*" in s.version:
                return None
            parts.append(f"{s.operator}{s.version}")
    return f"{name} {','.join(sorted(set(parts)))}" if parts else None


def _solve_once(spec: EnvSpec, platform: str, vp: VirtualPackages, mirrors, cache_dir: Path, pip_index, log):
    """(conda entries, pip's install items, python version) for one solve of both parts."""
    from provision.pip_lock import pip_arch, resolve_pip

    solved = run_async(solve_conda(spec, platform, vp, mirrors, cache_dir))
    conda = [_conda_locked(rec, url, platform) for rec, url in solved]
    if not spec.pip:
        return conda, [], ""
    python = next((p for p in conda if p.name == "python"), None)
    if python is None:
        raise LockError(f"{spec.path}: a pip part needs python among the conda packages")
    py_version = ".".join(python.version.split(".")[:2])
    arch = pip_arch(platform)
    log(f"resolving pip part for python {py_version} manylinux {arch} (glibc {vp.glibc}) against {pip_index}")
    return conda, resolve_pip(spec.pip, py_version, vp.glibc, pip_index, arch=arch), py_version


def _solve_platform(
    spec: EnvSpec, platform: str, vp: VirtualPackages, mirrors, cache_dir: Path, pip_index: str, log
) -> tuple[list, list, dict[str, str]]:
    """(conda entries, pip entries, dropped conda records with why) for one platform, one owner each.

    A name both parts resolve, with conda's version rejected by a pip requirement, is first re-solved
    on the conda side with that requirement; if conda cannot satisfy it, the conda record is dropped
    (pip owns the package) and the reason is kept in the lock."""
    from provision.pip_lock import conda_shortfalls, pip_arch, pip_locked

    conda, items, py = _solve_once(spec, platform, vp, mirrors, cache_dir, pip_index, log)
    arch = pip_arch(platform)
    short = conda_shortfalls(items, {p.name: p.version for p in conda}, py, arch) if items else {}
    wanted = [_conda_spec_for(name, unmet) for name, unmet in short.items()]
    if short and all(wanted):
        extra = [w for w in wanted if w]
        log(f"one owner per package: asking conda for {', '.join(extra)} (pip requires it)")
        try:
            retry = _solve_once(
                _with_conda_specs(spec, extra), platform, vp, mirrors, cache_dir, pip_index, log
            )
        except LockError as exc:
            log(f"one owner per package: conda cannot provide {', '.join(extra)}: {str(exc).splitlines()[0]}")
        else:
            if not conda_shortfalls(retry[1], {p.name: p.version for p in retry[0]}, retry[2], arch):
                conda, items, py = retry
                short = {}
    from packaging.utils import canonicalize_name

    dropped: dict[str, str] = {}
    for name, unmet in short.items():
        have = next(p.version for p in conda if canonicalize_name(p.name) == name)
        why = "; ".join(f"{who} needs {r}" for who, r in unmet)
        dropped[name] = f"conda's {name} {have} does not satisfy pip's requirements ({why}): pip owns it"
        log(f"one owner per package: dropped the conda record {name} {have}: {dropped[name]}")
    conda = [p for p in conda if canonicalize_name(p.name) not in short]
    return conda, pip_locked(items, {p.name for p in conda}, platform, py, pip_arch(platform)), dropped


def _with_conda_specs(spec: EnvSpec, extra: list[str]) -> EnvSpec:
    from dataclasses import replace

    return replace(spec, conda=[*spec.conda, *extra])


def make_lock(
    spec: EnvSpec,
    lock_path: Path,
    *,
    vpkgs_by_platform: dict[str, VirtualPackages],
    mirrors: list[str] | None,
    cache_dir: Path,
    pip_index: str = PYPI_INDEX,
    log=print,
) -> dict:
    """Solve and write `lock_path` atomically; returns a summary."""
    lock_path = Path(lock_path).absolute()
    summary: dict = {"lockfile": str(lock_path), "platforms": {}}
    packages, hashes, dropped = [], {}, {}
    for platform in spec.platforms:
        vp = vpkgs_by_platform.get(platform)
        if vp is None:
            raise LockError(
                f"no virtual packages for {platform}: add subdirs.{platform} to the virtual-package file"
            )
        log(
            f"solving conda part for {platform} against {', '.join(mirrors or spec.channels)} "
            f"(virtual packages {vp.as_dict()})"
        )
        conda, pip, gone = _solve_platform(
            spec.for_platform(platform), platform, vp, mirrors, cache_dir, pip_index, log
        )
        packages += conda + pip
        dropped.update(gone)
        hashes[platform] = content_hash(spec, platform, vp)
        summary["platforms"][platform] = {"conda": len(conda), "pip": len(pip), "dropped_conda": sorted(gone)}
    _write(spec, lock_path, packages, hashes, {p: vpkgs_by_platform[p] for p in spec.platforms}, dropped)
    summary["content_hash"] = hashes
    return summary


def _write(
    spec: EnvSpec, lock_path: Path, packages: list, hashes: dict, vps: dict[str, VirtualPackages], dropped
) -> None:
    from conda_lock.lockfile import write_conda_lock_file
    from conda_lock.lockfile.v1.models import InputMeta, LockMeta, MetadataOption, TimeMeta
    from conda_lock.lockfile.v2prelim.models import Lockfile
    from conda_lock.models.channel import Channel

    try:
        source = os.path.relpath(spec.path, lock_path.parent)
    except ValueError:
        source = str(spec.path)
    custom = {
        CUSTOM_VPKGS: json.dumps({p: v.as_dict() for p, v in vps.items()}, sort_keys=True),
        "lingbot_locked_by": "bin/provision --relock (provision/lock.py)",
    }
    if dropped:
        custom[CUSTOM_DROPPED] = json.dumps(dropped, sort_keys=True)
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
        custom_metadata=custom,
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
