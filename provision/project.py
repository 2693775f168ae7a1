"""A local project of a spec's pip part (this checkout: `./` in environment.yml's pip list), as the
provision builds it: never locked, installed in its own step (provision/install.py).

    with in_tree_build(project):      # the env's pip builds it in its own tree (this platform)
        ...
    source_copy(project, dest)        # a private copy to build another platform's wheel from
                                      # (provision/wheel_install.py: nothing of the target runs)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from provision.plan import ProvisionError

PROJECT_BUILD_LOCK = ".lingbot-build.lock"  # in a local project of the spec's pip part (this checkout)


@contextlib.contextmanager
def in_tree_build(project: Path) -> Iterator[None]:
    """One in-tree build of a local project at a time, and nothing of it left behind. setuptools builds in
    the project's own tree: build/ and *.egg-info appear there (and a build/ left there would put modules
    since removed into the next install). Two provisions of different envs from one checkout (an env per
    GPU kind, each with its own env lock) removed each other's build/ mid-build; a flock on
    PROJECT_BUILD_LOCK in the project (released by the kernel if the holder is killed; the file stays, as
    a lock file must) makes them take turns. What the install made there is removed after it; what was
    there before it is left as it was."""

    if not project.is_dir():  # a wheel or an archive: pip builds it elsewhere
        yield
        return

    def litter() -> set[Path]:
        return {project / "build", *project.glob("*.egg-info")}

    path = project / PROJECT_BUILD_LOCK
    lock = _open_lock(path)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as exc:  # e.g. NFS wants a writable file for an exclusive lock
            raise _lock_error(path, "take", exc) from exc
        before = {made for made in litter() if made.exists()}
        try:
            yield
        finally:
            for made in litter() - before:
                shutil.rmtree(made, ignore_errors=True)
    finally:
        os.close(lock)  # the flock goes with it


def _open_lock(path: Path) -> int:
    """The lock file, made if missing; read-only when another user made it (a shared checkout: flock
    needs no write access on a local filesystem)."""
    try:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            return os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise _lock_error(path, "open", exc) from exc


def _lock_error(path: Path, what: str, exc: OSError) -> ProvisionError:
    return ProvisionError(
        f"{path}: cannot {what} the build lock ({exc.strerror or exc}); setuptools builds this project in "
        "its own folder, so it must be writable by this user: provision from a checkout of your own, or "
        "leave the project out (--no-project)"
    )


def source_copy(project: Path, dest: Path) -> Path:
    """A private copy of `project`'s sources to build from: git's view of it (tracked and untracked files
    it does not ignore, less untracked build/, dist/, *.egg-info), else everything but dot-directories,
    build/, dist/, *.egg-info and __pycache__.
    setuptools builds in the source tree: a build there would leave build/ in the checkout, and an old
    build/ puts modules since removed into the wheel."""
    try:
        tracked = _git_files(project, "-c")
        untracked = _git_files(project, "-o", "--exclude-standard")
    except (OSError, subprocess.CalledProcessError):
        skip = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__")
        return Path(shutil.copytree(project, dest, symlinks=True, ignore=skip))
    for rel in filter(None, [*tracked, *(r for r in untracked if not _build_output(r))]):
        src = project / rel
        if src.is_file() or src.is_symlink():  # a tracked file deleted from the tree is listed: skipped
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    return dest


def _git_files(project: Path, *flags: str) -> list[str]:
    done = subprocess.run(["git", "ls-files", *flags, "-z"], cwd=project, capture_output=True, check=True)
    return done.stdout.decode().split("\0")


def _build_output(rel: str) -> bool:
    """An untracked path that a build made (another provision's in-tree build running, or one left
    behind): never part of the wheel. A tracked build/ is the project's own source and stays."""
    top = rel.split("/", 1)[0]
    return top in ("build", "dist") or top.endswith(".egg-info")
