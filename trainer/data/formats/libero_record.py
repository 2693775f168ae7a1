"""A small LIBERO dataset recorded in LIBERO's simulator by a scripted motion, written by LeRobot's writer.

Not demonstrations: a scripted reach-and-lift, announced as such. Each episode takes a task of the suite
(episode e: task e % tasks, init state e // tasks of that task), builds LIBERO's OffScreenRenderEnv with
128 x 128 cameras, resets to the init state and lets it settle as the evaluation's worker does (5 zero
actions; trainer/evaluation/sim/worker.py), then moves from the simulator's own state: the end effector
(obs robot0_eef_pos) goes to 10 cm above the task's first object of interest (the bddl's
obj_of_interest, its body position in sim.data), descends to 2 cm above it, closes the gripper and
lifts. Actions are LIBERO's delta end-effector commands (xyz, axis-angle, gripper; each in [-1, 1],
gripper -1 open / +1 closed), proportional to the remaining distance (0.05 m per unit, robosuite's OSC
output_max). One row per control step (20 Hz): the observation before the step (both cameras flipped as
the evaluation's worker flips them, so training and evaluation see the same orientation), the action,
`observation.state` (8,) = eef xyz, eef axis-angle, the two gripper finger positions.

The layout is the `libero` preset's (upstream LingBot-VA's): LeRobot v2.1 written by lerobot 0.3.3's
LeRobotDataset.create / add_frame / save_episode, video cameras `observation.images.agentview_rgb` and
`observation.images.eye_in_hand_rgb` (128 x 128), `action` (7,) float32, the task's language as the
episode's task, fps 20, robot_type panda.

    python -m trainer.data.formats.libero_record OUT --episodes 6 [--length 48] [--suite libero_goal]
        runs INSIDE the simulator env (.sim/libero's python, LIBERO_CONFIG_PATH and MUJOCO_GL set, as
        trainer/sim/env.py worker_env does); needs lerobot 0.3.3 importable there
    record_dataset(root, episodes, length, suite, say)
        the caller's side (the tool env): builds the simulator env (sim/build.sh), picks the GL backend,
        runs the above into a temporary sibling of root and renames it into place when complete (a killed
        recording never looks like a dataset); RecordError (one line: why, and the fix) otherwise

lerobot 0.3.3 and its writer's imports are in the simulator env's locks (sim/libero/nodeps.in,
requirements.in).
lerobot's writer imports torchvision at module level without calling it; the simulator env has no
torchvision (its torch is the CPU build), so this process puts a stand-in module, raising on any use, in
sys.modules before importing lerobot (_stand_in_torchvision; the test writer tests/support/lerobot_write.py
does the same).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

CAMERAS = ("observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb")
SIZE, FPS, SETTLE = 128, 20, 5
OUTPUT_MAX = 0.05  # metres per unit of a delta-position action (robosuite OSC_POSE output_max)
ANNOUNCE = (
    "RECORDED STAND-IN DATA: a scripted reach-and-lift in LIBERO's simulator (not demonstrations); "
    "point data.path at a real LeRobot LIBERO dataset to train on demonstrations"
)


class RecordError(RuntimeError):
    """The dataset could not be recorded (one line: why, and the fix)."""


def scripted_action(eef: np.ndarray, target: np.ndarray, phase: str) -> np.ndarray:
    """The delta end-effector action of `phase` (approach, descend, grasp, lift) from eef to the object."""
    goal = {"approach": target + [0, 0, 0.10], "descend": target + [0, 0, 0.02]}.get(phase)
    move = np.zeros(3) if goal is None else np.clip((goal - eef) / OUTPUT_MAX, -1.0, 1.0)
    if phase == "lift":
        move = np.array([0.0, 0.0, 1.0])
    grip = 1.0 if phase in ("grasp", "lift") else -1.0
    return np.array([*move, 0.0, 0.0, 0.0, grip], dtype=np.float32)


def phase_of(t: int, length: int) -> str:
    """approach (the first 45%), descend (to 70%), grasp (to 80%), lift (the rest)."""
    share = t / max(1, length)
    return "approach" if share < 0.45 else "descend" if share < 0.70 else "grasp" if share < 0.80 else "lift"


def _state(obs: dict) -> np.ndarray:
    from robosuite.utils.transform_utils import quat2axisangle

    return np.concatenate([obs["robot0_eef_pos"], quat2axisangle(obs["robot0_eef_quat"]),
                           obs["robot0_gripper_qpos"]]).astype(np.float32)  # fmt: skip


def _target(inner) -> np.ndarray:
    """The position of the task's first object of interest: a body (an object), else a site (a fixture's
    region, e.g. a drawer's), else the scene's first object."""
    for name in inner.obj_of_interest:
        if name in inner.obj_body_id:
            return np.array(inner.sim.data.body_xpos[inner.obj_body_id[name]])
        try:
            return np.array(inner.sim.data.site_xpos[inner.sim.model.site_name2id(name)])
        except (ValueError, KeyError):
            continue
    return np.array(inner.sim.data.body_xpos[next(iter(inner.obj_body_id.values()))])


def record_episode(suite, task: int, init: int, length: int) -> dict:
    """One scripted episode: {frames: {camera: [HxWx3]}, action: [(7,)], state: [(8,)], language}."""
    from libero.libero.envs import OffScreenRenderEnv

    from trainer.sim.scene import extract

    env = OffScreenRenderEnv(bddl_file_name=suite.get_task_bddl_file_path(task), camera_heights=SIZE,
                             camera_widths=SIZE)  # fmt: skip
    try:
        states = suite.get_task_init_states(task)
        env.reset()
        env.set_init_state(states[init % states.shape[0]])
        for _ in range(SETTLE):
            obs, _, _, _ = env.step([0.0] * 7)
        inner = env.env
        out: dict = {"frames": {k: [] for k in CAMERAS}, "action": [], "state": [],
                     "language": suite.get_task(task).language}  # fmt: skip
        for t in range(length):
            for key, image in extract(obs).items():
                out["frames"][key].append(image)
            target = _target(inner)
            action = scripted_action(np.asarray(obs["robot0_eef_pos"]), target, phase_of(t, length))
            out["action"].append(action)
            out["state"].append(_state(obs))
            obs, _, _, _ = env.step(action.tolist())
        return out
    finally:
        env.close()


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


def write_dataset(root: Path, episodes: list[dict]) -> None:
    """episodes (record_episode's) -> a LeRobot v2.1 dataset at root, by lerobot 0.3.3's own writer."""
    _stand_in_torchvision()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    hwc = {"dtype": "video", "shape": (SIZE, SIZE, 3), "names": ["height", "width", "channels"]}
    features = {
        **{k: dict(hwc) for k in CAMERAS},
        "observation.state": {"dtype": "float32", "shape": (8,), "names": [f"q{i}" for i in range(8)]},
        "action": {"dtype": "float32", "shape": (7,), "names": [f"a{i}" for i in range(7)]},
    }
    ds = LeRobotDataset.create(repo_id="lingbot/libero_recorded", fps=FPS, features=features, root=root,
                               robot_type="panda", use_videos=True, image_writer_threads=0)  # fmt: skip
    for ep in episodes:
        for t in range(len(ep["action"])):
            row = {k: ep["frames"][k][t] for k in CAMERAS}
            ds.add_frame({**row, "observation.state": ep["state"][t], "action": ep["action"][t]},
                         task=ep["language"])  # fmt: skip
        ds.save_episode()


def main(argv: list[str] | None = None) -> int:
    """The simulator env's side (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--episodes", type=int, default=6)
    p.add_argument("--length", type=int, default=48)
    p.add_argument("--suite", default="libero_goal")
    a = p.parse_args(argv)
    try:
        import lerobot  # noqa: F401
    except ImportError:
        print(
            "libero_record: the simulator env has no lerobot (0.3.3, the writer); see sim/libero/",
            file=sys.stderr,
        )
        return 3
    from libero.libero import benchmark

    suite = benchmark.get_benchmark_dict()[a.suite]()
    n = suite.get_num_tasks()
    episodes = []
    for e in range(a.episodes):
        episodes.append(record_episode(suite, e % n, e // n, a.length))
        print(f"libero_record: episode {e}: task {e % n} ({episodes[-1]['language']})", file=sys.stderr)
    write_dataset(a.out, episodes)
    images = a.out / "images"  # the writer's PNG staging: emptied once the videos are encoded
    if images.is_dir() and not any(p.is_file() for p in images.rglob("*")):
        shutil.rmtree(images)
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


def record_dataset(root: Path, episodes: int, length: int, suite: str, say: Callable[[str], None]) -> Path:
    """Record into a temporary sibling of root, rename it into place; the caller holds the dataset lock."""
    from trainer.sim.env import SimEnvError, choose_gl, ensure_env, worker_env

    for line in ("!" * 100, ANNOUNCE, "!" * 100):  # a banner, as the stand-in encoders' (cache/prepare.py)
        say(line)
    say(f"data: recording {episodes} episode(s) of {length} steps in LIBERO {suite} into {root} (first use)")
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
            "--episodes", str(episodes), "--length", str(length), "--suite", suite]  # fmt: skip
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
    say(f"data: recorded {episodes} scripted episode(s) into {root} ({ANNOUNCE.split(': ')[0].lower()})")
    return root


if __name__ == "__main__":
    sys.exit(main())
