"""(heavy) `bin/train libero 2 --cpu-scale` from an empty data folder, end to end, in LIBERO's own simulator
(.sim/libero, built by sim/build.sh on first use): the CPU scale records its LeRobot dataset there on first
use (trainer/data/formats/libero_record.py: a scripted expert's demonstrations from seeded random resets,
lerobot 0.3.3's own writer; announced; 2 demos of libero_goal task 0 here, "open the middle drawer of the
cabinet": 1 trained, 1 held out), trains on it, and evaluates its step-2 checkpoint in the simulator during
training (eval.sim libero: libero_goal task 0, 1 episode, 20 env steps, through bin/evaluate's module).
`bin/evaluate RUN --sim libero` after training is tests/test_sim_libero.py's.

The rank is parked at step 3 (test hook) until the evaluator has started (its pin exists), so the test
knows the evaluation began while training was still to run; TensorBoard's wall times then show step 3
trained while the evaluation ran (the ranks never waited for it). checkpoint.keep 1 with a save at every
step: checkpoint_step_2 would be pruned at step 3 were it not pinned. LINGBOT_TEST_SIM_GOAL_AT puts the
task into its goal state in the simulator (trainer/sim/goal.py), so the success is LIBERO's
own `done` and best-by-sim has a rate to pick by.

The meaning of actions, without learning (issue 55, section 3): the trained demo is served back through
bin/serve's own path by a replay policy (tests/support/replay.py: each chunk the demo's next actions,
normalised with the run's normaliser into the run's slots, in place of the model's sampled chunk), the
server's denormalisation, slot extraction, chunking and key frames, upstream's client loop in the evaluation's
simulator worker, the scene reset from the demo's seed (a job's demo_seed): the demo's success comes back on
its last step. Three broken paths (the gripper's sign flipped, the channels rotated, every chunk a key
frame late) each fail; they and a physics-only control run without cameras (black frames: the meaning of
an action does not depend on them), one worker process for all five episodes."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.support import runs
from tests.support.presets_data import tiny_sets
from trainer.data.formats.libero_record import read_demos

pytestmark = pytest.mark.heavy

MAX_DEMO = 150  # actions at most per demo (the drawer's expert: 92)

RECORDED = ["data.generated_episodes=2", f"data.generated_length={MAX_DEMO}", "data.generated_tasks=0"]
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


@dataclass(frozen=True)
class Trained:
    """The one `bin/train libero 2` of this module: its exit status and output, the run, its dataset."""

    code: int
    out: str
    run_dir: Path
    data: Path
    seconds: float


@pytest.fixture(scope="module")
def trained_on_demos(tmp_path_factory, preflight_record) -> Trained:
    started = time.monotonic()
    tmp_path = tmp_path_factory.mktemp("libero-demos")
    data, run_dir = tmp_path / "data" / "libero_cpu", tmp_path / "run"
    runs.seed_preflight(run_dir, preflight_record)
    argv = [str(runs.REPO / "bin" / "train"), "libero", "2", "--cpu-scale", "--run-dir", str(run_dir)]
    argv += runs.set_args([*tiny_sets(data, steps=3), *RECORDED, *SETS])
    pause = tmp_path / "pause"
    env = {**runs.clean_env(tmp_path / "no-envs"), **runs.pause_env(pause, "step:3")}
    env["LINGBOT_TEST_SIM_GOAL_AT"] = "2"  # libero_goal task 0: open the middle drawer
    proc = subprocess.Popen(argv, cwd=runs.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    runs.wait_for(run_dir, "evaluation/sim-pins/checkpoint_step_2", proc)  # the evaluator has started
    runs.wait_for(pause, "reached", proc)  # and the rank has not trained step 3 yet
    runs.release(pause)
    code, out, _ = runs.finish(proc)
    return Trained(code, out, run_dir, data, time.monotonic() - started)


def test_bin_train_libero_records_its_dataset_and_evaluates_in_libero_beside_the_ranks(trained_on_demos):
    code, out, run_dir, data = (trained_on_demos.code, trained_on_demos.out, trained_on_demos.run_dir,
                                trained_on_demos.data)  # fmt: skip
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
    print(f"bin/train seconds: {trained_on_demos.seconds:.1f}; evaluation {record['seconds']} s")


CAMERAS = ["observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb"]


def _recorded_as_announced(out: str, data: Path) -> None:
    """The preflight's note, the banner, one rank recording; LeRobot v2.1 as lerobot 0.3.3 writes it, the
    preset's cameras, 7-D actions, each demo's length and seed in meta/demos.jsonl (seeds of the
    demonstrations' own space); no recording folder left behind."""
    assert f"the ranks record 2 scripted demonstration(s) of at most {MAX_DEMO} steps" in out  # the note
    assert "RECORDED SCRIPTED DEMONSTRATIONS: a scripted expert's demonstrations in LIBERO's simulator" in out
    assert out.count(f"data: recording 2 demonstration(s) (at most {MAX_DEMO} steps each) of tasks 0") == 1
    info = json.loads((data / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v2.1" and info["fps"] == 20 and info["total_episodes"] == 2
    assert [k for k, f in info["features"].items() if f["dtype"] == "video"] == CAMERAS
    assert info["features"]["action"]["shape"] == [7]
    episodes = [json.loads(line) for line in (data / "meta" / "episodes.jsonl").read_text().splitlines()]
    demos = read_demos(data)
    assert [d["episode_index"] for d in demos] == [0, 1] and {d["seed_space"] for d in demos} == {"demo"}
    assert [e["length"] for e in episodes] == [d["steps"] for d in demos] and all(
        d["steps"] < MAX_DEMO for d in demos)  # fmt: skip
    assert episodes[0]["tasks"] == ["open the middle drawer of the cabinet"]
    actions = _actions(data, 0)
    assert actions.shape == (demos[0]["steps"], 7) and np.abs(actions).max() <= 1.0
    for cam in CAMERAS:
        assert (data / "videos" / "chunk-000" / cam / "episode_000001.mp4").stat().st_size > 0
    assert not [p for p in data.parent.iterdir() if p.name.startswith(".libero_cpu.recording")]


def _actions(data: Path, episode: int) -> np.ndarray:
    import pyarrow.parquet as pq

    table = pq.read_table(data / "data" / "chunk-000" / f"episode_{episode:06d}.parquet")
    return np.stack(table["action"].to_pylist()).astype(np.float32)


# ---- the meaning of actions without learning: a recorded demo served back through bin/serve's path

# (fault, cameras): the demo as recorded, rendered and physics only; two broken paths physics only
VARIANTS = [("", True), ("", False), ("gripper", False), ("slots", False)]  # shift: see the assertions


def _round_trippable(served, data: Path) -> tuple[dict, np.ndarray]:
    """The first demo the run's normaliser takes without clipping (data.normalize fit: its q01/q99 are the
    trained demo's), and its actions."""
    from tests.support.replay import clipped, normalised

    for demo in read_demos(data):
        actions = _actions(data, demo["episode_index"])
        if not clipped(served, normalised(served, actions)):
            return demo, actions
    raise AssertionError(f"every demo of {data} is clipped by the run's normaliser: no identity round trip")


def test_a_recorded_demo_replayed_through_bin_serves_path_succeeds_and_each_broken_path_fails(
    trained_on_demos, tmp_path
):
    from tests.support.replay import replaying
    from trainer.evaluation.sim.command import Options, Serving, load
    from trainer.sim.env import choose_gl, ensure_env, worker_env
    from trainer.sim.scene import SETTLE

    started = time.monotonic()
    assert trained_on_demos.code == 0, trained_on_demos.out[-3000:]
    opts = Options(suite="libero_goal", config="libero", cpu_scale=True, device="cpu")
    served, _, _ = load(str(trained_on_demos.run_dir), opts, lambda line: None)  # bin/evaluate's own load
    demo, actions = _round_trippable(served, trained_on_demos.data)
    served = replaying(served, actions, [fault for fault, _ in VARIANTS])
    python = ensure_env("libero", print)
    env = worker_env(python, choose_gl(python, print))
    serving = Serving(served, tmp_path / "serve.log", workers=1)
    steps = SETTLE + len(actions) + 16  # the demo, then one more chunk
    argv = [str(python), "-u", "-m", "trainer.evaluation.sim.worker", "--uri", serving.uri, "--suite",
            "libero_goal", "--out", str(tmp_path / "out"), "--max-steps", str(steps)]  # fmt: skip
    jobs = "".join(
        json.dumps({"task": demo["task"], "episode": e, "demo_seed": demo["seed"], "cameras": cameras}) + "\n"
        for e, (_, cameras) in enumerate(VARIANTS)
    )
    try:
        done = subprocess.run(argv, input=jobs, env=env, capture_output=True, text=True, timeout=600)
    finally:
        serving.close()
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    got = {
        (fault, cameras): (r["success"], r["steps"])
        for (fault, cameras), r in zip(VARIANTS, records, strict=False)
    }
    print(f"replay: demo {demo} -> {got}; {time.monotonic() - started:.1f} s")
    assert len(records) == len(VARIANTS), done.stderr[-3000:]
    assert served.sources[0].clipped == 0  # the run's normaliser round-trips the demo (nothing clipped)
    length = len(actions)
    assert got[("", True)] == (True, length)  # the demo's success, on its own last step, through the loop
    assert got[("", False)] == (True, length)  # the same without cameras: the control of the broken paths
    # the gripper sign flipped and the slots rotated fail outright in the simulator. A one-key-frame shift of
    # the fixed drawer expert's smooth motion still opened the drawer on the demo's own last step (measured
    # 2026-12-07: (True, 96) as the demo), so success cannot show that fault here; the shift is caught where
    # it is exact, in tests/test_serve_session.py (the executed actions are no longer the demo's).
    for fault in ("gripper", "slots"):
        assert got[(fault, False)][0] is False, (fault, got)
