"""Per-launcher temporary directories: each records its launcher, and a later launch on the same host
removes those whose launcher is gone (a launcher killed with SIGKILL cannot remove its own).

    mark_launcher_dir(path)          in a directory this launcher made (compile_cache.py's node-local
                                     copy <scratch>/lingbot-<job>-<pid>-compile, which also holds the
                                     ranks' TMPDIR): writes path/.lingbot-launcher.json
    clean_stale_temp_dirs(environ)   at start: remove the dead launchers' directories; returns one line

A directory is removed only when all of these hold:
- it sits directly under a scratch dir (SLURM_TMPDIR, TMPDIR, the system temp dir), is a real directory
  (not a link) named `lingbot-*`, and is owned by this user (st_uid): another user's is never touched;
- it is this project's: it holds the record (project `lingbot-env`), or, made before records existed,
  its name is a compile copy's (`lingbot-<job>-<pid>-compile`): another project's is never touched;
- its launcher is not alive on this host: the record's boot id is not this boot's, or its pid runs no
  process, or runs one that started at another time (a reused pid is not the launcher). For a copy
  without a record, the pid from its name runs nothing, or a process that started after the directory
  was made (so it cannot be the one that made it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from provision.atomic import write_json_atomic
from provision.paths import PROJECT_NAME
from trainer.launcher.ownership import boot_id, pid_start

RECORD = ".lingbot-launcher.json"
LEGACY_COMPILE = re.compile(r"^lingbot-.+-(\d+)-compile$")


def mark_launcher_dir(path: Path) -> None:
    """Record this launcher (pid, its start time, boot id, uid) in a directory it owns."""
    pid = os.getpid()
    write_json_atomic(
        path / RECORD,
        {"project": PROJECT_NAME, "pid": pid, "pid_start": pid_start(pid), "boot_id": boot_id(),
         "uid": os.getuid(), "made": time.time()},
    )  # fmt: skip


def scratch_dirs(environ: dict[str, str]) -> list[Path]:
    out: list[Path] = []
    for text in (environ.get("SLURM_TMPDIR"), environ.get("TMPDIR"), tempfile.gettempdir()):
        if text and Path(text).is_dir() and Path(text).resolve() not in [p.resolve() for p in out]:
            out.append(Path(text))
    return out


def _alive(pid: int, started: float | None, made: float) -> bool:
    """Whether `pid` is still the process that made a directory at time `made` (or recorded `started`)."""
    now_start = pid_start(pid)
    if now_start is None:
        return False
    if started is not None:
        return abs(now_start - started) <= 1.0
    return now_start <= made + 1.0


def stale_dir(path: Path, uid: int, boot: str) -> bool:
    """Whether `path` is a dead launcher's directory of this project and this user (the rules above)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    if not path.is_dir() or path.is_symlink() or st.st_uid != uid or not path.name.startswith("lingbot-"):
        return False
    try:
        record = json.loads((path / RECORD).read_text())
    except FileNotFoundError:
        record = None
    except (OSError, ValueError):
        return False
    if record is None:
        legacy = LEGACY_COMPILE.match(path.name)
        return legacy is not None and not _alive(int(legacy.group(1)), None, st.st_mtime)
    if not isinstance(record, dict) or record.get("project") != PROJECT_NAME or record.get("uid") != uid:
        return False
    if record.get("boot_id") != boot:
        return True  # made before this host's last boot: its launcher is gone
    try:
        return not _alive(int(record["pid"]), record.get("pid_start"), float(record.get("made") or 0))
    except (KeyError, TypeError, ValueError):
        return False


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


@dataclass
class Cleaned:
    dirs: list[Path]
    bytes: int

    def line(self) -> str | None:
        if not self.dirs:
            return None
        where = ", ".join(sorted({str(p.parent) for p in self.dirs}))
        return (
            f"removed {len(self.dirs)} temporary dir(s) of launchers no longer running on this host "
            f"(under {where}; e.g. {self.dirs[0].name}): {self.bytes / 2**20:.1f} MiB freed"
        )


def clean(roots: list[Path]) -> Cleaned:
    uid, boot = os.getuid(), boot_id()
    out = Cleaned([], 0)
    for root in roots:
        try:
            entries = sorted(root.iterdir())
        except OSError:
            continue
        for path in entries:
            if not stale_dir(path, uid, boot):
                continue
            size = _size(path)
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                out.dirs.append(path)
                out.bytes += size
    return out


def clean_stale_temp_dirs(environ: dict[str, str]) -> list[str]:
    """Remove the dead launchers' directories of this user on this host; the line to say, if any."""
    line = clean(scratch_dirs(environ)).line()
    return [line] if line else []
