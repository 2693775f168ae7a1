"""Test-only hooks: the one place where the suite reaches into a run. Every hook is off unless its
`LINGBOT_TEST_*` variable is set; nothing here changes a run that does not set them.

Variables (each: what it does):
- `LINGBOT_TEST_PAUSE_AT=<point>:<step>`: the rank `LINGBOT_TEST_PAUSE_RANK` (default 0) reaching
  `pause(point, step, rank)`, or the launcher reaching `pause(point, 0)`, writes
  `$LINGBOT_TEST_PAUSE_DIR/reached` (pid, rank, point, step) and waits there until
  `$LINGBOT_TEST_PAUSE_DIR/release` exists; signals still arrive.
- `LINGBOT_TEST_PAUSE_RANK=<rank>`: which rank `LINGBOT_TEST_PAUSE_AT` parks (default 0).
- `LINGBOT_TEST_PAUSE_DIR=<dir>`: where a pause announces itself and waits for its release.
- `LINGBOT_TEST_SLEEP_AT=<point>:<step>:<rank>:<seconds>`: that rank, reaching `pause(point, step, rank)`,
  sleeps that long and carries on (a slow but live step, for the stall detector's tests).
- `LINGBOT_TEST_ABORT_AFTER_DESTROY=<rank>`: that rank calls `os.abort()` right after
  `destroy_process_group` (the teardown SIGABRT, deterministically).
- `LINGBOT_TEST_NAN_AT=<steps>:<rank>[:<quantity>]` (steps: `3`, `2-4`, `2,4-5`): on that rank, at those
  steps, every micro-batch's `<quantity>` (action_loss, the default, or latent_loss) and its loss are
  multiplied by NaN before backward, so the gradients are NaN too (a divergence on one rank).
- `LINGBOT_TEST_SIM_GOAL_AT=<step>`: a LIBERO simulator worker (trainer/evaluation/sim/worker.py), after
  the episode's env step `<step>`, puts the task's objects into its goal state through the simulator's own
  state API (trainer/sim/goal.py), so the next step's `done` is the simulator's own verdict.
- `LINGBOT_TEST_RENDEZVOUS_S=<seconds>`: the launcher's limit for torchrun's rendezvous (no rank started
  on this node) instead of trainer/launcher/rendezvous.py RENDEZVOUS_S (60 s).
- `LINGBOT_TEST_SIM_CRASH=<task>:<episode>`: the simulator worker running that episode aborts
  (`os.abort()`) at its first env step: a simulator crash, deterministically.
- `LINGBOT_TEST_SIM_START_AT=<timestep>`: a LIBERO simulator worker, after each episode's reset and
  settling, sets robosuite's own step counter (`env.env.timestep`) to `<timestep>`: the episode goes on as
  if it had run that long unsolved (past robosuite's horizon in a few steps, not a thousand).

A new hook adds its variable to this table and its function below; product code calls the function and
never reads a `LINGBOT_TEST_*` variable itself (tests/test_structure.py checks it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from provision.atomic import write_json_atomic

PREFIX = "LINGBOT_TEST_"


def pause(point: str, step: int, rank: int | None = None) -> None:
    """Park here when `LINGBOT_TEST_PAUSE_AT=<point>:<step>` names this point (and, for a rank, this rank)."""
    if os.environ.get("LINGBOT_TEST_PAUSE_AT") != f"{point}:{step}":
        return
    if rank is not None and rank != int(os.environ.get("LINGBOT_TEST_PAUSE_RANK", "0")):
        return
    pause_dir = Path(os.environ["LINGBOT_TEST_PAUSE_DIR"])
    record: dict[str, object] = {"pid": os.getpid(), "point": point, "step": step}
    if rank is not None:
        record["rank"] = rank
    write_json_atomic(pause_dir / "reached", record)
    while not (pause_dir / "release").exists():
        time.sleep(0.02)  # polling a file the test writes: the release is the synchronisation


def rendezvous_s(default: float) -> float:
    """`LINGBOT_TEST_RENDEZVOUS_S`: the launcher's rendezvous limit, else `default`."""
    value = os.environ.get("LINGBOT_TEST_RENDEZVOUS_S")
    return float(value) if value else default


def sleep(point: str, step: int, rank: int) -> None:
    """`LINGBOT_TEST_SLEEP_AT=<point>:<step>:<rank>:<seconds>`: a slow step on that rank (it stays alive)."""
    spec = os.environ.get("LINGBOT_TEST_SLEEP_AT", "")
    where, _, seconds = spec.rpartition(":")
    if spec and where == f"{point}:{step}:{rank}":
        time.sleep(float(seconds))  # the slowness is what the test asks for, not a synchronisation


def abort_after_destroy(rank: int) -> None:
    """`LINGBOT_TEST_ABORT_AFTER_DESTROY=<rank>`: that rank aborts right after its process group is gone."""
    if os.environ.get("LINGBOT_TEST_ABORT_AFTER_DESTROY") == str(rank):
        os.abort()


def nonfinite_loss(out: dict[str, Any], step: int, rank: int) -> dict[str, Any]:
    """`LINGBOT_TEST_NAN_AT=<steps>:<rank>[:<quantity>]`: NaN in that rank's loss at those steps."""
    spec = os.environ.get("LINGBOT_TEST_NAN_AT")
    if not spec:
        return out
    steps, at_rank, *rest = spec.split(":")
    ranges = [part.partition("-") for part in steps.split(",")]
    if int(at_rank) != rank or not any(int(a) <= step <= int(b or a) for a, _, b in ranges):
        return out
    quantity = rest[0] if rest else "action_loss"
    nan = float("nan")
    return {**out, quantity: out[quantity] * nan, "loss": out["loss"] * nan}


def sim_goal_at() -> int | None:
    """`LINGBOT_TEST_SIM_GOAL_AT=<step>`: the env step after which the worker sets the goal state."""
    spec = os.environ.get("LINGBOT_TEST_SIM_GOAL_AT")
    return int(spec) if spec else None


def sim_crash(task: int, episode: int) -> None:
    """`LINGBOT_TEST_SIM_CRASH=<task>:<episode>`: abort the simulator worker on that episode."""
    if os.environ.get("LINGBOT_TEST_SIM_CRASH") == f"{task}:{episode}":
        os.abort()


def sim_start_at() -> int | None:
    """`LINGBOT_TEST_SIM_START_AT=<timestep>`: the env step count the worker moves each episode to."""
    spec = os.environ.get("LINGBOT_TEST_SIM_START_AT")
    return int(spec) if spec else None
