"""A LIBERO simulator worker: upstream's client loop, one episode per job, against a served policy.

    .sim/libero/bin/python -m trainer.evaluation.sim.worker --uri ws://127.0.0.1:PORT --suite libero_10 \
        --out DIR --max-steps 800 --seed 0   (started by runner.py; PYTHONPATH = the repo, in the sim env)

Runs inside the simulator environment (.sim/libero: LIBERO, robosuite, mujoco), never the tool env: from
this repo it imports only the loop (trainer/evaluation/loops.py), the client (trainer/serving/client.py and
its codec), provision/atomic.py, trainer/sim/ (--expert: trainer/sim/experts/) and trainer/testhooks.py.
Jobs come on stdin, one JSON line each ({"task": t, "episode": e}); for each, one JSON line on stdout when
the episode is written (the record below). stdout carries nothing else (LIBERO and robosuite print: they
go to stderr). Each episode has a connection of its own and sends its reset with `episode_seed` =
crc32("suite/task/episode") (the protocol's one extension): the noise of its chunks is the episode's own,
the same on every re-run.

One episode is upstream 58c2ae5 evaluation/libero/client.py `run_one`: the loop itself is loops.py
`libero_episode` (written line by line from run_one), on LiberoSim below, run_one's env side: the suite's
task t (its bddl file, its language as the prompt), `OffScreenRenderEnv` with 128 x 128 cameras built
afresh, `reset()`, `set_init_state(init_states[e % len(init_states)])` (the task's init states in order),
5 steps of the zero action `[0.] * 7`, images flipped `[::-1]` (agentview and eye-in-hand, keyed as
upstream's client keys them), `done` as LIBERO's env.step returns it (the task's bddl goal,
`_check_success`); until `env.env.timestep` (the 5 settling steps included, as upstream counts) reaches
--max-steps (upstream: 800). A job may instead name a recorded demonstration's scene, `"demo_seed": S`
(and `"cameras": false` for physics only: black frames, not rendered): the scene is then reset as the
recorder reset it (trainer/sim/demos.py: its seed space, `reset()`, no init state, the same settling), so
a policy replaying that demo's actions reproduces it (tests/test_sim_training.py). Differences, none in
what the policy sees or what counts: the env is built once, not retried 5 times (a failure is the
episode's error); the step limit is a flag (robosuite's own horizon, LIBERO's default 1000, is off:
ignore_done; a chunk the server refuses as not finite ends the episode as a failure, its reason in the
record, where upstream's client raised); time is measured;
and Python's and numpy's global RNGs are seeded from (--seed, suite, task, episode) before the env is
built. LIBERO draws from them while building a scene, and the same init state then renders differently
from one build to the next (measured: libero_goal task 0, init state 0, two builds: the same qpos, the
agentview images up to 158 apart, 3.5 on average; 0 apart when seeded), so upstream's runs are not
repeatable; seeded, the same command plays the same episodes.

Expert mode (`--expert` instead of `--uri`; bin/evaluate --sim libero --expert): the same episode with
no server: trainer/sim/experts/'s scripted expert for the task acts each step on the env and its raw
observation, until `done` or --max-steps; a key frame is kept every step (the loop's cadence for N = 4,
N // 4 = 1); `policy` times the expert, `chunks` is 0.

Written per episode (each atomically, the record last, so a record means the episode is complete):
    DIR/videos/t<task>_e<episode>_<success|failure>.mp4   the key frames, agentview | eye-in-hand side by
                                                          side (upstream's save_video: hstack, fps 60)
    DIR/episodes/t<task>_e<episode>.json                  the record: task, episode, language, success,
                                                          reason (a failure's: the step limit, or the
                                                          server's refusal of a non-finite chunk; null
                                                          on success), steps, chunks, seconds, timing
                                                          {build, reset, physics, render, policy, encode,
                                                          transport, video}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from trainer.sim.scene import CAMERAS, SETTLE, SIZE, extract, seed_scene


class TimedClient:
    """PolicyClient (upstream's WebsocketClientPolicy's behaviour) with its round trips timed: the server's
    own `server_timing.infer_ms` is the policy's time (`policy`: sampling chunks and resets; `encode`:
    compute_kv_cache, the key frames through the run's encoder and the cache update), the rest of the round
    trip is `transport` (msgpack both ways, the websocket, the server's queue)."""

    def __init__(self, uri: str):
        from trainer.serving.client import PolicyClient

        self.client = PolicyClient(uri, open_timeout=60)
        self.metadata = self.client.metadata
        self.policy_s = self.encode_s = self.transport_s = 0.0
        self.chunks = 0  # chunk requests made (the last may have been refused)

    def infer(self, obs: dict) -> dict:
        start = time.perf_counter()
        if not obs.get("reset") and not obs.get("compute_kv_cache"):
            self.chunks += 1
        reply = self.client.infer(obs)
        took = time.perf_counter() - start
        server = reply.get("server_timing", {}).get("infer_ms", 0.0) / 1000
        if obs.get("compute_kv_cache"):
            self.encode_s += server
        else:
            self.policy_s += server
        self.transport_s += took - server
        return reply


class LiberoSim:
    """LIBERO's OffScreenRenderEnv as loops.LiberoEnv: run_one's init_single_env and env_one_step, timed;
    the key frames kept for the video (upstream's full_obs_list: each step with (j + 1) % (N // 4) == 0
    that was not done, i.e. every (N // 4)-th step after the settling), and the test hooks."""

    def __init__(self, env, init_state, task: int, episode: int, key_every: int, cameras: bool = True):
        from trainer import testhooks

        self.env, self.init_state, self.task, self.episode = env, init_state, task, episode
        self.cameras = cameras  # False: a physics-only env, black frames (trainer/sim/demos.py)
        self.key_every, self.goal_at = key_every, testhooks.sim_goal_at()
        self.frames: list[dict] = []
        self.raw: dict = {}  # the last observation as env.step returned it (what an expert reads)
        self.timestep = 0  # env.env.timestep after the last reset or step (the settling steps counted)
        self.step_s = self.render_s = self.reset_s = 0.0

    def _time_renders(self) -> None:
        """robosuite renders each camera through sim.render inside env.step (reset makes a new sim)."""
        sim = self.env.env.sim
        render = sim.render

        def timed_render(*args, **kwargs):
            start = time.perf_counter()
            try:
                return render(*args, **kwargs)
            finally:
                self.render_s += time.perf_counter() - start

        sim.render = timed_render

    def reset(self) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        self.env.reset()
        self._time_renders()
        if self.init_state is not None:  # None: a demonstration's scene, as reset (trainer/sim/demos.py)
            self.env.set_init_state(self.init_state)
        for _ in range(SETTLE):
            obs, _, _, _ = self.env.step([0.0] * 7)
        self.raw = obs
        self.reset_s, self.render_s = time.perf_counter() - start, 0.0
        from trainer import testhooks

        if (late := testhooks.sim_start_at()) is not None:
            self.env.env.timestep = late
        self.timestep = int(self.env.env.timestep)
        return self._observe(obs)

    def _observe(self, obs: dict) -> dict[str, np.ndarray]:
        from trainer.sim.demos import blank_frames

        return extract(obs) if self.cameras else blank_frames()

    def step(self, action) -> tuple[dict[str, np.ndarray], bool]:
        from trainer import testhooks

        testhooks.sim_crash(self.task, self.episode)
        start = time.perf_counter()
        obs, _, done, _ = self.env.step(action)
        self.step_s += time.perf_counter() - start
        self.raw = obs
        self.timestep = int(self.env.env.timestep)
        observes, steps = self._observe(obs), self.timestep - SETTLE
        if self.goal_at is not None and steps == self.goal_at:
            from trainer.sim.goal import reach_goal

            print(f"worker: test hook: goal state set: {reach_goal(self.env)}", file=sys.stderr)
        if not done and steps % self.key_every == 0:
            self.frames.append(observes)
        return observes, bool(done)


def nonfinite_reason(exc: Exception) -> str | None:
    """Why an episode failed when the server refused a chunk as not finite (session.py observe: a
    FloatingPointError, answered as a server error, raised by the client as ServerError), else None."""
    from trainer.serving.client import ServerError

    text = str(exc)
    if not isinstance(exc, ServerError) or "FloatingPointError" not in text:
        return None
    return "the served actions were not finite: " + text.split("FloatingPointError: ", 1)[1].strip()


def play(
    client: TimedClient, sim: Any, prompt: str, max_steps: int, noise: int
) -> tuple[bool, int, str | None]:
    """loops.py libero_episode on `sim`: (success, chunks, reason): a failure's reason is the step limit, or
    the server's refusal of a non-finite chunk (an outcome of the policy, not the worker's error)."""
    from trainer.evaluation.loops import libero_episode

    try:
        played = libero_episode(client, sim, prompt, max_steps, episode_seed=noise)
    except Exception as exc:
        reason = nonfinite_reason(exc)
        if reason is None:
            raise
        return False, client.chunks - 1, reason
    done = bool(played.done)
    return done, len(played.actions), None if done else f"not done within --max-steps {max_steps}"


def run_one(
    client: TimedClient, suite: Any, task: int, episode: int, max_steps: int, seed: int = 0,
    demo_seed: int | None = None, cameras: bool = True,
) -> dict:  # fmt: skip
    """One episode (see the module docstring): its record, and the key frames under "frames". An
    unsolved episode is a failure with its `reason` (the step limit, or a chunk the server refused as not
    finite); anything else the server or the simulator raises is the worker's error (runner.py)."""
    from trainer.sim.demos import make_env, seed_demo

    t0 = time.perf_counter()
    prompt = suite.get_task(task).language
    if demo_seed is None:
        init_states = suite.get_task_init_states(task)
        init_state = init_states[episode % init_states.shape[0]]
        seed_scene(seed, suite.name, task, episode)
    else:  # a recorded demonstration's scene (its seed space; no init state)
        init_state = None
        seed_demo(suite.name, task, demo_seed)
    # ignore_done: robosuite's own horizon (LIBERO's default 1000) never ends the episode: --max-steps does
    # (a chunk begun before it runs whole, as upstream's loop); past its horizon robosuite raised
    # "executing action in terminated episode" and every unsolved episode of --max-steps >= ~994 was an error
    env = make_env(suite, task, cameras, ignore_done=True)
    build = time.perf_counter() - t0
    key_every = max(1, int(client.metadata["actions_per_frame"]) // 4)
    sim = LiberoSim(env, init_state, task, episode, key_every, cameras)
    try:
        # the episode's own noise index on the server (a connection per episode would give every one 0)
        noise = zlib.crc32(f"{suite.name}/{task}/{episode}".encode())
        success, chunks, reason = play(client, sim, prompt, max_steps, noise)
        steps = sim.timestep - SETTLE
    finally:
        env.close()
    return {
        "task": task, "episode": episode, "language": prompt, "success": success, "steps": steps,
        "chunks": chunks, "reason": reason, "frames": sim.frames,
        "timing": {
            "build": build, "reset": sim.reset_s, "physics": sim.step_s - sim.render_s,
            "render": sim.render_s, "policy": client.policy_s, "encode": client.encode_s,
            "transport": client.transport_s,
        },
    }  # fmt: skip


def run_expert(suite: Any, task: int, episode: int, max_steps: int, seed: int = 0) -> dict:
    """One episode played by the task's scripted expert (see the module docstring): run_one's record."""
    from trainer.sim.demos import make_env
    from trainer.sim.experts import expert_for

    t0 = time.perf_counter()
    expert = expert_for(suite.name, task)
    init_states = suite.get_task_init_states(task)
    seed_scene(seed, suite.name, task, episode)
    env = make_env(suite, task, cameras=True, ignore_done=True)  # as run_one: --max-steps ends an episode
    build = time.perf_counter() - t0
    sim = LiberoSim(env, init_states[episode % init_states.shape[0]], task, episode, key_every=1)
    acting, done = 0.0, False
    try:
        sim.reset()
        expert.reset()
        while sim.timestep < max_steps and not done:
            start = time.perf_counter()
            action = expert.act(env, sim.raw)
            acting += time.perf_counter() - start
            _, done = sim.step(action.tolist())
        steps = sim.timestep - SETTLE
    finally:
        env.close()
    return {
        "task": task, "episode": episode, "language": suite.get_task(task).language, "success": done,
        "steps": steps, "chunks": 0, "frames": sim.frames,
        "reason": None if done else f"not done within --max-steps {max_steps}",
        "timing": {"build": build, "reset": sim.reset_s, "physics": sim.step_s - sim.render_s,
                   "render": sim.render_s, "policy": acting, "encode": 0.0, "transport": 0.0},
    }  # fmt: skip


def save_video(frames: list[dict], path: Path, fps: int = 60) -> None:
    """upstream's save_video: each key frame's cameras side by side (resized to the first's), atomically."""
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
    policy = parser.add_mutually_exclusive_group(required=True)
    policy.add_argument("--uri", help="the served policy's websocket")
    policy.add_argument("--expert", action="store_true", help="the task's scripted expert, no server")
    parser.add_argument("--suite", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--max-steps", type=int, default=800)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    records = os.fdopen(os.dup(1), "w")  # the records' channel; fd 1 (LIBERO's prints) goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from libero.libero import benchmark

    suite = benchmark.get_benchmark_dict()[args.suite]()
    for line in sys.stdin:
        job = json.loads(line)
        if args.expert:
            played = run_expert(suite, job["task"], job["episode"], args.max_steps, args.seed)
            print(json.dumps(write_episode(played, args.out)), file=records, flush=True)
            continue
        client = TimedClient(args.uri)  # a connection (a server session) per episode: its noise is its own
        try:
            record = run_one(client, suite, job["task"], job["episode"], args.max_steps, args.seed,
                             job.get("demo_seed"), job.get("cameras", True))  # fmt: skip
        finally:
            client.client.close()
        record = write_episode(record, args.out)
        print(json.dumps(record), file=records, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
