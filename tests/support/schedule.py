"""How the whole suite runs in parallel: pytest-xdist workers, groups and order (bin/test passes
`-n WORKERS --dist loadgroup --no-loadscope-reorder`; plain `pytest` without -n runs the same tests in
one process, in the order below).

Most of the whole suite's time is waiting, not computing: a Slurm job held for its requeue, a SIGSTOPped
rank until the hang limit, a save held for 80 s, a job until slurmctld's time-limit check. On 2 cores
those waits overlap only when tests run at once, hence the workers. What keeps that correct:

- Groups (`xdist_group`): a test that uses a module-scoped fixture (one Slurm cluster and its
  scenarios, the provisioned envs, one tiny model's runs) runs on the same worker as the rest of its
  module, so the fixture is built once, as in a serial run. A test's own `xdist_group` mark wins (a
  module may put one test that needs nothing of the others in a group of its own). Everything else is
  one unit per test.
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
import time
from collections.abc import Callable
from pathlib import Path

import pytest

# The longest chains, measured (docs/tests.md): started first so they never end the run alone.
FIRST = (
    "tests/test_slurm.py",
    "tests/test_hang.py::test_under_slurm",
    "tests/test_envcheck.py",
    "tests/test_worker_simulation.py",
    "tests/test_hang.py",
    "tests/test_divergence.py",
    "tests/test_two_nodes.py",
    "tests/test_quota.py",
    "tests/test_diskspace.py",
    "tests/test_resume.py",
    "tests/test_validate.py",
)


def _uses_module_fixture(item: pytest.Item) -> bool:
    """True when the test uses a fixture built once per module (or a session fixture defined in its own
    test module: tests/test_envcheck.py's provisioned envs)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for defs in info.name2fixturedefs.values():
        for fixturedef in defs:
            if fixturedef.scope == "module":
                return True
            where = getattr(fixturedef, "baseid", "")
            if fixturedef.scope == "session" and where.endswith(".py"):
                return True
    return False


def group_of(item: pytest.Item) -> str | None:
    """The xdist group a test runs in: its own mark's, its module's, or None (a unit of its own)."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    if _uses_module_fixture(item):
        return item.nodeid.split("::", 1)[0]
    return None


def rank(item: pytest.Item) -> tuple[int, int]:
    """Sort key: FIRST's prefixes in their order, then heavy, then fast."""
    for i, prefix in enumerate(FIRST):
        if item.nodeid.startswith(prefix):
            return (0, i)
    return (1, 0) if item.get_closest_marker("heavy") is not None else (2, 0)


def pytest_itemcollected(item: pytest.Item) -> None:
    """The group as a mark, as soon as the test exists: before any pytest_collection_modifyitems (xdist's
    own, which turns the mark into the nodeid's @group suffix, may run before ours)."""
    group = group_of(item)
    if group is not None and item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(group))


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
    and writes <name>.done (the result's path); later callers wait for the lock (at most `timeout` s),
    then read it. A build that failed leaves no .done, so the next caller tries again (and fails with its
    own error)."""
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
        target.mkdir(exist_ok=True)
        result = build(target)
        done.write_text(str(result))
        return result
