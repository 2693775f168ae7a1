"""LIBERO closed-loop speed: episodes per hour with 1 and 2 simulator workers; where an episode's time goes.

    .venv/bin/python bench/bench_libero.py [RUN_DIR] [--episodes 2] [--max-steps 200] [--workers 1,2]
        [--write]

Runs `bin/evaluate RUN_DIR --sim libero --suite libero_10 --tasks 0 --episodes E*K --max-steps M --workers K`
for each K (a fresh output folder each time), then reads its episode records (trainer/evaluation/sim/
worker.py): wall seconds of the episodes phase (results.json `seconds`: from the first worker's start to the
last record), and per episode the seconds of build (OffScreenRenderEnv), reset (reset, init state, 5
settling steps), physics (env.step less its renders), render (the two 128 x 128 cameras, robosuite's
sim.render), policy (the server's own time sampling chunks), encode (the server's compute_kv_cache: the
key frames through the run's encoder, the cache update), transport (round trips less the server's time:
msgpack, the websocket, the queue behind the other worker's requests) and video (the MP4). Per chunk:
the policy's seconds (policy + encode + transport) against the simulator's for the actions it drives
(physics + render): the policy is not the bottleneck when the first is the smaller.

Episodes per hour at 800 steps are projected from the measured per-step and per-chunk costs (a short
--max-steps keeps the benchmark short); the GPU-node line (EGL on the GPU) is a projection, not measured.
RUN_DIR: a `libero` preset run; without it, the tiny one the tests train (tests/support/presets_data.py,
run as a program: bench/ never imports tests/) is trained once under ~/.cache/lingbot-bench/libero-run.
--write: bench/results/<date>-libero-workers.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import CACHE, Table, fixture_program, machine  # noqa: E402

PARTS = ("build", "reset", "physics", "render", "policy", "encode", "transport", "video")


def tiny_run() -> Path:
    root = CACHE / "libero-run"
    if not (root / "run" / "checkpoints").is_dir():
        root.mkdir(parents=True, exist_ok=True)
        code = (
            "from pathlib import Path\nfrom tests.support.presets_data import train_tiny\n"
            f"train_tiny('libero', Path({str(root)!r}))"
        )
        fixture_program(code, timeout=1800)
    return root / "run"


def measure(run: Path, workers: int, episodes: int, max_steps: int, out: Path) -> dict:
    argv = [str(REPO / "bin" / "evaluate"), str(run), "--sim", "libero", "--suite", "libero_10",
            "--tasks", "0", "--episodes", str(episodes * workers), "--max-steps", str(max_steps),
            "--workers", str(workers),
            "--plots-dir", str(out), "--json"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"bin/evaluate exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout)
    records = [json.loads(p.read_text()) for p in sorted((out / "episodes").glob("*.json"))]
    n = len(records)
    per = {k: sum(r["timing"].get(k, 0.0) for r in records) / n for k in PARTS}
    chunks = sum(r["chunks"] for r in records) / n
    steps = sum(r["steps"] for r in records) / n
    return {"workers": workers, "episodes": n, "wall": result["seconds"], "per": per, "chunks": chunks,
            "steps": steps, "argv": argv}  # fmt: skip


def tables(rows: list[dict], max_steps: int) -> list[Table]:
    cols = ["workers", "episodes", "wall s", "episodes/hour", *[f"{k} s/ep" for k in PARTS], "steps/ep"]
    main = Table(
        f"LIBERO libero_10 task 0, --max-steps {max_steps}, seconds per episode (mean over its episodes)",
        cols,
        [
            [
                r["workers"],
                r["episodes"],
                r["wall"],
                3600 * r["episodes"] / r["wall"],
                *[r["per"][k] for k in PARTS],
                r["steps"],
            ]
            for r in rows
        ],  # fmt: skip
    )
    one = rows[0]
    speedup = [f"{r['workers']} workers: {(r['episodes'] / r['wall']) / (one['episodes'] / one['wall']):.2f}x"
               for r in rows[1:]]  # fmt: skip
    main.ratio = "episodes/hour vs 1 worker: " + ", ".join(speedup) if speedup else ""
    chunk_rows = []
    for r in rows:
        p = r["per"]
        policy = (p["policy"] + p["encode"] + p["transport"]) / r["chunks"]
        sim = (p["physics"] + p["render"]) / r["chunks"]
        chunk_rows.append([r["workers"], r["chunks"], policy, sim, policy / sim])
    per_chunk = Table(
        "per chunk: the policy's seconds (policy + encode + transport) vs the simulator's for its actions",
        ["workers", "chunks/ep", "policy s/chunk", "simulator s/chunk", "policy/simulator"],
        chunk_rows,
    )
    p, steps = one["per"], one["steps"]
    step_s = (p["physics"] + p["render"]) / steps
    chunk_s = (p["policy"] + p["encode"] + p["transport"]) / one["chunks"]
    full = p["build"] + p["reset"] + 795 * step_s + (795 / 16 + 1) * chunk_s + p["video"] * 795 / steps
    gpu_step = p["physics"] / steps  # projected: rendering on a GPU's EGL taken as free next to physics
    per_chunk.notes = [
        f"projection, 1 worker, an 800-step episode (795 after settling, 16 actions per later chunk): "
        f"{full:.0f} s -> {3600 / full:.1f} episodes/hour per worker on this CPU",
        f"projection (not measured), a GPU node with EGL on the GPU: rendering ~0, physics "
        f"{gpu_step * 1000:.0f} ms/step as here -> {795 * gpu_step:.0f} s of simulation per episode per "
        "core; the policy then runs on the GPU, its time per chunk the real model's (docs/evaluation.md)",
    ]
    return [main, per_chunk]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", nargs="?", default=None)
    parser.add_argument("--episodes", type=int, default=2, help="episodes per worker")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    run = Path(args.run) if args.run else tiny_run()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-libero-") as tmp:
        for k in (int(x) for x in args.workers.split(",")):
            rows.append(measure(run, k, args.episodes, args.max_steps, Path(tmp) / f"k{k}"))
    text = "\n\n".join(t.markdown() for t in tables(rows, args.max_steps))
    print(text)
    if args.write:
        day = datetime.date.today().isoformat()
        path = REPO / "bench" / "results" / f"{day}-libero-workers.md"
        head = (f"# LIBERO closed loop: episodes per hour and where the time goes, {day}\n\n"
                f"Command: `.venv/bin/python {' '.join(['bench/bench_libero.py', *sys.argv[1:]])}`\n\n"
                f"Machine: {json.dumps(machine())}\n\n")  # fmt: skip
        from provision.atomic import write_atomic

        write_atomic(path, head + text + "\n")
        print(f"written {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
