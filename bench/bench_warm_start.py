"""Requeue warm start: attempt start -> first optimizer step, cold vs requeued, bin/train end to end.

Each pair starts from nothing: its own persistent compile caches (TORCHINDUCTOR_CACHE_DIR,
TRITON_CACHE_DIR, and the precompiled headers beside the Inductor cache: the launcher gives the ranks a
node-local TMPDIR seeded with them), its own TMPDIR and run dir. In a pair:
    cold        `bin/train furniture_train 1` (cpu_scale, train.compile=true): empty caches, no preflight
                record; stopped with SIGUSR1 after its first optimizer step (a preemption: it saves a
                checkpoint, exits 75 and writes its new kernels back to the persistent caches)
    warm        the same command again (the requeue, same node): resumes from that checkpoint, seeded from
                the persistent caches, the preflight's compile checks reused from the run dir's record;
                also stopped after its first optimizer step
    warm-other  the same command again as a requeue onto another node: a fresh TMPDIR and no preflight
                record (so envcheck compiles again), only the persistent caches carry over
Time is from starting bin/train (the attempt start) to the wall-clock mtime of the attempt's first
progress.json (rank 0 writes it right after its first optimizer step; trainer/attempt.py Progress), found
by polling. The launcher's and ranks' output lines are time-stamped as they arrive, which splits each
attempt into launcher + preflight, rank start -> model built (imports, build, checkpoint load), and build ->
first step (Dynamo tracing, Inductor compile or cache load, the step itself).

    .venv/bin/python bench/bench_warm_start.py [--pairs N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, Table, machine, median  # noqa: E402
from provision.atomic import write_atomic  # noqa: E402

COMMAND = ["bin/train", "furniture_train", "1", "--cpu-scale", "--set", "train.compile=true",
           "--set", "train.steps=40"]  # fmt: skip
MILESTONES = {  # first output line starting with ... -> milestone
    "torchrun": "[bin/train] $ ",
    "built": "[train] ",
}
TIMEOUT_S = 3600.0


_attempts: dict[int, str] = {}  # bin/train's pid -> its attempt id (from its "run dir ...; attempt" line)


def _first_progress(run_dir: Path, proc: subprocess.Popen, deadline: float) -> tuple[float, int]:
    """(wall time of the attempt's first optimizer step, that step): polls its progress.json; if a later
    step's write was seen first, those steps' s_per_it (metrics.jsonl) are subtracted."""
    while time.monotonic() < deadline:
        attempt = _attempts.get(proc.pid)
        progress = run_dir / "attempts" / (attempt or "-") / "progress.json"
        try:
            data = json.loads(progress.read_text())
            mtime = progress.stat().st_mtime
        except (OSError, ValueError):
            data = None
        if data is not None:
            first, last = int(data["first_step"]), int(data["last_step"])
            mtime -= sum(_s_per_it(run_dir, step) for step in range(first + 1, last + 1))
            return mtime, first
        if proc.poll() is not None:
            raise RuntimeError(f"bin/train exited {proc.returncode} before its first optimizer step")
        time.sleep(0.05)  # polling a file another process writes: the condition is re-read each time
    raise TimeoutError("no first optimizer step within the bench's time limit")


def _s_per_it(run_dir: Path, step: int) -> float:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if json.loads(line)["step"] == step][-1]["s_per_it"]


def _attempt(run_dir: Path, env: dict[str, str], log: Path) -> dict[str, float]:
    """One attempt: start, first optimizer step, SIGUSR1, exit 75. Seconds from start per milestone."""
    started_wall, started = time.time(), time.monotonic()
    proc = subprocess.Popen(
        [*COMMAND, "--run-dir", str(run_dir)], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    seen: dict[str, float] = {}

    def pump() -> None:
        assert proc.stdout is not None
        with open(log, "a") as out:
            for line in proc.stdout:
                now = time.monotonic() - started
                out.write(f"{now:8.2f} {line}")
                for name, prefix in MILESTONES.items():
                    if name not in seen and line.startswith(prefix):
                        seen[name] = now
                if line.startswith("[bin/train] run dir ") and "; attempt " in line:
                    _attempts[proc.pid] = line.split("; attempt ", 1)[1].split(";", 1)[0].strip()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        first_wall, first_step = _first_progress(run_dir, proc, time.monotonic() + TIMEOUT_S)
        proc.send_signal(signal.SIGUSR1)  # a preemption: save, write kernels back, exit 75
        rc = proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(timeout=60)
    if rc != 75:
        raise RuntimeError(f"bin/train exited {rc} after SIGUSR1 (expected 75); log {log}")
    total = first_wall - started_wall
    torchrun, built = seen.get("torchrun", float("nan")), seen.get("built", float("nan"))
    return {
        "first_step_s": total,
        "launcher_preflight_s": torchrun,
        "rank_to_built_s": built - torchrun,
        "built_to_first_step_s": total - built,
        "first_step": first_step,
        "load_1min": os.getloadavg()[0],  # the host's load when the first step was seen (shared host)
    }


def _pair(root: Path, index: int) -> dict[str, dict[str, float]]:
    base = root / f"pair{index}"
    caches, run_dir, log = base / "caches", base / "run", base / "log.txt"
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "TRITON_CACHE_DIR": str(caches / "triton"),
        "TMPDIR": str(base / "tmp-node-a"),
    }
    env["OMP_NUM_THREADS"] = "1"  # one thread per rank: OpenMP on an oversubscribed shared host stalls
    os.makedirs(env["TMPDIR"])
    out = {"cold": _attempt(run_dir, env, log), "warm": _attempt(run_dir, env, log)}
    shutil.rmtree(run_dir / "preflight")  # another node: no record for it, and its own TMPDIR
    env["TMPDIR"] = str(base / "tmp-node-b")
    os.makedirs(env["TMPDIR"])
    out["warm-other"] = _attempt(run_dir, env, log)
    out["cache_mib"] = {"size": sum(p.stat().st_size for p in caches.rglob("*") if p.is_file()) / 2**20}
    return out


def run(quick: bool = False, pairs: int | None = None) -> list[Table]:
    n = pairs or (1 if quick else 3)
    with tempfile.TemporaryDirectory(prefix="bench_warm_start_") as tmp:
        results = [_pair(Path(tmp), i) for i in range(n)]
    kinds = ("cold", "warm", "warm-other")
    keys = ("first_step_s", "launcher_preflight_s", "rank_to_built_s", "built_to_first_step_s")
    rows = [
        [f"{kind} (median)"] + [median(r[kind][k] for r in results) for k in keys] + [""] for kind in kinds
    ]
    rows += [
        [f"pair {i} {kind}"] + [r[kind][k] for k in keys] + [r[kind]["load_1min"]]
        for i, r in enumerate(results)
        for kind in kinds
    ]
    ratios = {kind: [r[kind]["first_step_s"] / r["cold"]["first_step_s"] for r in results] for kind in kinds}
    cold = median(r["cold"]["first_step_s"] for r in results)
    ratio = median(r["warm"]["first_step_s"] for r in results) / cold
    other = median(r["warm-other"]["first_step_s"] for r in results) / cold
    per_pair = ", ".join(f"{x:.3f}" for x in ratios["warm"])
    table = Table(
        title="Requeue warm start: bin/train start -> first optimizer step "
        f"(cpu_scale, train.compile, {n} pairs)",
        columns=[
            "attempt",
            "to first step s",
            "launcher + preflight s",
            "rank start -> built s",
            "built -> first step s",
            "host load (1 min)",
        ],  # fmt: skip
        rows=rows,
        ratio=f"warm / cold time to first optimizer step = {ratio:.3f} (ratio of medians; per pair "
        f"{per_pair}); requeue onto another node: {other:.3f}",
        notes=[
            "cold: empty persistent caches and no preflight record; warm: the requeue on the same node "
            "(caches seeded from the persistent copy the cold attempt wrote back on SIGUSR1, envcheck's "
            "compile checks reused); warm-other: fresh TMPDIR, preflight record removed (envcheck compiles).",
            "each attempt is stopped by SIGUSR1 after its first optimizer step (exit 75); warm attempts "
            "resume from the checkpoint the previous attempt saved.",
            f"persistent caches after a pair: {median(r['cache_mib']['size'] for r in results):.1f} MiB",
            "medians over pairs; the pairs run one after another (cold, warm, warm-other per pair); "
            "OMP_NUM_THREADS=1 for every attempt.",
        ],
    )
    return [table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pairs", type=int)
    parser.add_argument("--out", type=Path, help="default bench/results/<date>-warm_start.md")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M")
    tables = run(args.quick, args.pairs)
    body = "\n".join(t.markdown() for t in tables)
    info = ", ".join(f"{k} {v}" for k, v in machine().items())
    command = "`.venv/bin/python bench/bench_warm_start.py" + (
        f" --pairs {args.pairs}`" if args.pairs else "`"
    )
    text = f"# Warm start {started}\n\nCommand: {command}\n\nMachine: {info}\n\n{body}"
    print(text)
    out = args.out or REPO / "bench" / "results" / f"{started[:10]}-warm_start.md"
    write_atomic(out, text)


if __name__ == "__main__":
    main()
