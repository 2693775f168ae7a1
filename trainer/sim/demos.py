"""Expert demonstrations in LIBERO's simulator: played from seeded random resets, replayed bit for bit.

    env, obs = reset_scene(suite, task, seed, cameras)      # the demo's scene, settled
    demo = play(suite, task, seed, expert, max_steps)        # the expert drives it (physics only: no cameras)
    shown = replay(suite, task, seed, demo.actions)          # the same scene and actions, cameras on
    assert shown.success and shown.states == demo.states     # what the recorder checks (bit for bit)

Runs inside the simulator environment (.sim/libero). A demo's scene is never one of the task's 50 official
init states (those are the evaluation's): the global RNGs are seeded in the demonstrations' own seed space
(scene.py `seed_scene(seed, suite, task, 0, tag="demo")`), the env is built and `reset()` (LIBERO samples
the fixtures' and objects' placements from those RNGs), no `set_init_state`, then the 5 settling steps of the
zero action (scene.SETTLE), as the evaluation's worker settles. The same (suite, task, seed) gives the same
scene, and the same actions then give the same states: measured bit for bit, with and without cameras
(bench/results/2026-12-07-libero-record.md); the evaluation's worker resets a demo's scene the same way
(trainer/evaluation/sim/worker.py, a job's `demo_seed`).

Row t of a demo is the observation before step t (both cameras through scene.extract when rendered, the
8-D state below) and the action of step t; `success` is LIBERO's own `done` (the task's bddl goal) on the
last step. A demo is `success` only when done came on its last action (play stops there; a replay whose
done comes at another step, or never, diverged).

`observation.state` (8,) = eef xyz, eef axis-angle (robosuite's quat2axisangle), the two finger positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer.sim.scene import CAMERAS, SETTLE, SIZE, extract, seed_scene

TAG = "demo"  # the seed space of the demonstrations (scene.seed_scene's tag)


@dataclass
class Demo:
    """One played or replayed episode: rows of (observation before the step, action)."""

    task: int
    seed: int
    language: str
    actions: list[np.ndarray] = field(default_factory=list)  # (7,) float32 each
    states: list[np.ndarray] = field(default_factory=list)  # (8,) float32 each
    frames: dict[str, list[np.ndarray]] = field(default_factory=dict)  # camera -> HxWx3 (rendered only)
    success: bool = False
    expert: str = ""  # the expert's name (its class), for the record


def state_of(obs: dict) -> np.ndarray:
    """observation.state (8,): eef xyz, eef axis-angle, the two gripper finger positions."""
    from robosuite.utils.transform_utils import quat2axisangle

    return np.concatenate([obs["robot0_eef_pos"], quat2axisangle(obs["robot0_eef_quat"]),
                           obs["robot0_gripper_qpos"]]).astype(np.float32)  # fmt: skip


def seed_demo(suite: str, task: int, seed: int) -> None:
    """The global RNGs seeded for demo `seed` of the task, before its env is built (then reset at once)."""
    seed_scene(seed, suite, task, 0, tag=TAG)


def make_env(suite: Any, task: int, cameras: bool, **env_args: Any) -> Any:
    """cameras: LIBERO's OffScreenRenderEnv with the evaluation's 128 x 128 cameras; else its ControlEnv
    with no renderer and no camera observations (physics only; the same physics, measured). env_args: more
    of LIBERO's env arguments (e.g. the evaluation's ignore_done)."""
    from libero.libero.envs import OffScreenRenderEnv
    from libero.libero.envs.env_wrapper import ControlEnv

    bddl = suite.get_task_bddl_file_path(task)
    if cameras:
        return OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=SIZE, camera_widths=SIZE, **env_args)
    return ControlEnv(bddl_file_name=bddl, has_offscreen_renderer=False, use_camera_obs=False, **env_args)


def blank_frames() -> dict[str, np.ndarray]:
    """What a physics-only env shows the policy: both cameras black, at the evaluation's size."""
    return {key: np.zeros((SIZE, SIZE, 3), np.uint8) for key in CAMERAS}


def reset_scene(suite: Any, task: int, seed: int, cameras: bool) -> tuple[Any, dict]:
    """The demo's scene built (make_env), reset and settled: (env, the observation after settling)."""
    seed_demo(suite.name, task, seed)
    env = make_env(suite, task, cameras)
    try:
        env.reset()
        for _ in range(SETTLE):
            obs, _, _, _ = env.step([0.0] * 7)
    except BaseException:
        env.close()
        raise
    return env, obs


def _run(suite: Any, task: int, seed: int, steps: int, next_action, cameras: bool) -> Demo:
    """The shared loop of play and replay: `next_action(env, obs, t)` -> (7,) for up to `steps` steps,
    stopping on done."""
    demo = Demo(task, seed, suite.get_task(task).language, frames={k: [] for k in CAMERAS} if cameras else {})
    env, obs = reset_scene(suite, task, seed, cameras)
    try:
        for t in range(steps):
            if cameras:
                for key, image in extract(obs).items():
                    demo.frames[key].append(image)
            demo.states.append(state_of(obs))
            action = np.asarray(next_action(env, obs, t), dtype=np.float32).reshape(7)
            demo.actions.append(action)
            obs, _, done, _ = env.step(action.tolist())
            if done:
                demo.success = True
                break
    finally:
        env.close()
    return demo


def play(suite: Any, task: int, seed: int, expert: Any, max_steps: int, cameras: bool = False) -> Demo:
    """The expert (trainer/sim/experts: reset(), act(env, obs) -> (7,)) from the demo's scene, until done or
    max_steps actions."""
    expert.reset()
    return _run(suite, task, seed, max_steps, lambda env, obs, t: expert.act(env, obs), cameras)


def replay(suite: Any, task: int, seed: int, actions: list[np.ndarray], cameras: bool = True) -> Demo:
    """The recorded actions from the same scene; success only when done comes on the last action."""
    demo = _run(suite, task, seed, len(actions), lambda env, obs, t: actions[t], cameras)
    demo.success = demo.success and len(demo.actions) == len(actions)
    return demo


def same_rows(a: Demo, b: Demo) -> bool:
    """The same actions and, bit for bit, the same states (a replay of a played demo)."""
    return (
        len(a.actions) == len(b.actions)
        and all(np.array_equal(x, y) for x, y in zip(a.actions, b.actions, strict=True))
        and all(np.array_equal(x, y) for x, y in zip(a.states, b.states, strict=True))
    )
