"""envcheck's slow rows at once (provision/check/table.py) against the same rows one after another, on
the tool env with the caller's compilers (bin/train's tool-env fallback: compile_as_caller), wall time of
the whole check table.

    .venv/bin/python bench/bench_envcheck_rows.py [--rounds 2] [--fast] [--out FILE.md]

Both variants run the same TABLE rows in one process; "one by one" is TABLE with every row's `slow` mark
cleared (the mark only decides the thread; the progress lines go with it). Every compile probe starts
from fresh, empty caches (provision/probes: private TMPDIR, Inductor and Triton dirs), so each run is as
cold as the first on a new node. The variants alternate round by round (AB AB ...). Asserts that both
variants give every row the same status, so the faster one is checking the same things.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import machine  # noqa: E402
from provision.check import TABLE, run_checks  # noqa: E402

SERIAL = tuple(dataclasses.replace(spec, slow="") for spec in TABLE)


def one(fast: bool, table) -> tuple[float, dict[str, str]]:
    started = time.perf_counter()
    report = run_checks(
        Path(sys.prefix), worker=False, fast=fast, env=dict(os.environ), compile_as_caller=True, table=table
    )
    return time.perf_counter() - started, {c.name: c.status for c in report.checks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fast", action="store_true", help="bin/train's preflight rows only")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    walls: dict[str, list[float]] = {"at once": [], "one by one": []}
    statuses: dict[str, dict[str, str]] = {}
    for _ in range(args.rounds):
        for name, table in (("at once", TABLE), ("one by one", SERIAL)):
            wall, status = one(args.fast, table)
            walls[name].append(wall)
            statuses[name] = status
            print(f"{name}: {wall:.1f} s", file=sys.stderr, flush=True)
    if statuses["at once"] != statuses["one by one"]:
        raise SystemExit(f"the variants disagree: {statuses}")
    compiled = sorted(  # WARN: compiled, with the system compiler (compile_as_caller on the tool env)
        f"{n} {s}"
        for n, s in statuses["at once"].items()
        if n.startswith("compile.") and s in ("PASS", "WARN")
    )
    at_once, serial = statistics.median(walls["at once"]), statistics.median(walls["one by one"])
    lines = [
        "# envcheck's slow rows at once against one by one",
        "",
        "machine: " + ", ".join(f"{k} {v}" for k, v in machine().items()),
        f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        f"command: `.venv/bin/python bench/bench_envcheck_rows.py --rounds {args.rounds}"
        + (" --fast" if args.fast else "")
        + "`",
        f"compile rows that ran (status): {', '.join(compiled) or 'none'}",
        "",
        "| variant | wall s median | each round |",
        "|---|---|---|",
        *(
            f"| {name} | {statistics.median(w):.1f} | {', '.join(f'{x:.1f}' for x in w)} |"
            for name, w in walls.items()
        ),
        "",
        f"at once / one by one: {at_once / serial:.2f}",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        from provision.atomic import write_atomic

        write_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
