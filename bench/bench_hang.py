"""The main job with one rank stopped: how long until bin/train names it, as a multiple of its median step.

    .venv/bin/python bench/bench_hang.py [--stop-after 3] [--out bench/results/<date>-hang.md]

Runs `bin/train furniture_train 2` (on a machine without a GPU: its cpu_scale variant; default `hang`
settings) in a fresh temporary run dir and data dir, waits for progress.json to report step N, sends
SIGSTOP to rank 1, and measures the time from the stop to the launcher's `no step for` line, then to its
exit. The ratio that matters is that delay over the attempt's median step (the `hung` record's
median_step_s): the rule says at most hang.step_factor (10) x the median, or hang.floor_s when larger,
plus the poll interval. Not part of the test suite (tests/test_hang.py holds the rule on a tiny run).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-after", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from provision.atomic import write_atomic
    from trainer.attempt import Attempt

    root = Path(tempfile.mkdtemp(prefix="bench-hang-"))
    run_dir = root / "run"
    argv_train = [str(REPO / "bin" / "train"), "furniture_train", "2", "--run-dir", str(run_dir),
                  "--set", f"data.path={root / 'data'}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LINGBOT_", "SLURM_"))}
    started = time.monotonic()
    proc = subprocess.Popen(argv_train, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic(), line))

    threading.Thread(target=read, daemon=True).start()
    attempt = None
    while proc.poll() is None:
        found = sorted((run_dir / "attempts").glob("*")) if (run_dir / "attempts").is_dir() else []
        attempt = Attempt(found[-1]) if found else None
        if attempt is not None and (attempt.read_progress().last_step or 0) >= args.stop_after:
            break
        time.sleep(0.05)  # polling progress.json with the launcher's own deadline (it exits otherwise)
    assert attempt is not None and proc.poll() is None, "".join(line for _, line in lines)
    rank1 = attempt.read_rank(1)
    assert rank1 is not None
    os.kill(rank1.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    rc = proc.wait()
    ended = time.monotonic()
    said = next((t for t, line in lines if "no step for" in line), None)
    summary = json.loads((run_dir / "summary.json").read_text())
    hung = summary.get("hung") or {}
    median = hung.get("median_step_s")
    delay = (said - stopped) if said is not None else float("nan")
    rows = [
        ("command", "bin/train " + " ".join(argv_train[1:3]) + " (cpu_scale, default hang settings)"),
        ("exit code", str(rc)),
        ("stopped rank 1 after step", str(hung.get("last_step"))),
        ("median step (s)", f"{median}"),
        ("limit (s)", f"{hung.get('limit_s')}"),
        ("SIGSTOP -> stall line (s)", f"{delay:.1f}"),
        ("stall line -> launcher exit (s)", f"{ended - said:.1f}" if said is not None else "-"),
        ("delay / median step", f"{delay / median:.2f}" if median else "-"),
        ("whole run (s)", f"{ended - started:.1f}"),
        ("load average at the end", " ".join(f"{x:.1f}" for x in os.getloadavg())),
    ]
    text = "# bench_hang: the main job, rank 1 SIGSTOPped\n\n| quantity | value |\n|---|---|\n"
    text += "".join(f"| {k} | {v} |\n" for k, v in rows)
    text += f"\nthe line: `{hung.get('line')}`\n"
    print(text)
    if args.out is not None:
        write_atomic(args.out, text)
    return 0 if rc == 1 and said is not None else 1


if __name__ == "__main__":
    sys.exit(main())
