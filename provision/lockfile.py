"""The one reader of conda-lock.yml (conda-lock's v1 format), for bin/provision and bin/envcheck.

Contract: `read_lock(path)` returns a `LockFile` or raises `LockError` naming the file (and the package
or key) and the fix. It reads any v1 file conda-lock 4.x writes, including v1 written from its v2
model, where a package in several categories appears once per category (merged back here: one
`LockedPackage` with all its categories). Checked on read: every entry's manager is conda or pip and
its platform is one the lock declares (anything else is an error naming it); conda entries carry md5
and sha256, pip entries sha256; no name is in both the conda and the pip part of a platform
(`owner_conflicts`, refused at install). What bin/provision records beyond conda-lock's fields lives
in metadata.custom_metadata (`lingbot_virtual_packages`: {platform: {__glibc: ..., ...}}, or one
flat mapping for the first platform in locks written before per-platform records; `lingbot_dropped`); a
lock without them (one written by conda-lock itself) is just as valid.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from provision.vpkgs import VirtualPackages

MANAGERS = ("conda", "pip")
CUSTOM_VPKGS = "lingbot_virtual_packages"
CUSTOM_DROPPED = "lingbot_dropped"
INSTALLED_CATEGORIES = frozenset({"main", "dev"})  # conda-lock install's default (dev included)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class LockError(ValueError):
    """A lock that cannot be made or used; the message names the file and the fix."""


@dataclass(frozen=True)
class LockedPackage:
    name: str
    version: str
    manager: str  # conda | pip
    platform: str
    url: str
    md5: str | None
    sha256: str | None
    build: str | None
    categories: frozenset[str]

    @property
    def file_name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1].split("#", 1)[0]

    @property
    def subdir(self) -> str:
        return self.url.rstrip("/").rsplit("/", 2)[-2]


@dataclass(frozen=True)
class LockFile:
    path: Path
    sha256: str  # of the file's bytes: any relock changes it
    platforms: list[str]
    content_hash: dict[str, str]
    inputs_sha256: frozenset[str]  # sha256 of the spec files it was made from (when recorded)
    # per platform, what bin/provision --relock assumed (conda-lock records none)
    recorded: dict[str, VirtualPackages]
    dropped: dict[str, str] = field(default_factory=dict)  # conda records --relock left to pip, with why
    packages: list[LockedPackage] = field(default_factory=list)

    def for_platform(self, platform: str, manager: str | None = None) -> list[LockedPackage]:
        return [
            p
            for p in self.packages
            if p.platform == platform
            and (manager is None or p.manager == manager)
            and p.categories & INSTALLED_CATEGORIES
        ]

    def recorded_vpkgs_for(self, platform: str) -> VirtualPackages | None:
        return self.recorded.get(platform)

    @property
    def recorded_vpkgs(self) -> VirtualPackages | None:
        """The first platform's recorded virtual packages (None: the lock records none)."""
        return self.recorded.get(self.platforms[0]) if self.platforms else None

    def versions(self, platform: str) -> dict[tuple[str, str], str]:
        return {(p.manager, p.name): p.version for p in self.for_platform(platform)}

    def owner_conflicts(self, platform: str) -> list[str]:
        """Names locked in both the conda and the pip part for `platform` (pip would overwrite the files
        conda's package owns)."""
        conda = {_canonical(p.name) for p in self.for_platform(platform, "conda")}
        return sorted(conda & {_canonical(p.name) for p in self.for_platform(platform, "pip")})


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _load(path: Path) -> tuple[bytes, dict[str, Any]]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise LockError(f"{path}: no lock file; create it with `bin/provision NAME --relock`") from None
    try:
        data = yaml.load(raw, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise LockError(
            f"{where}: malformed YAML ({getattr(exc, 'problem', exc)}); relock with "
            f"`bin/provision NAME --relock`"
        ) from None
    if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("metadata"), dict):
        version = data.get("version") if isinstance(data, dict) else None
        raise LockError(
            f"{path}: not a conda-lock v1 file (version: {version!r}); write v1 with conda-lock or "
            f"`bin/provision NAME --relock`"
        )
    return raw, data


