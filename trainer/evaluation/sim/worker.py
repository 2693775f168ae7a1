"""A LIBERO simulator worker: upstream's client loop, one episode per job, against a served policy.

    .sim/libero/bin/python -m trainer.evaluation.sim.worker --uri ws://127.0.0.1:PORT --suite libero_10 \
        --out DIR --max-steps 800        (started by runner.py; PYTHONPATH = the repo, in the sim env)

Runs inside the simulator environment (.sim/libero: LIBERO, robosuite, mujoco), never the tool env: it
imports numpy, websockets, msgpack, LIBERO and, from this repo, only protocol.py's codec, provision/atomic.py
and trainer/testhooks.py. Jobs come on stdin, one JSON line each ({"task": t, "episode": e}); for each,
one JSON line on stdout when the episode is written (the record below), over a connection of its own
(the server's session, and so the noise of its chunks, is the episode's alone, whatever ran before). stdout carries nothing else
(LIBERO and robosuite print: they go to stderr).

One episode is upstream 58c2ae5 evaluation/libero/client.py `run_one`, step for step: the suite's task t
(its bddl file, its language as the prompt), `OffScreenRenderEnv` with 128 x 128 cameras built afresh,
`reset()`, `set_init_state(init_states[e % len(init_states)])` (the task's init states in order), 5 steps
of the zero action `[0.] * 7`, images flipped `[::-1]` (agentview and eye-in-hand, keyed as upstream's
client keys them); `reset` with the prompt; then per chunk: `infer(obs=first observation)` -> (C, F, N)
actions (`assert N % 4 == 0`), every action of latent frames 1..F-1 (0..F-1 after the first chunk)
stepped, a key frame kept every N // 4 actions, the loop left on `done`; else `compute_kv_cache` with
the key frames and `state=action`; until `env.env.timestep` reaches --max-steps (upstream: 800).
Differences, none in what the policy sees or what counts: the env is built once, not retried 5 times
(a failure is the episode's error); the step limit is a flag; time is measured.

Written per episode (each atomically, the record last, so a record means the episode is complete):
    DIR/videos/t<task>_e<episode>_<success|failure>.mp4   the key frames, agentview | eye-in-hand side by
                                                          side (upstream's save_video: hstack, fps 60)
    DIR/episodes/t<task>_e<episode>.json                  the record: task, episode, language, success,
                                                          steps, chunks, seconds, timing {build, reset,
                                                          physics, render, policy, transport, video}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

CAMERAS = ("observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb")
SIZE = 128  # run_one: camera_heights, camera_widths
SETTLE = 5  # init_single_env: `for _ in range(5): env.step([0.] * 7)`


class Client:
    """upstream's WebsocketClientPolicy as run_one uses it: infer(dict) -> dict; a text reply raises."""

    def __init__(self, uri: str):
        from websockets.sync.client import connect

        self.ws = connect(uri, compression=None, max_size=None, ping_interval=None, open_timeout=60)
        self.metadata = self._recv()
        self.transport_s = self.server_s = 0.0

    def _recv(self) -> Any:
        from trainer.inference.protocol import unpack

        data = self.ws.recv()
        if isinstance(data, str):
            raise RuntimeError(f"Error in inference server:\n{data}")
        return unpack(data)

    def infer(self, obs: dict) -> dict:
        from trainer.inference.protocol import pack

        start = time.perf_counter()
        self.ws.send(pack(obs))
        reply = self._recv()
        took = time.perf_counter() - start
        server = reply.get("server_timing", {}).get("infer_ms", 0.0) / 1000
        self.server_s += server
        self.transport_s += took - server
        return reply


def extract(obs: dict) -> dict[str, np.ndarray]:
    """run_one's _extract_obs: both cameras flipped vertically, contiguous."""
    return {
        CAMERAS[0]: np.ascontiguousarray(obs["agentview_image"][::-1]),
        CAMERAS[1]: np.ascontiguousarray(obs["robot0_eye_in_hand_image"][::-1]),
    }


class Timed:
    """The env with env.step timed, and its camera renders inside it (robosuite's sim.render)."""

    def __init__(self, env: Any):
        self.env, self.step_s, self.render_s = env, 0.0, 0.0
        sim = env.env.sim
        render = sim.render

        def timed_render(*args, **kwargs):
            start = time.perf_counter()
            try:
                return render(*args, **kwargs)
            finally:
                self.render_s += time.perf_counter() - start

        sim.render = timed_render

    def step(self, action) -> tuple[dict, bool]:
        start = time.perf_counter()
        obs, _, done, _ = self.env.step(action)
        self.step_s += time.perf_counter() - start
        return extract(obs), bool(done)


