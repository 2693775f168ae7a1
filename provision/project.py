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

    lock = _open_lock(project / PROJECT_BUILD_LOCK)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        before = {path for path in litter() if path.exists()}
        try:
            yield
        finally:
            for path in litter() - before:
                shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(lock)  # the flock goes with it


def _open_lock(path: Path) -> int:
    """The lock file, made if missing; read-only when another user made it (a shared checkout: flock
    needs no write access on a local filesystem)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        return os.open(path, os.O_RDONLY)


def source_copy(project: Path, dest: Path) -> Path:
    """A private copy of `project`'s sources to build from: git's view of it (tracked and untracked files
    it does not ignore), else everything but dot-directories, build/, dist/, *.egg-info and __pycache__.
    setuptools builds in the source tree: a build there would leave build/ in the checkout, and an old
    build/ puts modules since removed into the wheel."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=project,
                                capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        skip = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__")
        return Path(shutil.copytree(project, dest, symlinks=True, ignore=skip))
    for rel in filter(None, listed):
        top = rel.split("/", 1)[0]
        if top in ("build", "dist") or top.endswith(".egg-info"):  # another build's output, not a source
            continue
        src = project / rel
        if src.is_file() or src.is_symlink():  # a tracked file deleted from the tree is listed: skipped
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    return dest
