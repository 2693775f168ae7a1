"""The eval.* rules of rules.py that ask the simulator's own checks (trainer/sim/suites.py).

    sim_tasks_ok(value, cfg)    eval.sim_tasks: suites.parse_tasks against eval.sim_suite's tasks
    sim_ok(value, cfg)          eval.sim libero: suites.check_served on what the run would serve

Both raise Because with the simulator's own reason (the rule's line carries it), so that a value every
evaluation would refuse (bin/evaluate exit 2, recorded `failed`) is refused by bin/train first (exit 2).
"""

from __future__ import annotations

from typing import Any

from trainer.config.rulekinds import Because
from trainer.sim import suites


def sim_tasks_ok(v: str, c: Any) -> bool:
    """eval.sim_tasks as bin/evaluate --tasks reads it (suites.parse_tasks), against eval.sim_suite's tasks:
    the evaluator would exit 2 on every checkpoint otherwise."""
    if c.eval.sim_suite not in suites.SUITES:
        return True  # eval.sim_suite's own rule says so
    try:
        suites.parse_tasks(str(v), suites.task_count(c.eval.sim_suite), c.eval.sim_suite)
    except suites.UsageError as exc:
        raise Because(f"bin/evaluate {exc}") from None
    return True


def sim_ok(v: str, c: Any) -> bool:
    """eval.sim libero: a run LIBERO's client loop can drive (suites.check_served on what bin/evaluate would
    serve: model.action_used channels, data.actions_per_frame, the run's cameras; the launcher's evaluator
    maps no camera)."""
    if v == "none":
        return True
    if v != "libero":
        return False
    served = _Served(tuple(c.data.cameras), c.model.action_used, c.data.actions_per_frame)
    try:
        suites.check_served(served, f"config {c.name!r}")
    except suites.UsageError as exc:
        raise Because(str(exc)) from None
    return True


class _Served:
    """What suites.check_served reads of a served run (trainer/serving/protocol.py Spec, without aliases)."""

    def __init__(self, cameras: tuple[str, ...], channels: int, actions_per_frame: int) -> None:
        self.client_cameras, self.channels, self.actions_per_frame = cameras, channels, actions_per_frame
