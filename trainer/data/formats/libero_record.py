"""A small LIBERO dataset of scripted expert demonstrations, recorded in LIBERO's simulator, written by
LeRobot's writer.

Demonstrations of a scripted expert (trainer/sim/experts: `expert_for(suite, task)`, the tasks
`tasks_with_experts(suite)`), announced as such: not human demonstrations, not upstream's dataset. Demo e
takes task tasks[e % len(tasks)] (default: every task of the suite with an expert) and that task's next
seed of the demonstrations' own seed space (trainer/sim/demos.py: seeded random resets, never the 50
official init states, which are the evaluation's); the expert drives it until LIBERO's `done` or --max-steps
actions. A demo that does not succeed is not written: the next seed is tried (at most MAX_TRIES failures in a
row per demo, then exit 1 naming the task), and the count of failures is said.

Cameras (--cameras, default `replay`, the faster: bench/results/2026-12-07-libero-record.md):
    replay   the expert plays physics only (no renderer), then the demo is replayed from the same seed with
             the 128 x 128 cameras on; the replay must reach done on its last action with the same states bit
             for bit, else the demo is dropped (said, counted) and the next seed is tried
    play     the expert plays with the cameras on; a physics-only replay then checks the same
Either way every written demo is replayable bit for bit from its seed (trainer/evaluation/sim/worker.py
resets a job's `demo_seed` the same way; tests/test_sim_training.py replays one through bin/serve's path).

One row per control step (20 Hz): the observation before the step (both cameras flipped as the
evaluation's worker flips them, trainer/sim/scene.py extract), the action (LIBERO's delta end-effector
command: xyz, axis-angle, gripper -1 open / +1 closed), `observation.state` (8,) = eef xyz, eef axis-angle,
the two gripper finger positions. The layout is the `libero` preset's (upstream LingBot-VA's): LeRobot v2.1
written by lerobot 0.3.3's LeRobotDataset.create / add_frame / save_episode, video cameras
`observation.images.agentview_rgb` and `observation.images.eye_in_hand_rgb` (128 x 128), `action` (7,)
float32, the task's language as the episode's task, fps 20, robot_type panda. Beside lerobot's own files,
`meta/demos.jsonl`: one line per episode {episode_index, suite, task, seed, seed_space, steps, expert}, what
replays it (lerobot's reader and this repository's read only the files they know; this one is ignored).

    python -m trainer.data.formats.libero_record OUT --episodes 6 [--max-steps 300] [--suite libero_goal]
            [--tasks 0,3] [--cameras replay|play]
        runs INSIDE the simulator env (.sim/libero's python, LIBERO_CONFIG_PATH and MUJOCO_GL set, as
        trainer/sim/env.py worker_env does); needs lerobot 0.3.3 importable there
    record_dataset(root, episodes, max_steps, suite, say, tasks=None)
        the caller's side (the tool env; data.generated_episodes demos in all, data.generated_length
        actions at most each): builds the simulator env (sim/build.sh), picks the GL backend, runs the above
        into a temporary sibling of root and renames it into place when complete (a killed recording never
        looks like a dataset); RecordError (one line: why, and the fix) otherwise

lerobot 0.3.3 and its writer's imports are in the simulator env's locks (sim/libero/nodeps.in,
requirements.in).
lerobot's writer imports torchvision at module level without calling it; the simulator env has no
torchvision (its torch is the CPU build), so this process puts a stand-in module, raising on any use, in
sys.modules before importing lerobot (_stand_in_torchvision; the test writer tests/support/lerobot_write.py
does the same).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainer.sim.scene import CAMERAS, SIZE

FPS = 20
MAX_TRIES = 5  # failed or diverged seeds in a row before a task is given up (exit 1)
ANNOUNCE = (
    "RECORDED SCRIPTED DEMONSTRATIONS: a scripted expert's demonstrations in LIBERO's simulator "
    "(trainer/sim/experts; not human demonstrations, not upstream's dataset); point data.path at a real "
    "LeRobot LIBERO dataset to train on upstream's demonstrations"
)


class RecordError(RuntimeError):
    """The dataset could not be recorded (one line: why, and the fix)."""


def _stand_in_torchvision() -> None:
    """lerobot 0.3.3 imports torchvision at module level; its writer never calls it (transforms apply when
    rows are read; torchvision.io decodes only for the torchvision video backend). The simulator env has
    none: its torch is the CPU build and PyPI's torchvision is the CUDA one (its ops do not load beside the
    CPU torch). So, in this process only and only when no torchvision is importable, a module whose every
    use raises stands in (sys.modules, before lerobot is imported): a call would fail loudly, never
    silently; nothing in the env's site-packages is touched."""
    import importlib.machinery
    import importlib.util
    import types

    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return

    def unavailable(*args, **kwargs):
        raise NotImplementedError("torchvision is a stand-in in the LIBERO recorder (libero_record.py)")

    class _StandIn(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return unavailable

    tv, transforms = _StandIn("torchvision"), _StandIn("torchvision.transforms")
    tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
    transforms.__spec__ = importlib.machinery.ModuleSpec("torchvision.transforms", None)
    tv.transforms = transforms  # type: ignore[attr-defined]
    sys.modules["torchvision"], sys.modules["torchvision.transforms"] = tv, transforms


def write_dataset(root: Path, demos: list, suite: str) -> None:
    """demos (trainer/sim/demos.py Demo, rendered) -> a LeRobot v2.1 dataset at root, by lerobot 0.3.3's
    own writer, and meta/demos.jsonl (each episode's reset seed)."""
    _stand_in_torchvision()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from provision.atomic import write_atomic

    hwc = {"dtype": "video", "shape": (SIZE, SIZE, 3), "names": ["height", "width", "channels"]}
    features = {
        **{k: dict(hwc) for k in CAMERAS},
        "observation.state": {"dtype": "float32", "shape": (8,), "names": [f"q{i}" for i in range(8)]},
        "action": {"dtype": "float32", "shape": (7,), "names": [f"a{i}" for i in range(7)]},
    }
    ds = LeRobotDataset.create(repo_id="lingbot/libero_demos", fps=FPS, features=features, root=root,
                               robot_type="panda", use_videos=True, image_writer_threads=0)  # fmt: skip
    for demo in demos:
        for t in range(len(demo.actions)):
            row = {k: demo.frames[k][t] for k in CAMERAS}
            ds.add_frame({**row, "observation.state": demo.states[t], "action": demo.actions[t]},
                         task=demo.language)  # fmt: skip
        ds.save_episode()
    lines = []
    for e, d in enumerate(demos):
        record = {"episode_index": e, "suite": suite, "task": d.task, "seed": d.seed, "seed_space": "demo",
                  "steps": len(d.actions), "expert": d.expert}  # fmt: skip
        lines.append(json.dumps(record))
    write_atomic(root / "meta" / "demos.jsonl", "".join(line + "\n" for line in lines))


def read_demos(root: Path) -> list[dict]:
    """meta/demos.jsonl of a recorded dataset: per episode {episode_index, suite, task, seed, ...}."""
    return [json.loads(line) for line in (root / "meta" / "demos.jsonl").read_text().splitlines() if line]


def record_demos(
    suite, tasks: list[int], episodes: int, max_steps: int, cameras: str, say
) -> tuple[list, dict]:
    """(the demos, in order, rendered; counts {failed, diverged} and seconds {play, replay})."""
    from trainer.sim.demos import play, replay, same_rows
    from trainer.sim.experts import expert_for

    seeds = dict.fromkeys(tasks, 0)
    counts, seconds = {"failed": 0, "diverged": 0}, {"play": 0.0, "replay": 0.0}
    demos = []
    for e in range(episodes):
        task = tasks[e % len(tasks)]
        for _ in range(MAX_TRIES):
            seed = seeds[task]
            seeds[task] += 1
            expert = expert_for(suite.name, task)
            start = time.perf_counter()
            demo = play(suite, task, seed, expert, max_steps, cameras=cameras == "play")
            seconds["play"] += time.perf_counter() - start
            if not demo.success:
                counts["failed"] += 1
                say(
                    f"libero_record: task {task} seed {seed}: the expert did not succeed in {max_steps} steps"
                )
                continue
            start = time.perf_counter()
            shown = replay(suite, task, seed, demo.actions, cameras=cameras == "replay")
            seconds["replay"] += time.perf_counter() - start
            if not (shown.success and same_rows(demo, shown)):
                counts["diverged"] += 1
                say(f"libero_record: task {task} seed {seed}: its replay diverged (no done on its last step)")
                continue
            kept = shown if cameras == "replay" else demo
            kept.expert = type(expert).__name__
            demos.append(kept)
            say(
                f"libero_record: demo {e}: task {task} seed {seed}, {len(kept.actions)} steps "
                f"({kept.language})"
            )
            break
        else:
            raise RecordError(
                f"libero_record: task {task} of {suite.name}: {MAX_TRIES} seeds in a row without a "
                f"replayable success (max {max_steps} steps); raise data.generated_length or leave the task "
                "out (data.generated_tasks)"
            )
    return demos, {**counts, **seconds}


def main(argv: list[str] | None = None) -> int:
    """The simulator env's side (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--episodes", type=int, default=6, help="demos in all, round robin over the tasks")
    p.add_argument("--max-steps", type=int, default=300, help="actions at most per demo")
    p.add_argument("--suite", default="libero_goal")
    p.add_argument("--tasks", default="", help="e.g. 0,3 (default: every task with an expert)")
    p.add_argument("--cameras", choices=("replay", "play"), default="replay")
    a = p.parse_args(argv)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        import lerobot  # noqa: F401
    except ImportError:
        say("libero_record: the simulator env has no lerobot (0.3.3, the writer); see sim/libero/")
        return 3
    from libero.libero import benchmark

    from trainer.sim.experts import tasks_with_experts

    suite = benchmark.get_benchmark_dict()[a.suite]()
    experts = list(tasks_with_experts(a.suite))
    tasks = [int(t) for t in a.tasks.split(",")] if a.tasks else experts
    if not tasks or any(t not in experts for t in tasks):
        say(f"libero_record: --tasks {a.tasks or '(all)'}: {a.suite} has experts for tasks {experts} only")
        return 2
    start = time.perf_counter()
    try:
        demos, took = record_demos(suite, tasks, a.episodes, a.max_steps, a.cameras, say)
    except RecordError as exc:
        say(str(exc))
        return 1
    write_start = time.perf_counter()
    write_dataset(a.out, demos, a.suite)
    images = a.out / "images"  # the writer's PNG staging: emptied once the videos are encoded
    if images.is_dir() and not any(p.is_file() for p in images.rglob("*")):
        shutil.rmtree(images)
    say(
        f"libero_record: {len(demos)} demo(s) of tasks {tasks}, {sum(len(d.actions) for d in demos)} steps; "
        f"{took['failed']} failed expert episode(s), {took['diverged']} diverged replay(s) not written; "
        f"cameras {a.cameras}: play {took['play']:.1f} s, replay {took['replay']:.1f} s, "
        f"write {time.perf_counter() - write_start:.1f} s, total {time.perf_counter() - start:.1f} s"
    )
    return 0


def _move_into_place(done: Path, root: Path) -> None:
    """done -> root: one rename when root is missing or empty; else (root holds only hidden entries, the
    caller refused anything else) entry by entry, meta/ (what makes it a dataset) last."""
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()
    if not root.exists():
        os.replace(done, root)
        return
    for entry in sorted(done.iterdir(), key=lambda p: p.name == "meta"):
        os.replace(entry, root / entry.name)


def record_dataset(
    root: Path, episodes: int, max_steps: int, suite: str, say: Callable[[str], None], tasks: str = ""
) -> Path:
    """Record into a temporary sibling of root, rename it into place; the caller holds the dataset lock."""
    from trainer.sim.env import SimEnvError, choose_gl, ensure_env, worker_env

    for line in ("!" * 100, ANNOUNCE, "!" * 100):  # a banner, as the stand-in encoders' (cache/prepare.py)
        say(line)
    which = f"tasks {tasks}" if tasks else "the tasks with experts"
    say(
        f"data: recording {episodes} demonstration(s) (at most {max_steps} steps each) of {which} of LIBERO "
        f"{suite} into {root} (first use)"
    )
    try:
        ours = lambda line: say(line.replace("evaluate: ", "data: ", 1))  # noqa: E731 (the helpers' prefix)
        python = ensure_env("libero", ours)
        env = worker_env(python, choose_gl(python, ours))
    except SimEnvError as exc:
        raise RecordError(f"cannot record a LIBERO dataset: {exc}") from None
    tmp = root.with_name(f".{root.name}.recording-{os.getpid()}")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    for stale in tmp.parent.glob(f".{root.name}.recording-*"):  # a killed recording's (the caller holds
        shutil.rmtree(stale, ignore_errors=True)  # the dataset lock: no other is running)
    argv = [str(python), "-m", "trainer.data.formats.libero_record", str(tmp / "dataset"),
            "--episodes", str(episodes), "--max-steps", str(max_steps), "--suite", suite]  # fmt: skip
    argv += ["--tasks", tasks] if tasks else []
    try:
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1")
        env["SVT_LOG"] = "1"  # the AV1 encoder (lerobot's default codec): errors only, not 20 lines a video
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        if done.returncode != 0:  # its reason is on stderr, above
            raise RecordError(f"recording a LIBERO dataset failed (exit {done.returncode}; its output above)")
        if not (tmp / "dataset" / "meta" / "info.json").is_file():
            raise RecordError(f"recording a LIBERO dataset wrote no {tmp / 'dataset' / 'meta' / 'info.json'}")
        _move_into_place(tmp / "dataset", root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"data: recorded {episodes} scripted demonstration(s) into {root} (a scripted expert's)")
    return root


if __name__ == "__main__":
    sys.exit(main())
