"""Where the whole suite's CPU goes, per test: every test's processes (the ones it starts, their children,
daemons such as Slurm's and the jobs they run) in a cpuacct cgroup of the test's own, so a test's CPU is
everything it caused, not only what its pytest worker waited for. Root, cgroup v1's cpuacct controller.

    bin/test -q -p bench.suite_cpu                       # LINGBOT_SUITE_CPU_DIR=DIR: an empty folder
    .venv/bin/python bench/suite_cpu.py [DIR]            # the module table and the 40 largest tests

As a pytest plugin (`-p bench.suite_cpu`), in each xdist worker (or, with LINGBOT_SUITE_CPU_LANE=1, in a
run without workers): at a test's start the worker moves itself into a new cgroup under
/sys/fs/cgroup/cpuacct/lingbot-suite-cpu/, so what it starts from then on is counted there; at its end one
JSON line (test, cgroup, wall, start) goes to DIR/<pid>.jsonl. A nested pytest (a test that runs pytest)
inherits LINGBOT_SUITE_CPU_ACTIVE and stays out. Daemons a fixture starts are counted to the test that
started them, for as long as they run: the report reads each cgroup's total at the end and then removes the
cgroups. Sums are CPU-s of all processes (user + system), walls are each test's own (4 workers overlap).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/cpuacct/lingbot-suite-cpu")
OUT = Path(os.environ.get("LINGBOT_SUITE_CPU_DIR", "/tmp/suite-cpu"))
_active = False
_count = itertools.count()
_current: dict[str, tuple[str, float, float]] = {}


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest's hook
    global _active
    if os.environ.get("LINGBOT_SUITE_CPU_ACTIVE") == "1":
        return  # a pytest inside a test
    if not (os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("LINGBOT_SUITE_CPU_LANE") == "1"):
        return  # the xdist controller runs no test
    if not ROOT.parent.is_dir():
        raise SystemExit(f"bench/suite_cpu.py: no cgroup v1 cpuacct controller at {ROOT.parent}")
    os.environ["LINGBOT_SUITE_CPU_ACTIVE"] = "1"
    ROOT.mkdir(exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    _active = True


def pytest_runtest_logstart(nodeid: str, location) -> None:  # noqa: ANN001
    if not _active:
        return
    name = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}-{next(_count)}"
    (ROOT / name).mkdir()
    (ROOT / name / "cgroup.procs").write_text(str(os.getpid()))
    _current[nodeid] = (name, time.monotonic(), time.time())


def pytest_runtest_logfinish(nodeid: str, location) -> None:  # noqa: ANN001
    if not _active or nodeid not in _current:
        return
    name, started, wall_start = _current.pop(nodeid)
    line = {"test": nodeid, "cgroup": name, "wall": time.monotonic() - started, "start": wall_start}
    with open(OUT / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def report(out: Path) -> str:
    """The module table and the largest tests; each cgroup's CPU read now, then the cgroup removed."""
    rows = [
        json.loads(line)
        for path in sorted(out.glob("*.jsonl"))
        for line in path.read_text().split("\n")
        if line
    ]
    gone = [row["test"] for row in rows if not (ROOT / row["cgroup"] / "cpuacct.usage").exists()]
    if gone:  # an earlier run's lines (its cgroups were read and removed): never counted as 0 CPU-s
        raise SystemExit(
            f"bench/suite_cpu.py: {out} holds {len(gone)} test(s) whose cgroup is gone (e.g. "
            f"{gone[0]}): an earlier run's lines; set LINGBOT_SUITE_CPU_DIR to an empty folder"
        )
    for row in rows:
        row["cpu"] = int((ROOT / row["cgroup"] / "cpuacct.usage").read_text()) / 1e9
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for row in rows:
        module = modules[row["test"].split("::")[0]]
        module[0] += 1
        module[1] += row["wall"]
        module[2] += row["cpu"]
    lines = [f"{len(rows)} tests, {sum(r['cpu'] for r in rows):.0f} CPU-s", "",
             "| module | tests | s (summed) | CPU-s |", "|---|---|---|---|"]  # fmt: skip
    for name, (n, wall, cpu) in sorted(modules.items(), key=lambda kv: -kv[1][2]):
        lines.append(f"| {name} | {n} | {wall:.0f} | {cpu:.1f} |")
    lines += ["", "| test | s | CPU-s |", "|---|---|---|"]
    for row in sorted(rows, key=lambda r: -r["cpu"])[:40]:
        lines.append(f"| {row['test']} | {row['wall']:.1f} | {row['cpu']:.1f} |")
    for cgroup in ROOT.glob("*/"):
        if not (cgroup / "cgroup.procs").read_text().strip():  # a cgroup still holding a process stays
            cgroup.rmdir()
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