def _typed(path: Path, key: str, value: Any, kind: type, what: str) -> Any:
    """`value` (None: an empty `kind`), or a LockError naming the key when it is not a `kind`."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise LockError(f"{path}: {key} must be {what}, not {type(value).__name__} {value!r:.60}; relock")
    return value


def _entry(path: Path, index: int, raw: Any, platforms: list[str]) -> LockedPackage:
    where = f"{path}: package[{index}]"
    if not isinstance(raw, dict):
        raise LockError(f"{where} is not a mapping")
    name = raw.get("name")
    where = f"{where} ({name})"
    manager, platform = raw.get("manager"), raw.get("platform")
    if manager not in MANAGERS:
        raise LockError(
            f"{where}: unknown manager {manager!r} (bin/provision installs {' and '.join(MANAGERS)}); "
            f"relock without it"
        )
    if platform not in platforms:
        raise LockError(
            f"{where}: platform {platform!r} is not one of metadata.platforms {platforms}; the lock is "
            f"inconsistent: relock"
        )
    hashes = _typed(path, f"package[{index}] ({name}) hash", raw.get("hash"), dict, "a mapping (md5, sha256)")
    md5, sha256 = hashes.get("md5"), hashes.get("sha256")
    if not raw.get("url") or not isinstance(name, str) or raw.get("version") is None:
        raise LockError(f"{where}: needs name, version and url")
    if manager == "conda" and not (md5 and sha256):
        raise LockError(f"{where}: a conda entry needs hash.md5 and hash.sha256; relock")
    if manager == "pip" and not sha256:
        raise LockError(f"{where}: a pip entry needs hash.sha256; relock")
    category = raw.get("category", "main")
    categories = raw.get("categories") or [category]
    if isinstance(categories, str) or not isinstance(categories, list):  # "main" would be m, a, i, n
        raise LockError(f"{where}: categories must be a list (e.g. [main]), not {categories!r:.60}; relock")
    return LockedPackage(
        name=name,
        version=str(raw["version"]),
        manager=manager,
        platform=platform,
        url=str(raw["url"]),
        md5=md5,
        sha256=sha256,
        build=str(raw["build"]) if raw.get("build") is not None else None,
        categories=frozenset(str(c) for c in categories),
    )


def _merge(path: Path, entries: list[LockedPackage]) -> list[LockedPackage]:
    """One package per (platform, manager, name): v1 repeats a package once per category."""
    merged: dict[tuple[str, str, str], LockedPackage] = {}
    for e in entries:
        key = (e.platform, e.manager, e.name)
        seen = merged.get(key)
        if seen is None:
            merged[key] = e
            continue
        if (seen.version, seen.url, seen.sha256) != (e.version, e.url, e.sha256):
            raise LockError(
                f"{path}: {e.manager} package {e.name} ({e.platform}) is locked twice with different "
                f"versions or files ({seen.version} {seen.url}, {e.version} {e.url}); relock"
            )
        merged[key] = LockedPackage(**{**seen.__dict__, "categories": seen.categories | e.categories})
    return list(merged.values())


def _recorded_vpkgs(path: Path, custom: dict[str, Any], platforms: list[str]) -> dict[str, VirtualPackages]:
    """{platform: VirtualPackages}; a lock from before per-platform records holds one flat mapping,
    which was the (then only) first platform's."""
    if CUSTOM_VPKGS not in custom:
        return {}
    try:
        data = json.loads(custom[CUSTOM_VPKGS])
        if all(str(k).startswith("__") for k in data):
            return {platforms[0]: VirtualPackages.from_dict(data)}
        return {str(p): VirtualPackages.from_dict(v) for p, v in data.items()}
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise LockError(
            f"{path}: metadata.custom_metadata.{CUSTOM_VPKGS} is not readable ({exc}); remove the key "
            f"or relock with `bin/provision NAME --relock`"
        ) from None


def read_lock(path: Path | str) -> LockFile:
    path = Path(path)
    raw, data = _load(path)
    meta = data["metadata"]
    listed = _typed(path, "metadata.platforms", meta.get("platforms"), list, "a list (e.g. [linux-64])")
    platforms = [str(p) for p in listed]
    if not platforms:
        raise LockError(f"{path}: metadata.platforms is empty; relock")
    custom = _typed(path, "metadata.custom_metadata", meta.get("custom_metadata"), dict, "a mapping")
    packages = _typed(path, "package", data.get("package"), list, "a list of packages")
    entries = [_entry(path, i, p, platforms) for i, p in enumerate(packages)]
    inputs = _typed(path, "metadata.inputs_metadata", meta.get("inputs_metadata"), dict, "a mapping")
    hashes = _typed(
        path, "metadata.content_hash", meta.get("content_hash"), dict, "a mapping {platform: hash}"
    )
    try:
        dropped = json.loads(custom.get(CUSTOM_DROPPED) or "{}")
    except ValueError:
        dropped = {}
    return LockFile(
        path=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        platforms=platforms,
        content_hash={str(k): str(v) for k, v in hashes.items()},
        inputs_sha256=frozenset(str(i.get("sha256")) for i in inputs.values() if isinstance(i, dict)),
        recorded=_recorded_vpkgs(path, custom, platforms),
        dropped=dropped if isinstance(dropped, dict) else {},
        packages=_merge(path, entries),
    )
