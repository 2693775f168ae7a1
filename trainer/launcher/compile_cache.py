"""Compile caches (Triton, Inductor) on a network filesystem become node-local copies for one job."""

from __future__ import annotations

import shutil
from pathlib import Path


def localise_compile_caches(env: dict[str, str], scratch: Path, job: str) -> list[str]:
    """Point Triton's/Inductor's caches at a node-local copy when they live on a network filesystem.

    Ranks compiling into one cache over NFS race on its locks and renames; a per-job local directory
    seeded from the shared cache keeps the warm entries without the race. Returns what was done.
    """
    from provision.nodeinfo import filesystem_type, is_network_fs

    notes = []
    defaults = {"TRITON_CACHE_DIR": str(Path(env.get("HOME", Path.home())) / ".triton" / "cache")}
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        shared = env.get(var) or defaults.get(var)
        if not shared:
            continue
        try:
            fstype = filesystem_type(shared)
        except (OSError, ValueError):
            continue
        if not is_network_fs(fstype):
            continue
        local = scratch / f"lingbot-{job}-{var.lower()}"
        if Path(shared).is_dir():
            shutil.copytree(shared, local, dirs_exist_ok=True, symlinks=True)
        local.mkdir(parents=True, exist_ok=True)
        env[var] = str(local)
        notes.append(f"{var} {shared} is on {fstype}: this job uses the node-local copy {local}")
    return notes
