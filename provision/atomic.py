"""Atomic file writes: a reader (or a run after kill -9) sees the old file or the whole new one, never a part.

Shared by everything that leaves state on disk: env manifests and hooks, envcheck reports, run summaries,
sbatch scripts, dataset episodes. Standard library only: the trainer imports it inside provisioned envs.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, mode: int = 0o644) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike[str], obj, *, indent: int = 2, sort_keys: bool = True) -> None:
    write_atomic(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename inside `path` durable (the directory entry itself is flushed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
