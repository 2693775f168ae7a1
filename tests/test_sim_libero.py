"""`bin/evaluate RUN --sim libero` in the real LIBERO simulator (heavy lane): success is LIBERO's own verdict
and is counted; a policy that never succeeds counts 0/N; a crashed simulator worker is its episode's error,
the other episode goes on, and a re-run continues with what is missing; bad input is refused first.

The run is the tiny `libero` preset run the other preset tests share (tests/support/presets_data.py); its
policy is random-weight CPU scale, so nothing here asserts a success rate of the model. Success comes from
the test hook LINGBOT_TEST_SIM_GOAL_AT (trainer/testhooks.py): after env step 2 the worker opens the
middle drawer through LIBERO's own joint API (trainer/sim/goal.py) and LIBERO's next env.step
returns done. The simulator env (.sim/libero) is the repository's: bin/test starts its build in the
background; where it cannot be built or cannot render, bin/evaluate exits 1 naming why and these tests FAIL
with that line (never skipped).

The success, crash and determinism tests read one module fixture, `three_evaluates`: three bin/evaluate
commands where there were four. The crash command also proves that an unsolved episode past robosuite's own
horizon (1000 env steps) is a failure (issue 56 item 1): it runs --max-steps 1000, each episode moved to env
step 996 after its reset by LINGBOT_TEST_SIM_START_AT, so that costs 12 env steps, not 1000. The crash
test's re-run carries the goal hook (not a setting, so the re-run is allowed), so its episode 0 succeeds;
the goal test reads a fresh one-episode command (--max-steps 17, was 40: it stops on done at step 3 either
way). Determinism, formerly a second identical command inside
test_the_goal_state_is_a_success_and_counted, is now
test_the_same_episode_renders_the_same_key_frames_in_two_commands: "the same command twice" became "the
same episode (0) in two commands", each in a fresh simulator worker seeded from (seed, suite, task,
episode) and crc32(suite/task/episode); the key frames are byte-equal.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import runs
from tests.support.presets_data import trained

pytestmark = pytest.mark.heavy

EVALUATE = runs.REPO / "bin" / "evaluate"
TASK = ["--suite", "libero_goal", "--tasks", "0"]  # "open the middle drawer of the cabinet"


@pytest.fixture(scope="module")
def libero_run(tmp_path_factory, preflight_record) -> Path:
    return trained(tmp_path_factory, "libero", preflight_record)[0]


def evaluate(run: Path, out: Path, *args: str, **hooks: str) -> tuple[int, dict, str]:
    env = {**runs.clean_env(out.parent / "no-envs"), **hooks}
    argv = [str(EVALUATE), str(run), "--sim", "libero", "--plots-dir", str(out), "--json", *args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=runs.REPO)
    result = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, result, proc.stderr


@dataclass(frozen=True)
class Evaluated:
    """One `bin/evaluate` command's exit status, --json result, stderr and --plots-dir folder."""

    code: int
    result: dict
    err: str
    out: Path


@pytest.fixture(scope="module")
def three_evaluates(libero_run, tmp_path_factory) -> dict[str, Evaluated]:
    """The three commands the success, crash and determinism tests read (one bin/evaluate each, in order):
    crashed: folder X, 2 episodes, --max-steps 1000, the worker of episode (0, 0) aborts
             (LINGBOT_TEST_SIM_CRASH=0:0); each episode is moved to env step 996 after its reset
             (LINGBOT_TEST_SIM_START_AT), so episode 1 runs past robosuite's own horizon (1000) unsolved;
    rerun:   the same folder and command with the goal hook (not a setting: the re-run is allowed), so it
             continues with episode 0 only, which reaches the goal;
    alone:   a fresh folder, 1 episode, the goal hook: episode 0 again, in another command."""
    root = tmp_path_factory.mktemp("libero-evaluates")
    done = {}
    crash = {"LINGBOT_TEST_SIM_CRASH": "0:0", "LINGBOT_TEST_SIM_START_AT": "996"}
    for name, out, episodes, steps, hooks in (
        ("crashed", root / "libero", "2", "1000", crash),
        ("rerun", root / "libero", "2", "1000", {"LINGBOT_TEST_SIM_GOAL_AT": "2"}),
        ("alone", root / "alone", "1", "17", {"LINGBOT_TEST_SIM_GOAL_AT": "2"}),
    ):
        args = [*TASK, "--max-steps", steps, "--episodes", episodes]
        done[name] = Evaluated(*evaluate(libero_run, out, *args, **hooks), out)
    return done


def test_the_goal_state_is_a_success_and_counted(three_evaluates):
    alone = three_evaluates["alone"]
    out, result = alone.out, alone.result
    assert alone.code == 0, alone.err[-3000:]
    assert (result["suite"], result["episodes"], result["successes"], result["success_rate"]) == (
        "libero_goal", 1, 1, 1.0)  # fmt: skip
    assert result["tasks"] == [{"task": 0, "language": "open the middle drawer of the cabinet", "episodes": 1,
                                "successes": 1, "rate": 1.0}]  # fmt: skip
    record = json.loads((out / "episodes" / "t00_e000.json").read_text())
    assert record["steps"] == 3 and record["chunks"] == 1  # stopped on done, long before --max-steps
    assert record["timing"]["render"] > 0 and record["timing"]["policy"] > 0
    video = out / record["video"]
    assert video.name == "t00_e000_success.mp4" and video.stat().st_size > 0
    assert (out / "success.png").stat().st_size > 0
    assert json.loads((out / "results.json").read_text())["successes"] == 1