def run_one(client: Client, suite: Any, task: int, episode: int, max_steps: int) -> dict:
    """One episode (see the module docstring); its record, and the key frames under "frames"."""
    from libero.libero.envs import OffScreenRenderEnv

    from trainer import testhooks

    t0 = time.perf_counter()
    prompt = suite.get_task(task).language
    env_args = {"bddl_file_name": suite.get_task_bddl_file_path(task), "camera_heights": SIZE,
                "camera_widths": SIZE}  # fmt: skip
    init_states = suite.get_task_init_states(task)
    env = OffScreenRenderEnv(**env_args)
    t1 = time.perf_counter()
    try:
        env.reset()
        env.set_init_state(init_states[episode % init_states.shape[0]])
        for _ in range(SETTLE):
            obs, _, _, _ = env.step([0.0] * 7)
        first_obs = extract(obs)
        t2 = time.perf_counter()
        sim, goal_at = Timed(env), testhooks.sim_goal_at()
        policy0, transport0 = client.server_s, client.transport_s
        client.infer(dict(reset=True, prompt=prompt))
        frames, done, first, chunks = [], False, True, 0
        while env.env.timestep < max_steps:
            action = client.infer(dict(obs=first_obs, prompt=prompt))["action"]
            chunks += 1
            key_frame_list = []
            assert action.shape[2] % 4 == 0
            action_per_frame = action.shape[2] // 4
            for i in range(1 if first else 0, action.shape[1]):
                for j in range(action.shape[2]):
                    testhooks.sim_crash(task, episode)
                    observes, done = sim.step(action[:, i, j])
                    if goal_at is not None and env.env.timestep - SETTLE == goal_at:
                        from trainer.evaluation.sim.goal import reach_goal

                        print(f"worker: test hook: goal state set: {reach_goal(env)}", file=sys.stderr)
                    if done:
                        break
                    if (j + 1) % action_per_frame == 0:
                        frames.append(observes)
                        key_frame_list.append(observes)
                if done:
                    break
            first = False
            if done:
                break
            client.infer(dict(obs=key_frame_list, compute_kv_cache=True, imagine=False, state=action))
        steps = int(env.env.timestep) - SETTLE
    finally:
        env.close()
    return {
        "task": task, "episode": episode, "language": prompt, "success": bool(done),
        "steps": steps, "chunks": chunks, "frames": frames,
        "timing": {
            "build": t1 - t0, "reset": t2 - t1, "physics": sim.step_s - sim.render_s, "render": sim.render_s,
            "policy": client.server_s - policy0, "transport": client.transport_s - transport0,
        },
    }  # fmt: skip


def save_video(frames: list[dict], path: Path, fps: int = 60) -> None:
    """upstream's save_video: each key frame's cameras side by side (resized to the first's size), atomically."""
    import cv2
    import imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.partial.mp4")
    if frames:
        h, w = frames[0][CAMERAS[0]].shape[:2]
        rows = [np.hstack([cv2.resize(f[c], (w, h)) for c in CAMERAS]).astype(np.uint8) for f in frames]
    else:  # done before the first key frame: a one-frame video of nothing, so every episode has its file
        rows = [np.zeros((SIZE, 2 * SIZE, 3), np.uint8)]
    imageio.mimsave(tmp, rows, fps=fps)
    os.replace(tmp, path)


def write_episode(record: dict, out: Path) -> dict:
    from provision.atomic import write_json_atomic

    frames = record.pop("frames")
    start = time.perf_counter()
    name = f"t{record['task']:02d}_e{record['episode']:03d}"
    video = out / "videos" / f"{name}_{'success' if record['success'] else 'failure'}.mp4"
    save_video(frames, video)
    record["timing"]["video"] = time.perf_counter() - start
    record["video"] = str(video.relative_to(out))
    record["seconds"] = sum(record["timing"].values())
    (out / "episodes").mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "episodes" / f"{name}.json", record)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--max-steps", type=int, default=800)
    args = parser.parse_args(argv)
    records = os.fdopen(os.dup(1), "w")  # the records' channel; fd 1 (LIBERO's prints) goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from libero.libero import benchmark

    suite = benchmark.get_benchmark_dict()[args.suite]()
    for line in sys.stdin:
        job = json.loads(line)
        client = Client(args.uri)  # a connection (a server session) per episode: its noise is the episode's own
        try:
            record = run_one(client, suite, job["task"], job["episode"], args.max_steps)
        finally:
            client.ws.close()
        record = write_episode(record, args.out)
        print(json.dumps(record), file=records, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
