"""Measure the scripted experts, physics only (no cameras): per task, successes / episodes, mean/max steps.

    MUJOCO_GL=disabled .sim/libero/bin/python -m trainer.sim.experts --suite libero_goal --tasks 0,8 \
        --episodes 50 [--random-resets 20] [--max-steps 600] [--seed 0]

Episodes are replayed as the evaluation's worker replays them (trainer/evaluation/sim/worker.py): the scene
seeded (scene.seed_scene) before the env is built, env.reset(), set_init_state(init_states[e]), the
settling steps of the zero action, then the expert until LIBERO's `done` or --max-steps steps. A random
reset is np.random.seed(k) then env.reset() (no init state), on an env built once per task. Steps count the
expert's steps (the settling ones not included). Runs in the simulator env; prints one line per task.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from trainer.sim.experts import expert_for, tasks_with_experts
from trainer.sim.scene import SETTLE, seed_scene


def build(suite, task: int):
    from libero.libero.envs import OffScreenRenderEnv

    return OffScreenRenderEnv(
        bddl_file_name=suite.get_task_bddl_file_path(task), has_renderer=False,
        has_offscreen_renderer=False, use_camera_obs=False,
    )  # fmt: skip


def play(env, expert, max_steps: int, trace: bool = False) -> tuple[bool, int]:
    for _ in range(SETTLE):
        obs, _, done, _ = env.step([0.0] * 7)
    expert.reset()
    for step in range(1, max_steps + 1):
        action = expert.act(env, obs)
        obs, _, done, _ = env.step(action.tolist())
        if trace:  # the phase, the eef, the action, the finger, the first object's position
            first = next(
                k for k in obs if k.endswith("_pos") and not k.startswith("robot0") and "_to_" not in k
            )
            phase = getattr(expert, "phases", ("",))[getattr(expert, "phase", 0)]
            finger = round(float(obs["robot0_gripper_qpos"][0]), 3)
            print(step, phase, obs["robot0_eef_pos"].round(3), action.round(2), finger, obs[first].round(3),
                  file=sys.stderr)  # fmt: skip
        if done:
            return True, step
    return False, max_steps


def measure(suite, task: int, episodes: list[int], resets: int, max_steps: int, seed: int, trace: bool):
    expert = expert_for(suite.name, task)
    results = []
    for e in episodes:
        seed_scene(seed, suite.name, task, e)
        env = build(suite, task)
        env.reset()
        init = suite.get_task_init_states(task)
        env.set_init_state(init[e % init.shape[0]])
        ok, steps = play(env, expert, max_steps, trace)
        env.close()
        results.append(("init", e, ok, steps))
        print(
            f"  task {task} init {e}: {'success' if ok else 'FAILURE'} {steps}", file=sys.stderr, flush=True
        )
    if resets:
        env = build(suite, task)
        for k in range(resets):
            np.random.seed(k)
            env.reset()
            ok, steps = play(env, expert, max_steps, trace)
            results.append(("random", k, ok, steps))
            print(
                f"  task {task} random {k}: {'success' if ok else 'FAILURE'} {steps}",
                file=sys.stderr,
                flush=True,
            )
        env.close()
    return results


def summary(results: list, kind: str) -> str:
    rows = [r for r in results if r[0] == kind]
    if not rows:
        return "-"
    wins = [r[3] for r in rows if r[2]]
    steps = f"{np.mean(wins):.0f}/{max(wins)}" if wins else "-/-"
    return f"{len(wins)}/{len(rows)} (steps mean/max {steps})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="libero_goal")
    parser.add_argument(
        "--tasks", default=None, help="comma-separated task indices (default: all with experts)"
    )
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--first", type=int, default=0, help="the first init state played")
    parser.add_argument("--random-resets", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args(argv)
    from libero.libero import benchmark

    suite = benchmark.get_benchmark_dict()[args.suite]()
    tasks = [int(t) for t in args.tasks.split(",")] if args.tasks else tasks_with_experts(args.suite)
    for task in tasks:
        start = time.perf_counter()
        episodes = list(range(args.first, args.first + args.episodes))
        results = measure(suite, task, episodes, args.random_resets, args.max_steps, args.seed, args.trace)
        took = time.perf_counter() - start
        print(
            f"{args.suite} task {task} ({suite.get_task(task).language}):"
            f" init states {summary(results, 'init')}; random resets {summary(results, 'random')};"
            f" {took:.0f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
