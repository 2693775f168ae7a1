"""What a provision will build, decided before anything is touched (`plan`), and whether the env is
already that (`up_to_date`).

Contract: `plan()` checks the env name against the spec, the lock's platform, one owner per package and
drift (provision.lock.check_lock), and computes the state hash the completion manifest records: the
lock file's sha256, the platform, the spec's variables, the version of the activate.d capture (the
computed variables follow from the locked packages), the hook templates and the sources of the
projects pip installs after the lock (this checkout, for its own environment.yml). The same hash in
a complete env's manifest means there is nothing to do. Another architecture (`--platform
linux-aarch64` on an x86 login node) needs no emulation: nothing of the target runs (provision/
crossarch.py); it is refused up front only where this machine cannot install its pip part or projects
(no wheel tags for that platform, no pypa `installer` here), and over an env of another platform (jobs
on the other nodes use it): such an env needs its own prefix.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from provision import activation, hooks
from provision import prefix as prefixes
from provision.envvars import EnvVar, format_env_vars
from provision.lock import check_lock, current_platform
from provision.lockfile import LockFile
from provision.paths import RepoRootError, repo_root
from provision.spec import EnvSpec, check_env_name


class ProvisionError(RuntimeError):
    """A provision that cannot go on; the message names the file and the fix. The env is untouched."""


def generations_dir(target: Path) -> Path:
    return target.parent / f".{target.name}.gens"


def _project_files(path: Path) -> list[Path]:
    """The files that make up a local pip project: its build config and its packages' sources."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"],
            cwd=path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        files = [path / f for f in listed if f]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in path.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.parts)]
    packages = {
        p.relative_to(path).parts[0]
        for p in files
        if p.name == "__init__.py" and len(p.relative_to(path).parts) == 2
    }
    keep = {"pyproject.toml", "setup.py", "setup.cfg"}
    return sorted(
        p
        for p in files
        if p.is_file() and (p.name in keep and p.parent == path or p.relative_to(path).parts[0] in packages)
    )


def project_digest(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for root in paths:
        for f in _project_files(root):
            digest.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass
class Plan:
    spec: EnvSpec  # the spec file's, or one read from the lock when no environment.yml is at hand
    lock_path: Path
    lock: LockFile
    platform: str
    target: Path
    entries: list[EnvVar]  # the spec's `variables:`; the computed ones come after linking
    state_hash: str
    projects: list[Path] = field(default_factory=list)  # installed with pip --no-deps after the lock
    spec_checked: bool = True  # False: no environment.yml, drift was not checked


def is_checkout_spec(spec: EnvSpec) -> bool:
    """True for this checkout's own environment.yml, whose env gets the checkout installed."""
    try:
        return spec.path.resolve() == (repo_root() / "environment.yml").resolve()
    except RepoRootError:
        return False


def spec_from_lock(lock: LockFile, name: str, platform: str) -> EnvSpec:
    """An EnvSpec for a lock with no environment.yml at hand: its conda package names, no pip
    requirements to re-lock, no variables (the compiler variables come from the linked prefix)."""
    conda = [p.name for p in lock.for_platform(platform, "conda")]
    return EnvSpec(lock.path, name, ["(from the lock)"], conda, [], [], {}, list(lock.platforms))


def plan(
    spec: EnvSpec | None,
    name: str | None,
    lock_path: Path,
    target: Path,
    platform: str | None = None,
    *,
    install_project: bool = True,
    vpkg_file: Path | None = None,
    log: Callable[[str], None] = print,
) -> Plan:
    """Everything checked before anything is touched: env name, lock platform, owners, drift."""
    platform = platform or current_platform()
    if spec is not None:
        check_env_name(spec, name)
    lock = check_lock(spec, lock_path, platform, vpkg_file=vpkg_file, log=log)
    if spec is None:
        if not name:
            raise ProvisionError(
                f"no environment.yml for {lock_path}: name the env: bin/provision NAME --lockfile {lock_path}"
            )
        spec = spec_from_lock(lock, name, platform)
    projects = list(spec.pip_local)
    if install_project and is_checkout_spec(spec):
        projects.append(repo_root())
    _check_platform_target(lock, platform, Path(target), projects)
    entries = spec.variable_entries()
    state = {
        "lock_sha256": lock.sha256,
        "platform": platform,
        "env_vars": format_env_vars(entries),
        "captured": activation.CAPTURE_VERSION,  # the rest of env-vars follows from the lock's packages
        "hooks": hooks.hooks_version(),
        "project": project_digest(projects) if projects else "",
    }
    state_hash = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
    return Plan(
        spec,
        Path(lock_path),
        lock,
        platform,
        Path(target),
        entries,
        state_hash,
        projects,
        spec_checked=spec.path != lock.path,
    )


def _check_platform_target(lock: LockFile, platform: str, target: Path, projects: list[Path]) -> None:
    from provision.crossarch import host_install_refusal

    try:
        there = prefixes.read_manifest(target).get("platform")
    except (OSError, ValueError):
        there = None
    if there and there != platform:
        raise ProvisionError(
            f"{target} holds the {there} env, and jobs on {there} nodes use it; an env for {platform} "
            f"needs its own place: pass --prefix (e.g. {target.parent}-{platform.split('-')[-1]}/"
            f"{target.name}) or set CONDA_ENVS_PATH to another directory"
        )
    steps = []
    if lock.for_platform(platform, "pip"):
        steps.append("the pip part")
    if projects:
        steps.append("this checkout's install (--no-project skips it)")
    why = host_install_refusal(platform, steps)
    if why:
        raise ProvisionError(why)


def up_to_date(p: Plan) -> bool:
    ok, _ = prefixes.completeness(p.target)
    return ok and prefixes.read_manifest(p.target).get("state_hash") == p.state_hash
