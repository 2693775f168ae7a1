"""Helpers for the full-disk and quota tests: a tiny 2-rank CPU launch, its outputs, the one-line check.

`launch` runs `python -m trainer.launch` (what bin/train execs) with the TINY overrides; `assert_said_once`
checks the launcher's one out-of-space line (filesystem, path, free, needed, the fix) and that no traceback
reached the terminal. `Tmpfs` mounts a size-limited tmpfs (skips without root); `clean_env` is the launch
environment (no provisioned env, no LINGBOT_/SLURM_ variables).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.checkpoint_size import estimate_bytes, model_size
from trainer.config import load_config

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
TINY = [
    "model.dim=48", "model.heads=2", "model.depth=2", "model.latent_size=8", "model.attn_block=16",
    "data.frames=4", "data.generated_episodes=4", "data.generated_length=20",
    "train.grad_accum=2", f"train.steps={STEPS}", "train.warmup_steps=2",
    "checkpoint.every=2", "checkpoint.keep=2", "log.tensorboard=false",
]  # fmt: skip
TIMEOUT = 600  # a deadline per launch (each runs envcheck, which compiles; slow on a loaded machine)


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


def clean_env(no_envs: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LINGBOT_", "SLURM_", "CONDA_PREFIX"))}
    env["CONDA_ENVS_PATH"] = str(no_envs)  # no provisioned env: the tool env
    env["OMP_NUM_THREADS"] = "1"
    return env


def launch(
    run_dir: Path, data_dir: Path, env: dict[str, str], *sets: str, extra_env=None
) -> subprocess.Popen:
    argv = [sys.executable, "-m", "trainer.launch", "furniture_train", "2", "--run-dir", str(run_dir)]
    for item in [*TINY, f"data.path={data_dir}", *sets]:
        argv += ["--set", item]
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env={**env, **(extra_env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out, err


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


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


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"launcher exited {proc.returncode} before {path}:\n{proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.02)  # polling for an event, with a deadline: not a sleep standing in for one