def test_a_crash_is_an_error_the_rest_fails_and_a_rerun_continues(three_evaluates):
    crashed, rerun = three_evaluates["crashed"], three_evaluates["rerun"]
    result, err = crashed.result, crashed.err
    assert crashed.code == 1, err[-3000:]
    assert "1 episode(s) did not run" in err
    assert [(e["task"], e["episode"]) for e in result["errors"]] == [(0, 0)]
    assert "killed by SIGABRT" in result["errors"][0]["error"]
    assert (result["episodes"], result["successes"], result["success_rate"]) == (1, 0, 0.0)
    # (read after the re-run, which shares the folder: it kept this record and did not play episode 1 again)
    record = json.loads((crashed.out / "episodes" / "t00_e001.json").read_text())
    # issue 56 item 1: from step 996 (the hook) the first chunk's 3 x 4 actions run past robosuite's own
    # horizon, 1000 (its next step raised `executing action in terminated episode`: an error, not counted):
    # a failure at the limit, said
    assert (record["success"], record["steps"], record["reason"]) == (
        False, 996 + 12 - 5, "not done within --max-steps 1000")  # fmt: skip

    # the re-run (the goal hook is no setting, so it is the same command) runs only the crashed episode
    result, err = rerun.result, rerun.err
    assert rerun.code == 0, err[-3000:]
    assert "1 done before, 1 to run" in err
    assert (result["episodes"], result["successes"], result["success_rate"], result["errors"]) == (
        2, 1, 0.5, [])  # fmt: skip
    assert json.loads((rerun.out / "episodes" / "t00_e000.json").read_text())["success"]


def test_the_same_episode_renders_the_same_key_frames_in_two_commands(three_evaluates):
    """Episode 0 of libero_goal task 0 in two commands (the re-run in folder X, the one-episode run in a fresh
    folder), each in a fresh simulator worker: seeded builds render the same key frames, byte for byte."""
    rerun, alone = three_evaluates["rerun"], three_evaluates["alone"]
    assert rerun.code == 0 and alone.code == 0, rerun.err[-2000:] + alone.err[-2000:]
    video = "videos/t00_e000_success.mp4"
    record = json.loads((alone.out / "episodes" / "t00_e000.json").read_text())
    assert record["video"] == video, record
    assert (rerun.out / video).read_bytes() == (alone.out / video).read_bytes()


@pytest.mark.parametrize(
    "args, line",
    [
        (["--suite", "libero_90"], "--suite 'libero_90': unknown LIBERO suite"),
        (["--suite", "libero_goal", "--tasks", "3-10"], "--tasks '3-10': 3-10 is out of range"),
        (["--episodes", "all"], "--episodes 'all': with --sim, the number of episodes per task"),
        (["--workers", "0"], "--workers 0: expected at least 1"),  # a review: it meant the default, unsaid
    ],
)
def test_bad_input_is_refused_before_anything_runs(libero_run, tmp_path, args, line):
    out = tmp_path / "libero"
    code, result, err = evaluate(libero_run, out, *args)
    assert code == 2 and line in err and result["ok"] is False
    assert not out.exists()


RENDER_ON_WORKER = """
import numpy as np
from libero.libero import benchmark
from libero.libero.envs import OffScreenRenderEnv
suite = benchmark.get_benchmark_dict()["libero_goal"]()
bddl = suite.get_task_bddl_file_path(0)
env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=128, camera_widths=128)
env.seed(0)
env.reset()
env.set_init_state(suite.get_task_init_states(0)[0])
obs, reward, done, info = env.step(np.zeros(7))
image = obs["agentview_image"]
assert image.shape == (128, 128, 3) and image.std() > 1, (image.shape, image.std())
env.close()
print("RENDERED", float(image.std()))
"""


@pytest.mark.worker
def test_the_simulator_env_builds_and_renders_a_scene_on_a_worker_without_compilers(worker, worker_env):
    """What bin/evaluate --sim runs on a compute node: the env built on the login node (here: this host),
    a LIBERO scene built, reset to its init state, stepped and rendered through EGL inside the worker
    simulation (no gcc, no headers, no binutils, no openssl)."""
    from trainer.sim.env import ensure_env

    python = ensure_env("libero", print)
    env = {**worker_env, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "PYTHONNOUSERSITE": "1",
           "LIBERO_CONFIG_PATH": str(python.parent.parent / "libero-config")}  # fmt: skip
    result = worker.run([str(python), "-c", RENDER_ON_WORKER], env=env, timeout=600)
    assert result.returncode == 0 and "RENDERED" in result.stdout, (
        result.stdout[-2000:] + result.stderr[-3000:]
    )
    print(result.stdout.strip().splitlines()[-1])  # the rendered image's spread, for the log
