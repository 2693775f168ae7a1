"""(heavy) `bin/train libero 2` from an empty data folder, end to end: the CPU scale records its LeRobot
dataset in LIBERO's simulator on first use (trainer/data/formats/libero_record.py: a scripted motion,
lerobot 0.3.3's own writer, in the simulator env .sim/libero, built by sim/build.sh on first use),
announced as a stand-in, trains on it, and `bin/evaluate RUN --sim libero` runs the result in the
simulator. A tiny count (2 episodes x 16 steps: 1 trained, 1 held out; the CPU scale's clip is 13 rows)
and 2 steps keep it short; the recorded count itself is the preset's (6 x 48)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from tests.support import runs
from tests.support.presets_data import tiny_sets

pytestmark = pytest.mark.heavy

CAMERAS = ["observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb"]


def test_bin_train_libero_records_its_dataset_trains_and_evaluates(tmp_path, preflight_record):
    data, run_dir = tmp_path / "data" / "libero_cpu", tmp_path / "run"
    runs.seed_preflight(run_dir, preflight_record)
    env = runs.clean_env(tmp_path / "no-envs")
    argv = [str(runs.REPO / "bin" / "train"), "libero", "2", "--cpu-scale", "--run-dir", str(run_dir)]
    tiny = [*tiny_sets(data, steps=2), "data.generated_episodes=2", "data.generated_length=16"]
    argv += runs.set_args(tiny)
    done = subprocess.run(argv, cwd=runs.REPO, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "the ranks record 2 scripted episode(s) of 16 steps" in out  # the preflight's note
    assert "RECORDED STAND-IN DATA: a scripted reach-and-lift in LIBERO's simulator (not demonstrations)" in (
        out
    )
    recording = "data: recording 2 episode(s) of 16 steps in LIBERO libero_goal"
    assert out.count(recording) == 1  # one rank records

    # LeRobot v2.1, written by lerobot 0.3.3, the preset's cameras, 7-D actions, 16 rows an episode
    info = json.loads((data / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v2.1" and info["fps"] == 20 and info["total_episodes"] == 2
    assert [k for k, f in info["features"].items() if f["dtype"] == "video"] == CAMERAS
    assert info["features"]["action"]["shape"] == [7]
    episodes = [json.loads(line) for line in (data / "meta" / "episodes.jsonl").read_text().splitlines()]
    assert [e["length"] for e in episodes] == [16, 16]
    assert episodes[0]["tasks"] == ["open the middle drawer of the cabinet"]
    import pyarrow.parquet as pq

    parquet = data / "data" / "chunk-000" / "episode_000000.parquet"
    actions = np.stack(pq.read_table(parquet)["action"].to_pylist())
    assert actions.shape == (16, 7) and np.abs(actions).max() <= 1.0 and actions[-1, 6] == 1.0  # lift, closed
    for cam in CAMERAS:
        assert (data / "videos" / "chunk-000" / cam / "episode_000001.mp4").stat().st_size > 0
    assert not [p for p in data.parent.iterdir() if p.name.startswith(".libero_cpu.recording")]

    summary = runs.summary(run_dir)
    assert summary["status"] == "completed", summary

    evaluated = subprocess.run(
        [str(runs.REPO / "bin" / "evaluate"), str(run_dir), "--sim", "libero", "--tasks", "0", "--episodes",
         "1", "--max-steps", "8", "--json", "--plots-dir", str(tmp_path / "eval")],
        cwd=runs.REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-4000:]
    result = json.loads(evaluated.stdout)
    assert result["episodes"] == 1 and result["errors"] == [], result
