"""Install exactly the locked records into an env, atomically and idempotently.

Atomicity. conda packages bake their install path into files (shebangs, pkg-config files, python's
sysconfig), so a prefix cannot be built in a staging directory and renamed into place. Instead every
provision builds a new *generation* in place, `<envs>/.<name>.gens/<id>/`, and the env's name is a
symlink to the current generation:

    1. build the generation: verified conda packages (py-rattler, no re-solve), the env's variables
       (from what the linked prefix holds: provision/activation.py), hooks, pip part (the env's own pip;
       for another platform, this machine's pip and pypa's installer: provision/wheel_install.py);
    2. write the completion manifest LAST (prefix.completeness accepts nothing without it);
    3. point a new symlink at it and rename() it over `<envs>/<name>` (atomic: no moment without an env);
    4. delete the previous generation.

A provision killed at any point leaves the name pointing at the previous good generation (or at the
complete new one), plus an unreferenced directory that the next provision deletes. One provision at a
time per env (flock next to it).

Idempotence. The manifest records a state hash of the lock file, the platform, the env's variables,
the hook templates and this project's sources; when the current env's matches, nothing is done.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from provision import activation, crossarch, hooks, project, wheel_install
from provision import prefix as prefixes
from provision.atomic import fsync_dir, write_json_atomic
from provision.fetch import FetchError, conda_records
from provision.lock import current_platform, run_async
from provision.lockfile import LockedPackage
from provision.pip_lock import requirement_lines
from provision.plan import Plan, ProvisionError, generations_dir, plan, up_to_date

__all__ = [
    "INSTALLERS",
    "Plan",
    "Progress",
    "ProvisionError",
    "generations_dir",
    "plan",
    "provision",
    "up_to_date",
]

INSTALLERS = ("rattler", "conda", "mamba", "micromamba")


def default_cache_dir() -> Path:
    """$LINGBOT_PKGS_DIR, else $XDG_CACHE_HOME/lingbot-provision (~/.cache/...): downloads, extracted
    packages."""
    if os.environ.get("LINGBOT_PKGS_DIR"):
        return Path(os.environ["LINGBOT_PKGS_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "lingbot-provision"


@dataclass
class Progress:
    """Per-phase progress lines on stderr (a batch log stays readable, unlike a redrawn bar)."""

    enabled: bool = True
    stream: TextIO = sys.stderr
    started: float = field(default_factory=time.monotonic)

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(
                f"[provision {time.monotonic() - self.started:6.1f}s] {message}", file=self.stream, flush=True
            )


class _LinkReporter:
    """py-rattler InstallerReporter: a line per linked package."""

    def __init__(self, progress: Progress, total: int):
        self.progress, self.total, self.done = progress, total, 0
        self.names: dict[int, str] = {}

    def on_link_start(self, operation: int, package_name: str) -> int:
        self.names[operation] = package_name
        return operation

    def on_link_complete(self, index: int) -> None:
        self.done += 1
        self.progress(f"link {self.done}/{self.total} {self.names.get(index, '')}")


# --- building a generation ------------------------------------------------------------------------


def _link_conda(records: list, gen: Path, installer: str, cache_dir: Path, progress: Progress) -> None:
    if installer == "rattler":
        import rattler

        cache = rattler.PackageCache.new_layered(
            [cache_dir / "pkgs"], validation_mode=rattler.ValidationMode.fast()
        )
        from rattler.exceptions import InstallerError, IoError, LinkError, TransactionError

        try:
            run_async(
                rattler.install(
                    records,
                    target_prefix=gen,
                    package_cache=cache,
                    show_progress=False,
                    reporter=_LinkReporter(progress, len(records)),  # type: ignore[arg-type]  # duck-typed
                    execute_link_scripts=False,
                )
            )
        except (InstallerError, IoError, LinkError, TransactionError) as exc:  # e.g. the disk is full
            causes = [" ".join(part.split()) for part in str(exc).split("Caused by:")]
            said = causes[0] if len(causes) == 1 else f"{causes[0]}: {causes[-1]}"  # what, and the root cause
            raise ProvisionError(
                f"linking the conda packages into {gen} failed: {said}; fix that (free space under "
                f"{gen.parent.parent}, its permissions) and run the same command again"
            ) from None
        return
    exe = shutil.which(installer)
    if exe is None:
        raise ProvisionError(f"--installer {installer}: {installer} is not on PATH; use --installer rattler")
    # an explicit file of the verified local packages: no solve, same files
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("@EXPLICIT\n" + "".join(f"{r.url}#{r.md5.hex()}\n" for r in records))
    try:
        proc = subprocess.run([exe, "create", "--yes", "--prefix", str(gen), "--file", f.name])
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        raise ProvisionError(f"{installer} create failed (exit {proc.returncode}); see its output above")


def _pip_install(
    p: Plan,
    gen: Path,
    entries: list[LockedPackage],
    index: str | None,
    find_links: str | None,
    progress: Progress,
) -> list[dict]:
    """The lock's pip part (--no-deps, hashes required), then the projects (this checkout) in their
    own step, each --no-deps: nothing but the lock decides a version. By the env's own pip; for another
    platform by this machine's (provision/wheel_install.py), which runs nothing of the env."""
    if not entries and not p.projects:
        return []
    python = gen / "bin" / "python"
    if not python.exists():
        if entries:
            raise ProvisionError(
                f"{p.lock_path} has a pip part but the env has no bin/python; add python to "
                f"{p.spec.path} and relock"
            )
        progress(f"no python in the env: skipping the pip install of {', '.join(map(str, p.projects))}")
        return []
    if crossarch.foreign(p.platform):
        return wheel_install.install_from_host(p, gen, entries, index, find_links, progress)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PYTHONNOUSERSITE": "1"}
    base = [
        str(python),
        "-m",
        "pip",
        "install",
        "--isolated",
        "--no-deps",
        "--disable-pip-version-check",
        "--no-warn-script-location",
    ]
    if entries:
        # the locked file by URL; with a mirror, the same version and hash from there
        lines = requirement_lines(entries, bool(index or find_links))
        reqs = gen / "conda-meta" / "lingbot-pip-requirements.txt"
        reqs.write_text("\n".join(lines) + "\n")
        cmd = base + ["--require-hashes", "-r", str(reqs)]
        if index:
            cmd += ["--index-url", index]
        if find_links:
            cmd += ["--no-index", "--find-links", find_links]
        progress(f"pip: installing {len(entries)} locked packages with hashes")
        if subprocess.run(cmd, env=env).returncode != 0:
            raise ProvisionError(
                "pip install of the locked pip part failed (output above); the env is untouched"
            )
    for local in p.projects:
        progress(f"pip: installing {local} (--no-deps, its own step: not part of the lock)")
        with project.in_tree_build(local):
            done = subprocess.run(base + ["--no-build-isolation", "--no-index", str(local)], env=env)
        if done.returncode != 0:
            raise ProvisionError(f"pip install of {local} failed (output above); the env is untouched")
    return [{"name": d.name, "version": d.version, "sha256": d.sha256} for d in entries]


