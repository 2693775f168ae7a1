"""Put a LIBERO task into its goal state through the simulator's own state API (tests: success is real).

    reach_goal(env)     env: LIBERO's OffScreenRenderEnv; runs inside the simulator environment (.sim/libero)

The goal is the task's bddl `(:goal (And ...))` as LIBERO parsed it (`env.env.parsed_problem["goal_state"]`).
Each articulation predicate is made true the way LIBERO's own init code moves a fixture's joint
(`SiteObjectState.set_joint`): `open` / `close` set the joint to the middle of the object's
`default_open_ranges` / `default_close_ranges`, then `sim.forward()`. Nothing checks success here: the
episode's next `env.step` computes `done` with LIBERO's own `_check_success`, the verdict the evaluation
counts. A goal predicate of another kind (on, in, turnon, ...) raises NotImplementedError naming it: the
test hook (trainer/testhooks.py `sim_goal_at`) is used on a task whose goal is an articulation
(libero_goal task 0, "open the middle drawer of the cabinet").
"""

from __future__ import annotations

from typing import Any

RANGES = {"open": "default_open_ranges", "close": "default_close_ranges"}


def reach_goal(env: Any) -> list[str]:
    """Set every goal predicate's joint; the predicates set, e.g. ['open wooden_cabinet_1_middle_region']."""
    inner = env.env
    done = []
    for state in inner.parsed_problem["goal_state"]:
        kind, *names = (str(x).lower() for x in state)
        if kind not in RANGES or len(names) != 1:
            raise NotImplementedError(f"goal predicate {state}: only open / close of one fixture is set")
        site = inner.object_states_dict[names[0]]
        ranges = inner.get_object(site.parent_name).object_properties["articulation"][RANGES[kind]]
        site.set_joint(qpos=sum(ranges) / len(ranges))
        done.append(f"{kind} {names[0]}")
    inner.sim.forward()
    return done
