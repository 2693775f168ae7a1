"""LIBERO's first reset per episode: upstream's hard reset against a soft one, its CPU, and whether the
scene is the same.

    .venv/bin/python bench/bench_libero_reset.py [--tasks libero_goal:0,libero_10:3,...] [--write]

Each episode builds `OffScreenRenderEnv` and then resets it before `set_init_state` (upstream 58c2ae5
`run_one`; trainer/evaluation/sim/worker.py does the same). robosuite's default reset is hard: it loads the
model again. `hard_reset=False` would skip that. For each task, one fresh simulator process per variant
(the simulator env's python, `.sim/libero`, built by sim/build.sh; the GL backend bin/evaluate would
choose), the global RNGs seeded as worker.py seeds them: CPU seconds of the build and of the reset, then
20 env steps (10 zero actions, 10 of one fixed action) from the task's init state 0, hashed (both
cameras' images and the flattened sim state after each step). The variants are the same scene when the
hashes are equal; "bodies moved" lists the model's bodies whose places (body_pos) differ.

Result (bench/results/2026-12-06-libero-reset.md, AMD EPYC 2 cores): the soft reset saves 2.1-3.5 CPU-s
an episode, and libero_10 task 3 is another scene with it (bodies moved: the hard reset's model load draws
the fixed bodies' places again, and set_init_state restores only the joints), so worker.py keeps
upstream's hard reset (docs/evaluation.md). --write: bench/results/<date>-libero-reset.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TASKS = "libero_goal:0,libero_goal:9,libero_10:3,libero_spatial:5,libero_object:7,libero_90:40"
STEPS = 20


def probe(mode: str, suite_name: str, task: int) -> dict:
    """Runs inside the simulator env: one variant of one task (see the module docstring)."""
    import hashlib
    import random
    import resource
    import time

    import numpy as np
    from libero.libero import benchmark
    from libero.libero.envs import OffScreenRenderEnv

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    suite = benchmark.get_benchmark_dict()[suite_name]()
    random.seed(f"0:{suite_name}:{task}:0")  # worker.py's seed_scene for seed 0, episode 0
    np.random.seed([0, task, 0, sum(suite_name.encode())])
    extra = {} if mode == "hard" else {"hard_reset": False}
    c0, t0 = cpu(), time.perf_counter()
    env = OffScreenRenderEnv(bddl_file_name=suite.get_task_bddl_file_path(task), camera_heights=128,
                             camera_widths=128, **extra)  # fmt: skip
    c1, t1 = cpu(), time.perf_counter()
    env.reset()
    c2, t2 = cpu(), time.perf_counter()
    env.set_init_state(suite.get_task_init_states(task)[0])
    body_pos = np.asarray(env.sim.model.body_pos).round(9).tolist()  # the fixed bodies' places
    digest = hashlib.sha256()
    for i in range(STEPS):
        action = np.zeros(7) if i < STEPS // 2 else np.array([0.3, -0.2, 0.1, 0.0, 0.0, 0.1, -1.0])
        obs, _, _, _ = env.step(action)
        for camera in ("agentview_image", "robot0_eye_in_hand_image"):
            digest.update(np.ascontiguousarray(obs[camera]).tobytes())
        digest.update(np.asarray(env.get_sim_state()).tobytes())
    env.close()
    return {"build_cpu": c1 - c0, "build_s": t1 - t0, "reset_cpu": c2 - c1, "reset_s": t2 - t1,
            "hash": digest.hexdigest(), "body_pos": body_pos}  # fmt: skip


def run_probe(python: Path, env: dict[str, str], mode: str, suite: str, task: int) -> dict:
    argv = [str(python), __file__, "--probe", mode, suite, str(task)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=TASKS, help="SUITE:TASK,... (default: %(default)s)")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--probe", nargs=3, metavar=("MODE", "SUITE", "TASK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        mode, suite, task = args.probe
        print(json.dumps(probe(mode, suite, int(task))))
        return 0

    sys.path.insert(0, str(REPO))
    from bench.common import Table, machine, publish
    from trainer.sim.env import choose_gl, ensure_env, worker_env

    python = ensure_env("libero", lambda line: print(line, file=sys.stderr))
    env = worker_env(python, choose_gl(python, lambda line: print(line, file=sys.stderr)))
    rows, same = [], 0
    for item in args.tasks.split(","):
        suite, task = item.split(":")
        hard, soft = (run_probe(python, env, mode, suite, int(task)) for mode in ("hard", "soft"))
        equal = hard["hash"] == soft["hash"]
        pairs = enumerate(zip(hard["body_pos"], soft["body_pos"], strict=True))
        moved = " ".join(str(b) for b, (h, s) in pairs if h != s) or "none"
        same += equal
        saved = hard["reset_cpu"] - soft["reset_cpu"]
        rows.append([f"{suite} {task}", hard["build_cpu"], hard["reset_cpu"], soft["build_cpu"],
                     soft["reset_cpu"], saved, "yes" if equal else "NO", moved])  # fmt: skip
    table = Table(
        f"the first reset, hard (upstream) vs soft: CPU-s per episode; {STEPS} steps' images, states hashed",
        [
            "task",
            "hard build",
            "hard reset",
            "soft build",
            "soft reset",
            "saved",
            "same scene",
            "bodies moved",
        ],
        rows,
    )
    table.ratio = f"the same scene in {same} of {len(rows)} tasks"
    lines = [f"Command: `.venv/bin/python bench/bench_libero_reset.py {' '.join(sys.argv[1:])}`".rstrip(),
             f"Machine: {json.dumps(machine())}", "", table.markdown()]  # fmt: skip
    out = None
    if args.write:
        import datetime

        out = REPO / "bench" / "results" / f"{datetime.date.today().isoformat()}-libero-reset.md"
    publish(lines, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