def _write_manifest(p: Plan, gen: Path, records: list, pip: list, installer: str, seconds: float) -> None:
    files = [f"conda-meta/{r.name.normalized}-{r.version}-{r.build}.json" for r in records]
    files += [str(rel) for rel in (hooks.ENV_VARS_RELPATH, hooks.ACTIVATE_RELPATH, hooks.DEACTIVATE_RELPATH)]
    manifest = {
        "format": prefixes.MANIFEST_FORMAT,
        "complete": True,
        "env_name": p.spec.name,
        "prefix": str(p.target),
        "generation": os.path.realpath(gen),
        "platform": p.platform,
        "state_hash": p.state_hash,
        "lock_content_hash": p.lock.content_hash[p.platform],
        "lock_sha256": p.lock.sha256,
        "lockfile": str(p.lock_path),
        "spec": str(p.spec.path) if p.spec_checked else None,
        "projects": [str(x) for x in p.projects],
        "hooks_version": hooks.hooks_version(),
        "installer": installer,
        "packages": [
            {
                "name": r.name.normalized,
                "version": str(r.version),
                "build": str(r.build),
                "sha256": r.sha256.hex(),
            }
            for r in records
        ],
        "pip": pip,
        "files": files,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(seconds, 3),
    }
    write_json_atomic(prefixes.manifest_path(gen), manifest, indent=1, sort_keys=False)


@contextlib.contextmanager
def _env_lock(target: Path):
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.provision.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released by the kernel if we are killed
        yield


def _clean_stale(target: Path, keep: str | None, progress: Progress) -> None:
    """Remove what killed provisions left and generations older than the current one: everything but
    `keep` (the generation the name points at now, which becomes the previous one), half-made symlinks."""
    gens = generations_dir(target)
    for entry in sorted(gens.iterdir()) if gens.is_dir() else []:
        if os.path.realpath(entry) != keep:
            progress(f"removing leftover {entry}")
            shutil.rmtree(entry, ignore_errors=True)
    for leftover in target.parent.glob(f".{target.name}.link-*"):
        leftover.unlink(missing_ok=True)


@dataclass(frozen=True)
class Sources:
    """Where the package files come from: a conda mirror/local channel, a PyPI mirror, a wheel folder."""

    mirror: str | None = None
    pip_index: str | None = None
    pip_find_links: str | None = None


