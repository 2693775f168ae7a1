"""(heavy) `bin/train libero 2 --cpu-scale` from an empty data folder, end to end, in LIBERO's own simulator
(.sim/libero, built by sim/build.sh on first use): the CPU scale records its LeRobot dataset there on first
use (trainer/data/formats/libero_record.py: a scripted motion, lerobot 0.3.3's own writer; announced as a
stand-in; 2 episodes x 16 steps here: 1 trained, 1 held out), trains on it, and evaluates its step-2
checkpoint in the simulator during training (eval.sim libero: libero_goal task 0, 1 episode, 20 env steps,
through bin/evaluate's module). `bin/evaluate RUN --sim libero` after training is tests/test_sim_libero.py's.

The rank is parked at step 3 (test hook) until the evaluator has started (its pin exists), so the test
knows the evaluation began while training was still to run; TensorBoard's wall times then show step 3
trained while the evaluation ran (the ranks never waited for it). checkpoint.keep 1 with a save at every
step: checkpoint_step_2 would be pruned at step 3 were it not pinned. LINGBOT_TEST_SIM_GOAL_AT puts the
task into its goal state in the simulator (trainer/sim/goal.py), so the success is LIBERO's
own `done` and best-by-sim has a rate to pick by."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support import runs
from tests.support.presets_data import tiny_sets

pytestmark = pytest.mark.heavy

SETS = [
    "checkpoint.every=1", "checkpoint.keep=1", "log.tensorboard=true", "eval.sim=libero", "eval.sim_every=2",
    "eval.sim_suite=libero_goal", "eval.sim_tasks=0", "eval.sim_episodes=1", "eval.sim_max_steps=20",
    "eval.sim_workers=1", "eval.best_by=sim",
]  # fmt: skip


def _scalars(tb_dir: Path, tag: str) -> dict[int, tuple[float, float]]:
    """{step: (wall_time, value)} of `tag` over every event file in tb_dir."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return {e.step: (e.wall_time, e.value) for e in acc.Scalars(tag)} if tag in acc.Tags()["scalars"] else {}


def test_bin_train_libero_records_its_dataset_and_evaluates_in_libero_beside_the_ranks(
    tmp_path, preflight_record
):
    started = time.monotonic()
    data, run_dir = tmp_path / "data" / "libero_cpu", tmp_path / "run"
    runs.seed_preflight(run_dir, preflight_record)
    argv = [str(runs.REPO / "bin" / "train"), "libero", "2", "--cpu-scale", "--run-dir", str(run_dir)]
    recorded = ["data.generated_episodes=2", "data.generated_length=16"]
    argv += runs.set_args([*tiny_sets(data, steps=3), *recorded, *SETS])
    pause = tmp_path / "pause"
    env = {**runs.clean_env(tmp_path / "no-envs"), **runs.pause_env(pause, "step:3")}
    env["LINGBOT_TEST_SIM_GOAL_AT"] = "2"  # libero_goal task 0: open the middle drawer
    proc = subprocess.Popen(argv, cwd=runs.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    runs.wait_for(run_dir, "evaluation/sim-pins/checkpoint_step_2", proc)  # the evaluator has started
    runs.wait_for(pause, "reached", proc)  # and the rank has not trained step 3 yet
    runs.release(pause)
    code, out, _ = runs.finish(proc)
    assert code == 0, out
    assert "sim: evaluating checkpoint_step_2" in out and "training goes on" in out
    _recorded_as_announced(out, data)

    summary = runs.summary(run_dir)
    assert summary["status"] == "completed"
    (record,) = summary["sim"]["evaluations"]
    assert record["step"] == 2 and record["status"] == "done", record
    assert (record["success_rate"], record["episodes"], record["successes"]) == (1.0, 1, 1)
    results = json.loads(Path(record["results"]).read_text())
    assert results["success_rate"] == 1.0 and results["missing"] == 0
    assert (
        Path(record["results"]).parent
        == run_dir / "evaluation" / "checkpoint_step_2" / "libero" / "libero_goal"
    )

    # the ranks did not wait: step 3 was trained while the evaluation ran
    tb = run_dir / "tensorboard"
    step3_at = _scalars(tb, "train/loss")[3][0]
    assert record["started"] < step3_at < record["finished"], (record, step3_at)
    assert _scalars(tb, "sim/success_rate") == {2: (pytest.approx(record["finished"], abs=5), 1.0)}
    sims = [
        r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("record")
    ]
    want = {"record": "sim", "step": 2, "sim/success_rate": 1.0, "sim/episodes": 1, "sim/successes": 1,
            "sim/seconds": record["seconds"], "sim/results": record["results"]}  # fmt: skip
    assert sims == [want]

    # checkpoint.keep 1: step 2 survived step 3's pruning (pinned, then the best by success rate)
    assert runs.complete_steps(run_dir) == [2, 3]
    assert os.readlink(run_dir / "checkpoints" / "best") == "checkpoint_step_2"
    best = summary["best_checkpoint"]
    assert (best["step"], best["metric"], best["value"]) == (2, "sim_success_rate", 1.0)
    assert not list((run_dir / "evaluation" / "sim-pins").iterdir())
    print(f"test seconds: {time.monotonic() - started:.1f}; evaluation {record['seconds']} s")


CAMERAS = ["observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb"]


def _recorded_as_announced(out: str, data: Path) -> None:
    """The preflight's note, the banner, one rank recording; LeRobot v2.1 as lerobot 0.3.3 writes it, the
    preset's cameras, 7-D actions, 16 rows an episode; no recording folder left behind."""
    import pyarrow.parquet as pq

    assert "the ranks record 2 scripted episode(s) of 16 steps" in out  # the preflight's note
    banner = "RECORDED STAND-IN DATA: a scripted reach-and-lift in LIBERO's simulator (not demonstrations)"
    assert banner in out
    assert out.count("data: recording 2 episode(s) of 16 steps in LIBERO libero_goal") == 1  # one rank
    info = json.loads((data / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v2.1" and info["fps"] == 20 and info["total_episodes"] == 2
    assert [k for k, f in info["features"].items() if f["dtype"] == "video"] == CAMERAS
    assert info["features"]["action"]["shape"] == [7]
    episodes = [json.loads(line) for line in (data / "meta" / "episodes.jsonl").read_text().splitlines()]
    assert [e["length"] for e in episodes] == [16, 16]
    assert episodes[0]["tasks"] == ["open the middle drawer of the cabinet"]
    actions = np.stack(
        pq.read_table(data / "data" / "chunk-000" / "episode_000000.parquet")["action"].to_pylist()
    )
    assert actions.shape == (16, 7) and np.abs(actions).max() <= 1.0 and actions[-1, 6] == 1.0  # lift, closed
    for cam in CAMERAS:
        assert (data / "videos" / "chunk-000" / cam / "episode_000001.mp4").stat().st_size > 0
    assert not [p for p in data.parent.iterdir() if p.name.startswith(".libero_cpu.recording")]
