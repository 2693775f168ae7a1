"""How the whole suite runs in parallel: pytest-xdist workers, units and order (bin/test passes
`-n WORKERS --dist loadscope --no-loadscope-reorder`; plain `pytest` without -n runs the same tests in
one process, in the order below).

Most of the whole suite's time is waiting, not computing: a Slurm job held for its requeue, a SIGSTOPped
rank until the hang limit, a save held for 80 s, a job until slurmctld's time-limit check. On 2 cores
those waits overlap only when tests run at once, hence the workers. What keeps that correct:

- Units (`--dist loadscope`): a test module is one unit of work, run whole by one worker, so a
  module-scoped fixture (one Slurm cluster and its scenarios, the provisioned envs, one tiny model's
  runs) is built once, as in a serial run. (xdist's `loadgroup` would allow finer groups, but with
  pytest 9 its `xdist_group` marks do not reach the scheduler: every test was sent alone.)
- Order: the long units first (a worker that picks up the Slurm scenarios at minute 10 ends at minute
  23): collection is sorted by FIRST (nodeid prefixes, the longest measured chains first, see
  docs/tests.md), then the other heavy tests, then the fast ones, each in collection order. The sort is
  stable and the same in every worker (xdist requires one collection order).
- Session fixtures that build something once per run (tests/conftest.py's `preflight_record`) are
  built once for all workers: `shared_dir` is the one directory of this run that every worker sees,
  and `once` builds under an exclusive lock in it (the other workers wait on the lock, then reuse).
- Daemons: every Slurm cluster (tests/support/slurm.py) takes its own free ports and its own job id
  range (torchrun's port under Slurm is derived from the job id), so two clusters may run at once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from provision.atomic import write_atomic

# The longest chains, measured (docs/tests.md): started first so they never end the run alone. Module
# walls in a clean-clone run with 4 workers at 66cd39c (the launcher without torch; every core busy from
# minute 1 to the last, so the order matters only in the last minute): envcheck 453 s, hang 370 s, slurm
# 283 s (its jobs' CPU is Slurm's, beside the workers), validate 272 s, then provision 143, diskspace 132,
# resume 122, plan 120, compile_blocks 118, two_nodes 99, divergence 87, compile_option 87, lerobot 84;
# the rest under 70 s each.
FIRST = (
    "tests/test_envcheck.py",  # the worker simulation's full --worker compiles
    "tests/test_hang.py",  # runs to a hang (8 s limits since the phase-aware limit) and a Slurm requeue
    "tests/test_slurm.py",  # 14 scenarios at once on one cluster
    "tests/test_validate.py",
    "tests/test_provision.py",
    "tests/test_diskspace.py",
    "tests/test_resume.py",
    "tests/test_plan.py",  # a real two-rank CPU step against the predicted peak
    "tests/test_compile_blocks.py",
    "tests/test_two_nodes.py",
    "tests/test_divergence.py",
    "tests/test_compile_option.py",
    "tests/test_lerobot.py",
    "tests/test_train_json.py",
    "tests/test_quota.py",
    # last of the long ones: bin/test builds the LIBERO simulator env beside the suite (sim/build.sh),
    # and these wait for it; started earlier, three workers sat idle on its lock (2026-12-05 clean clone)
    "tests/test_sim_training.py",  # bin/train libero records its dataset, evaluates during training
    "tests/test_sim_libero.py",
)


def rank(item: pytest.Item) -> tuple[int, int]:
    """Sort key: FIRST's prefixes in their order, then heavy, then fast."""
    for i, prefix in enumerate(FIRST):
        if item.nodeid.startswith(prefix):
            return (0, i)
    return (1, 0) if item.get_closest_marker("heavy") is not None else (2, 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long-first order (a stable sort: the same in every worker)."""
    items.sort(key=rank)


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's directory that every xdist worker sees (pytest's base temp without xdist)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # .../pytest-N/popen-gwK -> .../pytest-N: this run's, shared by its workers
    shared = base / "shared"
    shared.mkdir(exist_ok=True)
    return shared


def once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path], timeout: float = 900
) -> Path:
    """`build(dir)` run once per test run whatever the number of workers; its result for every caller.

    Under an exclusive lock on shared_dir/<name>.lock: the first caller builds into shared_dir/<name>
    and writes <name>.done (the result's path, atomically); later callers wait for the lock (at most
    `timeout` s), then read it. A build that failed leaves no .done, so the next caller tries again in a
    fresh directory (what the failed one left is removed first, never reused) and fails with its own
    error."""
    shared = shared_dir(tmp_path_factory)
    done = shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"waited {timeout:.0f} s for another xdist worker to build {name} under {shared}"
                    ) from None
                time.sleep(0.2)  # polling a lock another worker holds while it builds, with a deadline
        if done.is_file():
            return Path(done.read_text())
        target = shared / name
        shutil.rmtree(target, ignore_errors=True)  # a failed build's remains
        target.mkdir()
        result = build(target)
        write_atomic(done, str(result))
        return result
