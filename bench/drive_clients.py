"""Serve a run with bin/serve and drive it with upstream's LIBERO or RoboTwin client loop, at their geometry.

    .venv/bin/python bench/drive_clients.py RUN_DIR [--loop libero|robotwin] [--chunks 3] \
        [--camera CLIENT_KEY=RUN_CAMERA ...] [--set KEY=VALUE ...]

Starts `bin/serve RUN_DIR --port 0` (with the --camera and --set given), then runs the loop of
trainer/evaluation/loops.py (written from evaluation/libero/client.py `run_one` and
evaluation/robotwin/eval_polict_client_openpi.py `eval_policy`) against it on a stand-in simulator for
`--chunks` chunks, prints one JSON line (action shapes, key frames per compute_kv_cache, finite, seconds,
bin/serve's exit status after SIGTERM) and exits non-zero when any chunk is missing, any action is not
finite, or the server failed. Not a test: the heavy lane's tests/test_serve.py and test_serve_clients.py
run the same loops; this is the command that drove the main job's checkpoint (docs/evaluation.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer.evaluation.loops import (  # noqa: E402
    LIBERO_CAMERAS,
    LIBERO_SIZE,
    libero_episode,
    robotwin_episode,
)
from trainer.evaluation.standin import RoboTwinSim, StandInSim  # noqa: E402
from trainer.serving.client import PolicyClient  # noqa: E402


def _start(argv: list[str]) -> tuple[subprocess.Popen, int, list[str]]:
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    assert proc.stderr is not None
    stderr = proc.stderr
    threading.Thread(target=lambda: lines.extend(line.rstrip() for line in stderr), daemon=True).start()
    while proc.poll() is None:
        found = [m for line in list(lines) if (m := re.search(r"listening on ws://127\.0\.0\.1:(\d+)", line))]
        if found:
            return proc, int(found[0].group(1)), lines
        time.sleep(0.1)  # polling for the ready line; the loop ends when bin/serve exits
    raise SystemExit(f"bin/serve exited {proc.returncode}:\n" + "\n".join(lines[-20:]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--loop", choices=("libero", "robotwin"), default="libero")
    parser.add_argument("--chunks", type=int, default=3)
    parser.add_argument("--camera", action="append", default=[])
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    argv = [str(REPO / "bin" / "serve"), args.run_dir, "--port", "0"]
    argv += [x for c in args.camera for x in ("--camera", c)] + [x for s in args.set for x in ("--set", s)]
    proc, port, lines = _start(argv)
    try:
        client = PolicyClient(f"ws://127.0.0.1:{port}")
        f, n, c = (client.metadata[k] for k in ("frames_per_chunk", "actions_per_frame", "channels"))
        steps = (f - 1) * n + (args.chunks - 1) * f * n
        started = time.perf_counter()
        if args.loop == "libero":
            ep = libero_episode(
                client, StandInSim({k: LIBERO_SIZE for k in LIBERO_CAMERAS}, c), "a task", steps
            )
        else:
            ep = robotwin_episode(client, RoboTwinSim(step_lim=steps), "a task")
        seconds = time.perf_counter() - started
        client.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait()
    finite = all(np.isfinite(a).all() for a in ep.actions)
    print(json.dumps({
        "loop": args.loop, "run_dir": args.run_dir, "chunks": len(ep.actions),
        "action_shapes": [list(a.shape) for a in ep.actions], "key_frames": ep.key_frames,
        "finite": bool(finite), "seconds": round(seconds, 2), "serve_exit": code,
    }))  # fmt: skip
    return 0 if len(ep.actions) >= args.chunks and finite and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
