"""Helpers for the full-disk and quota tests: a tiny CPU launch (2 ranks unless told), its outputs, the
one-line check.

`launch` runs `python -m trainer.launcher` (what bin/train execs) with the TINY overrides (or others);
`assert_said_once` checks the launcher's one out-of-space line (filesystem, path, free, needed, the fix)
and that no traceback reached the terminal. `Tmpfs` mounts a size-limited tmpfs (skips without root). The
rest of a run's helpers (clean_env, finish, summary, wait_for) are tests/support/runs.py's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import runs
from trainer.checkpoint.size import estimate_bytes, model_size
from trainer.config import load_config

TINY = runs.tiny(keep=2, tensorboard=False)


def tiny_config():
    overrides = dict(item.split("=", 1) for item in TINY)
    return load_config("furniture_train", cpu_scale=True, overrides=overrides)


def one_checkpoint() -> int:
    cfg = tiny_config()
    return estimate_bytes(cfg, model_size(cfg), 2)


class Tmpfs:
    def __init__(self, path: Path, size: int):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
        )
        if out.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({out.stderr.strip() or out.returncode}): needs root")
        self.mount = path

    def resize(self, size: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)

    def fill(self) -> Path:
        """Write a filler file until the filesystem is full; returns it (delete it to free the space)."""
        filler = self.path / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        return filler

    def umount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)


def launch(
    run_dir: Path,
    data_dir: Path,
    env: dict[str, str],
    *sets: str,
    extra_env=None,
    overrides: list[str] | None = None,
    nproc: int = 2,
) -> subprocess.Popen:
    """The tiny launch (TINY unless `overrides`, 2 ranks unless `nproc`), stdout and stderr apart (the
    one-line checks read stderr)."""
    return runs.launch(
        run_dir,
        data_dir,
        env,
        *sets,
        overrides=TINY if overrides is None else overrides,
        nproc=nproc,
        extra_env=extra_env,
        split_stderr=True,
    )


def launcher_lines(err: str, text: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[bin/train]") and text in line]


def assert_said_once(
    err: str, fs, limit: str = "out of space", fstype: str = "tmpfs", data: bool = False
) -> str:
    """The launcher's one line: the filesystem, the path, free, needed and the fix; no traceback."""
    lines = launcher_lines(err, f"{limit} on")
    assert len(lines) == 1, err
    line = lines[0]
    assert f"on {fs.mount} ({fstype})" in line and " free" in line and ", needed " in line, line
    assert "needed unknown" not in line and "fix: free space" in line, line
    if data:  # beside the data: the fix is the cache's or the data's place, not the run dir's
        assert "data.cache_dir" in line and "checkpoint.keep" not in line, line
    else:
        assert "checkpoint.keep" in line and "--run-dir" in line, line
    assert "Traceback" not in err, err
    return line