def _claim_target(target: Path) -> None:
    """The env name must be ours (a symlink to a generation) or free; an empty directory is taken. A link
    the user made (e.g. to an env on scratch), dangling or not, is never repointed."""
    if target.is_symlink():
        points = Path(os.readlink(target))
        ours = generations_dir(target)
        at = points if points.is_absolute() else target.parent / points
        if os.path.realpath(at.parent) != os.path.realpath(ours):
            raise ProvisionError(
                f"{target} is a symlink to {points} that bin/provision did not make (its envs link into "
                f"{ours}); remove the link (rm {target}) or choose another --prefix"
            )
        return
    if target.exists():
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()
        else:
            raise ProvisionError(
                f"{target} exists and was not made by bin/provision (it is not a symlink to a "
                f"generation); remove it (rm -rf {target}) or choose another --prefix"
            )


def _build(p: Plan, gen: Path, installer: str, src: Sources, cache_dir: Path, progress: Progress, started):
    """Everything that goes into a generation, manifest last; returns (conda records, pip entries)."""
    conda = sorted(p.lock.for_platform(p.platform, "conda"), key=lambda d: d.name)
    if not conda:
        raise ProvisionError(f"{p.lock_path} has no conda packages for {p.platform}; relock")
    try:
        records = conda_records(conda, src.mirror, cache_dir / "downloads", progress)
    except FetchError as exc:
        raise ProvisionError(str(exc)) from None
    _link_conda(records, gen, installer, cache_dir, progress)
    try:  # from what the prefix holds now: the packages' activate.d scripts, the compilers
        entries = activation.env_entries(gen, p.platform, p.entries, str(p.spec.path), log=progress)
    except activation.ActivationError as exc:
        raise ProvisionError(str(exc)) from None
    hooks.write_env_files(gen, entries, str(p.spec.path))
    pip_part = sorted(p.lock.for_platform(p.platform, "pip"), key=lambda d: d.name)
    pip = _pip_install(p, gen, pip_part, src.pip_index, src.pip_find_links, progress)
    _write_manifest(p, gen, records, pip, installer, time.monotonic() - started)
    fsync_dir(gen / "conda-meta")
    return records, pip


def _swap(target: Path, gen: Path) -> None:
    """Point the env's name at `gen` with one rename() (no moment without an env)."""
    link = target.parent / f".{target.name}.link-{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(os.path.relpath(gen, target.parent))
    os.replace(link, target)  # the atomic switch
    fsync_dir(target.parent)
    # The previous generation stays until the next provision: jobs started from it keep running.
    ok, reason = prefixes.completeness(target)
    if not ok:
        raise ProvisionError(f"internal error: the new env is not complete: {reason}")


def provision(
    p: Plan,
    *,
    installer: str = "rattler",
    mirror: str | None = None,
    cache_dir: Path | None = None,
    pip_index: str | None = None,
    pip_find_links: str | None = None,
    force: bool = False,
    progress: Progress | None = None,
    before_swap: Callable[[Path], None] | None = None,
) -> dict:
    """Build `p` into a new generation and swap it in; a no-op when the env is up to date."""
    progress = progress or Progress()
    cache_dir = Path(cache_dir or default_cache_dir())
    target, started = p.target, time.monotonic()
    if installer not in INSTALLERS:
        raise ProvisionError(f"--installer {installer}: choose one of {', '.join(INSTALLERS)}")
    if installer != "rattler" and crossarch.foreign(p.platform):
        # conda, mamba and micromamba byte-compile noarch packages with the env's own python when linking
        raise ProvisionError(
            f"--installer {installer} for {p.platform} on this {current_platform()} machine: its link step "
            f"runs the env's own python (byte-compiling noarch packages), a {p.platform} program; use the "
            f"default --installer rattler, which runs nothing of the target"
        )
    noop = {"action": "up-to-date", "prefix": str(target)}
    if not force and up_to_date(p):  # fast path, before taking the lock
        return {**noop, "seconds": round(time.monotonic() - started, 3)}
    with _env_lock(target):
        if not force and up_to_date(p):  # another provision just finished it
            return {**noop, "seconds": round(time.monotonic() - started, 3)}
        _claim_target(target)
        _clean_stale(target, os.path.realpath(target) if target.is_symlink() else None, progress)
        # A fresh name every time: reusing one (same second, same state) could delete the live generation.
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{p.state_hash[:8]}-{secrets.token_hex(4)}"
        gen = generations_dir(target) / stamp
        gen.parent.mkdir(parents=True, exist_ok=True)
        progress(f"building {target} as {gen.name} from {p.lock_path.name} ({p.platform})")
        try:
            src = Sources(mirror, pip_index, pip_find_links)
            records, pip = _build(p, gen, installer, src, cache_dir, progress, started)
            if before_swap is not None:
                before_swap(gen)
        except BaseException:
            shutil.rmtree(gen, ignore_errors=True)  # a failure leaves nothing (a kill: the next run cleans)
            raise
        _swap(target, gen)
        return {
            "action": "provisioned",
            "prefix": str(target),
            "generation": str(gen),
            "packages": len(records),
            "pip": len(pip),
            "seconds": round(time.monotonic() - started, 3),
        }
