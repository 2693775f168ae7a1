"""Drift: does conda-lock.yml still match environment.yml? Judged by conda-lock's own rule.

metadata.content_hash[platform] is conda-lock's content hash (conda_lock.content_hash.
compute_content_hashes) of conda-lock's parse of the spec plus virtual packages: those the lock records
(bin/provision's metadata.custom_metadata), else a --virtual-package-spec file, else conda-lock's defaults;
check_lock says which it assumed. An unchanged spec file (its sha256 in metadata.inputs_metadata) is
recognised without importing conda-lock. check_lock also refuses a lock without the platform and one that
locks a name in both the conda and the pip part.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from provision import vpkgs
from provision.lockfile import CUSTOM_VPKGS, LockError, LockFile, read_lock
from provision.spec import EnvSpec, provision_command
from provision.vpkgs import VirtualPackages, spec_document

# Where the virtual packages of a content hash come from: bin/provision's record, a
# --virtual-package-spec file, or (None) conda-lock's own defaults.
VpkgSource = VirtualPackages | Path | None


def _virtual_package_repo(source: VpkgSource, platform: str, tmp: Path):
    from conda_lock.virtual_package import (
        default_virtual_package_repodata,
        virtual_package_repo_from_specification,
    )

    if source is None:
        return default_virtual_package_repodata()
    if isinstance(source, VirtualPackages):
        path = Path(tmp, "virtual-packages.yml")
        path.write_text(yaml.safe_dump(spec_document({platform: source})))
        source = path
    return virtual_package_repo_from_specification(source)


def content_hash(spec: EnvSpec, platform: str, vpkgs: VpkgSource) -> str:
    """conda-lock's content hash of the lockable part of `spec` for `platform` (see module doc)."""
    from conda_lock.content_hash import compute_content_hashes
    from conda_lock.src_parser import make_lock_spec

    with tempfile.TemporaryDirectory(prefix="lingbot-lock-") as tmp:
        selected = spec.for_platform(platform)  # the lines conda-lock's selectors keep for it
        deps: list = list(selected.conda)
        if selected.pip or spec.pip_local:
            deps.append({"pip": list(selected.pip)})
        lockable = Path(tmp, "environment.yml")  # channels as written: conda-lock hashes them so
        lockable.write_text(
            yaml.safe_dump({"name": spec.name, "channels": spec.channels, "dependencies": deps})
        )
        mapping = Path(tmp, "pypi-mapping.json")  # names map to themselves; no download of conda-lock's map
        mapping.write_text("{}")
        lock_spec = make_lock_spec(
            src_files=[lockable], platform_overrides=[platform], mapping_url=str(mapping)
        )
        repo = _virtual_package_repo(vpkgs, platform, Path(tmp))
        try:
            return compute_content_hashes(lock_spec, repo)[platform]
        finally:  # conda-lock makes the fake repodata folder with mkdtemp and removes it only at exit,
            # which bin/provision's os._exit skips (provision/cli.py): one folder left in $TMPDIR a run
            shutil.rmtree(repo.base_path, ignore_errors=True)


def spec_sha256(spec_path: Path) -> str:
    # conda-lock's InputMeta hashes the text read as UTF-8
    return hashlib.sha256(Path(spec_path).read_text().encode("utf-8")).hexdigest()


def _hash_candidates(
    spec: EnvSpec, lock: LockFile, vpkg_file: Path | None, platform: str
) -> list[tuple[str, VpkgSource]]:
    """The virtual packages to recompute the content hash with, each with how it is described."""
    recorded = lock.recorded_vpkgs_for(platform)
    if recorded is not None:
        return [
            (
                f"the virtual packages the lock records for {platform} (metadata.custom_metadata."
                f"{CUSTOM_VPKGS}: {recorded.as_dict()})",
                recorded,
            )
        ]
    out: list[tuple[str, VpkgSource]] = []
    if vpkg_file is not None:
        out.append((f"the virtual packages of {vpkg_file} (--virtual-package-spec)", vpkg_file))
    out.append(("conda-lock's default virtual packages (the lock records none)", None))
    beside = spec.path.parent / vpkgs.DEFAULT_FILE_NAME
    if vpkg_file is None and beside.is_file():  # conda-lock reads it from its working directory
        out.append((f"the virtual packages of {beside} (conda-lock's default file)", beside))
    return out


def check_lock(
    spec: EnvSpec | None,
    lock_path: Path,
    platform: str,
    *,
    vpkg_file: Path | None = None,
    log: Callable[[str], None] = print,
) -> LockFile:
    """Refuse a lock without `platform`, one that locks a name in both parts, or one that no longer
    matches `spec` by conda-lock's content-hash rule (drift). `spec` None: no environment.yml at hand,
    the lock installs with a warning that drift cannot be checked."""
    lock = read_lock(lock_path)
    if spec is not None:
        relock = f"relock with `{provision_command(spec, lock_path, '--relock')}`"
    else:
        relock = f"relock with `bin/provision NAME -f ENVIRONMENT.YML --lockfile {lock_path} --relock`"
    from provision.spec import SELECTORS

    if platform not in SELECTORS:  # a typo is not a platform to add to `platforms:`
        raise LockError(
            f"--platform {platform}: not a conda platform this tool knows ({', '.join(SELECTORS)})"
        )
    if platform not in lock.platforms:
        raise LockError(
            f"{lock_path} has no packages for platform {platform} (it has "
            f"{', '.join(lock.platforms) or 'none'}); add {platform} to `platforms:` and {relock}"
        )
    if platform not in lock.content_hash:
        raise LockError(f"{lock_path}: metadata.content_hash has no entry for {platform}; {relock}")
    both = lock.owner_conflicts(platform)
    if both:
        raise LockError(
            f"{lock_path} locks {', '.join(both)} in both the conda and the pip part for {platform}: pip "
            f"would overwrite files the conda package owns; {relock} (it gives each package one owner)"
        )
    if spec is None:
        log(
            f"WARNING: no environment.yml for {lock_path}: drift cannot be checked; installing the lock "
            f"as it is (pass --file environment.yml to check it)"
        )
        return lock
    if spec_sha256(spec.path) in lock.inputs_sha256:
        return lock  # the very file this lock was made from
    candidates = _hash_candidates(spec, lock, vpkg_file, platform)
    for label, source in candidates:
        if content_hash(spec, platform, source) == lock.content_hash[platform]:
            log(f"{lock_path} matches {spec.path} (conda-lock content hash with {label})")
            return lock
    raise LockError(
        f"{lock_path} does not match {spec.path} (drift: the dependencies or channels changed since it "
        f"was locked; conda-lock's content hash computed with "
        f"{'; then with '.join(c[0] for c in candidates)}); "
        f"{relock}"
    )
