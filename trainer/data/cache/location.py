"""Where a config's dataset lives, and the lock that serialises writing there.

    root = resolve_data_path(cfg)     # data.path; a relative one is under the repository root
    with dataset_lock(root): ...      # generation and cache building, across ranks and concurrent runs
    CACHE_DIR                         # the latent cache's folder name, next to the episodes or under
                                      # data.cache_dir (trainer/data/cache/store.py cache_dir; torch-free here
                                      # for the launcher's preflight)

Read by trainer/data/stream.py (loading) and trainer/data/cache/prepare.py (preparing): neither imports the
other for these. The repository root is provision.paths.repo_root() (a checkout or an installed copy alike).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from provision.paths import repo_root

CACHE_DIR = ".latents"


def resolve_data_path(cfg) -> Path:
    path = Path(cfg.data.path).expanduser()
    return path if path.is_absolute() else repo_root() / path


@contextmanager
def dataset_lock(root: Path) -> Iterator[None]:
    """Serialise generation and cache building across ranks (and concurrent runs) on one machine."""
    root.parent.mkdir(parents=True, exist_ok=True)
    lock_path = root.parent / f".{root.name}.lock"
    try:
        handle = open(lock_path, "a")
    except OSError:
        yield  # read-only location: nothing will be written there either
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
