"""Tiny trained runs of the `libero` and `robotwin` presets, on LeRobot datasets in those benchmarks' layouts
written by lerobot's own writer (tests/support/lerobot_write.py --layout, in the cached test-only
environment of tests/support/lerobot_env.py), for tests/test_presets.py and the serving tests.

    data = write_dataset("robotwin", dest)              # a LeRobot v2.1 dataset in the RoboTwin layout
    run, data = train_tiny("libero", root, record)      # `bin/train libero 1 --cpu-scale` on it, to the end
    run, data = trained(tmp_path_factory, "robotwin")   # train_tiny once per test run (all xdist workers)

`trained` is what a test module uses (the session fixture `preflight_record` must be requested first, so
the launch reuses its compile-check pass):

    @pytest.fixture(scope="module")
    def libero_run(tmp_path_factory, preflight_record):
        return trained(tmp_path_factory, "libero", preflight_record)

The run dir and the dataset it returns are SHARED by every test of the run: read them (load the
checkpoint, replay the episodes); copy them before anything writes there.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.support import runs
from tests.support.lerobot_env import lerobot_site, run_writer
from tests.support.schedule import once

WRITER = Path(__file__).with_name("lerobot_write.py")


@dataclass(frozen=True)
class Layout:
    episodes: int
    length: int  # rows of episode 0 (episode e has length + e)
    size: int  # frame rows (RoboTwin: x 4/3 columns)


# Each episode holds one cpu_scale clip (4 latent frames; trainer/data/short.py clip_frames, which
# tests/test_presets.py applies to these lengths): LIBERO 1 + 4 x 3 = 13 rows (one video frame per row,
# N = 4); RoboTwin 1 + 4 x 4 x 3 = 49 rows (13 video frames, one every 4th row, N = 16). LIBERO's
# frames are upstream's 128 x 128; RoboTwin's 96 x 128 (its 240 x 320 shrunk: the CPU
# scale's latent grid is 8 x 10, and decoding three 240 x 320 cameras would only cost time).
LAYOUTS = {
    "libero": Layout(episodes=4, length=14, size=128),
    "robotwin": Layout(episodes=4, length=54, size=96),
}
STEPS = 4  # grad_accum 1, a checkpoint (and a held-out evaluation) every 2


def write_dataset(preset: str, dest: Path) -> Path:
    """dest: a LeRobot v2.1 dataset in `preset`'s layout (lerobot 0.3.3, upstream's release); the exact
    frames and actions beside it (dest/../<name>.frames.npz, <name>.actions.npz)."""
    layout = LAYOUTS[preset]
    args = [str(dest), "--layout", preset, "--episodes", str(layout.episodes), "--length", str(layout.length)]
    run_writer(WRITER, [*args, "--size", str(layout.size)], lerobot_site())
    return dest


def written_actions(data_dir: Path) -> dict[str, np.ndarray]:
    """The numeric columns the writer wrote (`action__<e>`, `observation.state__<e>`)."""
    with np.load(data_dir.parent / f"{data_dir.name}.actions.npz") as z:
        return {k: z[k] for k in z.files}


def tiny_sets(data_dir: Path, steps: int = STEPS) -> list[str]:
    """The preset's own cpu_scale values, shortened: `steps` steps of one micro-batch, no TensorBoard."""
    return [
        f"data.path={data_dir}", f"train.steps={steps}", "train.grad_accum=1",
        f"train.warmup_steps={min(2, steps - 1)}", f"checkpoint.every={min(2, steps)}",
        "log.tensorboard=false",
    ]  # fmt: skip


def launch_argv(preset: str, run_dir: Path, data_dir: Path, *sets: str) -> list[str]:
    """`bin/train PRESET 1 --cpu-scale --run-dir RUN_DIR` with the tiny sets (the CPU variant on any node)."""
    argv = [str(runs.REPO / "bin" / "train"), preset, "1", "--cpu-scale", "--run-dir", str(run_dir)]
    return argv + runs.set_args([*tiny_sets(data_dir), *sets])


def train_tiny(preset: str, root: Path, preflight_record: Path | None = None) -> tuple[Path, Path]:
    """Write the dataset under root/data, train root/run on it to the end; (run_dir, data_dir). A launch
    that fails raises with its output."""
    data_dir = write_dataset(preset, root / "data")
    run_dir = root / "run"
    if preflight_record is not None:
        runs.seed_preflight(run_dir, preflight_record)
    done = subprocess.run(
        launch_argv(preset, run_dir, data_dir), cwd=runs.REPO, env=runs.clean_env(root / "no-envs"),
        capture_output=True, text=True, timeout=runs.TIMEOUT,
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"bin/train {preset} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return run_dir, data_dir


def trained(
    tmp_path_factory: pytest.TempPathFactory, preset: str, preflight_record: Path | None = None
) -> tuple[Path, Path]:
    """train_tiny(preset) once per test run, whatever the number of xdist workers; (run_dir, data_dir)."""
    built = once(
        tmp_path_factory,
        f"preset-{preset}",
        lambda root: train_tiny(preset, root, preflight_record)[0].parent,
    )
    return built / "run", built / "data"
