"""Scripted LIBERO experts: a policy per task that reads the simulator's own state and plays LIBERO's
7-D delta end-effector action (the ceiling row of every evaluation table).

    tasks_with_experts("libero_goal")       # [0, 1, 5, 7, 8]
    expert = expert_for("libero_goal", 0)   # ExpertError naming the suite, the task and those with experts
    expert.reset()                          # before each episode
    action = expert.act(env, obs)           # np.float32 (7,): env is LIBERO's env, obs what env.step returned

The action is OSC_POSE's: xyz delta in [-1, 1] (x 0.05 m), axis-angle delta in [-1, 1] (x 0.5 rad), gripper
-1 open / +1 closed. Success is LIBERO's own `done` from env.step. An expert is deterministic given the
simulator's state and its own steps so far. Runs inside the simulator environment (numpy only; no torch);
this module imports nothing of LIBERO, so the tool env may ask which tasks have experts.

Measured with `python -m trainer.sim.experts` (bench/results/2026-12-07-libero-experts.md).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

# suite -> task index -> (the task's language in LIBERO 8f1084e, the expert's class in goal.py)
EXPERTS: dict[str, dict[int, tuple[str, str]]] = {
    "libero_goal": {
        0: ("open the middle drawer of the cabinet", "MiddleDrawer"),
        1: ("put the bowl on the stove", "BowlOnStove"),
        5: ("push the plate to the front of the stove", "PlateToStoveFront"),
        7: ("turn on the stove", "Stove"),
        8: ("put the bowl on the plate", "BowlOnPlate"),
    },
}


class Expert(Protocol):
    def reset(self) -> None: ...

    def act(self, env: Any, obs: dict) -> np.ndarray: ...


class ExpertError(ValueError):
    """No expert for the suite/task: one line naming them and the tasks that have experts."""


def tasks_with_experts(suite: str) -> list[int]:
    return sorted(EXPERTS.get(suite, {}))


def task_language(suite: str, task: int) -> str:
    return EXPERTS[suite][task][0]


def no_expert(suite: str, tasks: list[int]) -> str:
    """The refusal's line for tasks without an expert."""
    have = tasks_with_experts(suite)
    listed = ", ".join(f"{t} ({EXPERTS[suite][t][0]})" for t in have) if have else "none"
    return (
        f"no scripted expert for {suite}{' task(s) ' + ', '.join(map(str, tasks)) if tasks else ''}; "
        f"tasks with experts in {suite}: {listed}"
    )


def expert_for(suite: str, task: int) -> Expert:
    if task not in EXPERTS.get(suite, {}):
        raise ExpertError(no_expert(suite, [task]))
    from trainer.sim.experts import goal

    expert: Expert = getattr(goal, EXPERTS[suite][task][1])()
    return expert
