"""Deterministic FurnitureBench-format episodes: a scripted arm carries a table leg to the tabletop.

Not noise: each episode is a scripted pick-and-place (approach, descend, grasp, lift, carry, place,
release, lift) rendered from two cameras, so the next frame follows from the frame and the action, and
the action follows from the scene. Episodes vary by seed (part pose, target, start pose). The files
are exactly FurnitureBench's `.pkl` layout (see trainer/data/formats/furniturebench.py).

    python -m trainer.data.formats.generate OUT --episodes N [--length T] [--task one_leg] [--seed 0]

writes the collector's layout, OUT/<task>/<YYYY-mm-dd-HH:MM:SS>/<same>.pkl (collect_data.py saves to
<out-data-path>/<furniture>/ and DataCollector.save names folder and file by the save time; here the
times are fixed, one minute apart from 2026-01-01-00:00:00, so the order is deterministic), with the
collector's keys and dtypes (robot_state float64 where the Panda returns lists, real-robot camera
calibration). Some episodes are failures as the collector saves them: every 8th (index % 8 == 5) a
failed demonstration (success False), every 8th (index % 8 == 3) an observation failure (error True,
error_description set, the last action and reward popped but the last skill kept). The dataset is
written into a temporary sibling directory and renamed into
place when complete, so a killed generation never looks like a dataset.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from trainer.checkpoint.diskspace import OutOfSpace, guard
from trainer.data.formats.discovery import TIMESTAMP_FORMAT, discover
from trainer.data.formats.furniturebench import IMAGE_SHAPE, write_episode

GENERATOR_VERSION = 2
FIRST_SAVE = dt.datetime(2026, 1, 1, 0, 0, 0)
FAILED, OBS_FAILURE = 5, 3  # index % 8: the collector's two kinds of saved failure
PANDA_GRIPPER_ERROR = "Panda gripper server stopped."  # robot_state.py PandaError.Gripper
MAX_STEP = 0.045  # end-effector travel per 10 Hz step, in table units (table = unit square)
MAX_YAW_STEP = 0.12  # radians per step
HOVER_Z, GRASP_Z = 0.25, 0.04
OPEN_WIDTH, CLOSED_WIDTH = 0.08, 0.02

_H, _W = IMAGE_SHAPE[:2]
_YY, _XX = np.mgrid[0:_H, 0:_W].astype(np.float32)


def _yaw_quat(yaw: float) -> np.ndarray:
    """xyzw quaternion of a rotation about z (FurnitureBench stores quaternions xyzw)."""
    return np.array([0.0, 0.0, np.sin(yaw / 2), np.cos(yaw / 2)], np.float32)


def _background(rng_seed: int) -> np.ndarray:
    """A fixed table texture: smooth gradient plus a faint grid, the same for every episode of a seed."""
    base = np.empty(IMAGE_SHAPE, np.float32)
    base[..., 0] = 70 + 25 * _XX / _W
    base[..., 1] = 60 + 20 * _YY / _H
    base[..., 2] = 50 + 10 * (_XX + _YY) / (_H + _W)
    base[(_XX.astype(int) % 56 == 0) | (_YY.astype(int) % 56 == 0)] += 12
    return base


class _Renderer:
    """Draws the scene from the front camera (top-down) and the wrist camera (follows the gripper)."""

    def __init__(self):
        self.background = _background(0)

    @staticmethod
    def _disc(img, cx, cy, r, color):
        img[(_XX - cx) ** 2 + (_YY - cy) ** 2 <= r * r] = color

    @staticmethod
    def _box(img, cx, cy, half_w, half_h, yaw, color, outline=0.0):
        c, s = np.cos(yaw), np.sin(yaw)
        u = (_XX - cx) * c + (_YY - cy) * s
        v = -(_XX - cx) * s + (_YY - cy) * c
        inside = (np.abs(u) <= half_w) & (np.abs(v) <= half_h)
        if outline:
            inside &= (np.abs(u) >= half_w - outline) | (np.abs(v) >= half_h - outline)
        img[inside] = color

    def draw(self, scene: dict, center, scale: float) -> np.ndarray:
        """Scene in table units -> pixels: p = 112 + (x - center) * scale."""
        img = self.background.copy()

        def px(x, y):
            return _W / 2 + (x - center[0]) * scale, _H / 2 + (y - center[1]) * scale

        tx, ty = px(*scene["target"])
        self._box(img, tx, ty, 0.07 * scale, 0.07 * scale, 0.0, (225, 225, 210), outline=0.012 * scale)
        part_x, part_y = px(*scene["part_pos"][:2])
        lift = 1.0 + 1.5 * scene["part_pos"][2]  # a lifted part looks bigger from above
        self._box(
            img,
            part_x + 4,
            part_y + 4,
            0.025 * scale * lift,
            0.08 * scale * lift,
            scene["part_yaw"],
            (35, 30, 25),
        )
        self._box(
            img, part_x, part_y, 0.025 * scale * lift, 0.08 * scale * lift, scene["part_yaw"], (230, 140, 40)
        )
        ex, ey = px(*scene["ee_pos"][:2])
        radius = (0.035 + 0.12 * scene["ee_pos"][2]) * scale
        self._disc(img, ex + 0.4 * radius, ey + 0.4 * radius, radius, (30, 30, 35))  # shadow
        self._disc(img, ex, ey, radius, (60, 110, 220))
        # jaws: two dots whose spacing is the gripper width, rotated with the gripper
        spread = (0.25 + 6.0 * scene["gripper_width"]) * radius
        c, s = np.cos(scene["ee_yaw"]), np.sin(scene["ee_yaw"])
        for sign in (-1, 1):
            self._disc(img, ex + sign * spread * c, ey + sign * spread * s, 0.3 * radius, (240, 240, 240))
        return np.clip(img, 0, 255).astype(np.uint8)

    def front(self, scene):
        return self.draw(scene, center=(0.5, 0.5), scale=190.0)

    def wrist(self, scene):
        # the wrist camera looks down from the gripper: closer to the table means more zoom
        return self.draw(scene, center=scene["ee_pos"][:2], scale=260.0 / (0.6 + scene["ee_pos"][2]))


def _waypoints(part, part_yaw, target):
    """(position, yaw, grip) goals of the script; grip 1 = close, -1 = open (FurnitureBench's sign)."""
    px, py = part
    tx, ty = target
    return [
        ((px, py, HOVER_Z), part_yaw, -1.0),
        ((px, py, GRASP_Z), part_yaw, -1.0),
        ((px, py, GRASP_Z), part_yaw, 1.0),
        ((px, py, HOVER_Z), part_yaw, 1.0),
        ((tx, ty, HOVER_Z), 0.0, 1.0),
        ((tx, ty, GRASP_Z), 0.0, 1.0),
        ((tx, ty, GRASP_Z), 0.0, -1.0),
        ((tx, ty, HOVER_Z), 0.0, -1.0),
    ]


def _joint_positions(ee_pos, yaw) -> np.ndarray:
    """A smooth stand-in for the Panda's joints (no IK here): deterministic in the end-effector pose."""
    x, y, z = ee_pos
    return np.array(
        [np.arctan2(y - 0.5, x + 0.2), 0.3 + z, -0.2 + x, -2.0 + z, 0.1 * y, 1.6 + z, 0.78 + yaw],
        np.float32,
    )


# long: one scripted pick-and-place whose state (gripper, part, goal) the step loop updates in place;
# split up, the same eight variables would travel through every piece.
def generate_episode(seed: int, index: int, length: int, furniture: str) -> dict:
    """One episode of `length` actions (length + 1 observations), deterministic in (seed, index)."""
    rng = np.random.default_rng([seed, index])
    part = rng.uniform(0.15, 0.45, 2)
    part_yaw = float(rng.uniform(-1.2, 1.2))
    target = rng.uniform(0.55, 0.85, 2)
    ee = np.array([*rng.uniform(0.3, 0.7, 2), HOVER_Z], np.float64)
    ee_yaw = 0.0
    width = OPEN_WIDTH
    part_pos = np.array([*part, 0.0])
    cur_yaw_part = part_yaw
    goals = _waypoints(part, part_yaw, target)
    goal_i, settle = 0, 0
    # a goal that only changes the grip is held for a few steps so the jaws can move
    hold_steps = [3 if i and goals[i][2] != goals[i - 1][2] else 1 for i in range(len(goals))]
    renderer = _Renderer()

    def scene():
        return dict(
            ee_pos=ee.copy(),
            ee_yaw=ee_yaw,
            gripper_width=width,
            part_pos=part_pos.copy(),
            part_yaw=cur_yaw_part,
            target=target,
        )

    def observation(vel, ang_vel):
        sc = scene()
        return {
            "color_image1": renderer.wrist(sc),
            "color_image2": renderer.front(sc),
            "robot_state": {
                "ee_pos": ee.astype(np.float32),
                "ee_quat": _yaw_quat(ee_yaw),
                "ee_pos_vel": np.asarray(vel, np.float32),
                "ee_ori_vel": np.array([0.0, 0.0, ang_vel], np.float32),
                "joint_positions": _joint_positions(ee, ee_yaw),
                "joint_velocities": np.zeros(7, np.float32) + np.float32(np.linalg.norm(vel)),
                "joint_torques": np.zeros(7, np.float32) + np.float32(width - OPEN_WIDTH),
                "gripper_width": np.array([width], np.float32),
            },
            "parts_poses": np.array([*part_pos, *_yaw_quat(cur_yaw_part)], np.float32),
        }

    observations = [observation(np.zeros(3), 0.0)]
    actions, rewards, skills = [], [], []
    placed = held = False
    for _ in range(length):
        goal_pos, goal_yaw, grip = goals[min(goal_i, len(goals) - 1)]
        delta = np.clip(np.asarray(goal_pos) - ee, -MAX_STEP, MAX_STEP)
        dyaw = float(np.clip(goal_yaw - ee_yaw, -MAX_YAW_STEP, MAX_YAW_STEP))
        if goal_i >= len(goals):
            delta, dyaw = np.zeros(3), 0.0  # script done: hold still
        actions.append(np.array([*delta, *_yaw_quat(dyaw), grip], np.float32))
        # apply the action: the gripper follows the command, a grasped part follows the gripper
        ee = ee + delta
        ee_yaw += dyaw
        target_width = CLOSED_WIDTH if grip > 0 else OPEN_WIDTH
        width += float(np.clip(target_width - width, -0.03, 0.03))
        if grip < 0:
            held = False  # released parts drop onto the table
            part_pos[2] = 0.0
        elif width <= CLOSED_WIDTH + 1e-6 and np.linalg.norm(part_pos[:2] - ee[:2]) < 0.03:
            held = True
        if held:
            part_pos = np.array([ee[0], ee[1], max(0.0, ee[2] - GRASP_Z)])
            cur_yaw_part = part_yaw + ee_yaw - goals[2][1]
        reward = 0.0
        if not placed and grip < 0 and np.linalg.norm(part_pos[:2] - target) < 0.02 and part_pos[2] < 1e-6:
            placed, reward = True, 1.0
        reached = np.abs(np.asarray(goal_pos) - ee).max() < 1e-6 and abs(goal_yaw - ee_yaw) < 1e-6
        settle = settle + 1 if reached else 0
        skill = 0.0
        if goal_i < len(goals) and settle >= hold_steps[goal_i]:
            goal_i, settle, skill = goal_i + 1, 0, 1.0
        rewards.append(reward)
        skills.append(skill)
        observations.append(observation(delta * 10.0, dyaw * 10.0))  # 10 Hz: per-step delta -> velocity
    return {
        "furniture": furniture,
        "observations": observations,
        "actions": actions,
        "rewards": rewards,
        "skills": skills,
        "success": placed,
        "error": False,
        "error_description": "",
    }


def collector_name(index: int) -> str:
    return (FIRST_SAVE + dt.timedelta(minutes=index)).strftime(TIMESTAMP_FORMAT)


def collector_variant(data: dict, index: int) -> dict:
    """The episode as the collector saves it: real-robot keys and dtypes, and the failure kinds."""
    for obs in data["observations"]:
        rs = obs["robot_state"]
        for key in ("ee_pos", "ee_quat", "joint_positions", "joint_velocities", "joint_torques"):
            rs[key] = rs[key].astype(np.float64)  # panda.py: np.array(list) / T.mat2pose give float64
    data["cam2_to_base"] = np.eye(4, dtype=np.float64)
    data["cam3_to_base"] = np.eye(4, dtype=np.float64)
    for cam in (1, 2, 3):
        data[f"cam{cam}_intr"] = np.array([[600.0, 0, 320], [0, 600.0, 240], [0, 0, 1]])
    # a generated episode of `length` steps is a whole demonstration by construction (the script's own
    # placement flag, generate_episode's "success", depends on the length); failures are the chosen kinds
    data["success"] = True
    if index % 8 == FAILED:
        data["success"] = False
    elif index % 8 == OBS_FAILURE:
        data["actions"].pop()  # data_collector.py: rews.pop(); acts.pop(); the skill stays
        data["rewards"].pop()
        data["observations"].pop()
        data.update(success=False, error=True, error_description=PANDA_GRIPPER_ERROR)
    return data


def generate_dataset(
    out: Path, episodes: int, length: int, furniture: str = "one_leg", seed: int = 0
) -> Path:
    """Write `episodes` episodes to out/<furniture>/<i>.pkl; atomic at the directory level.

    `out` must not exist or be an empty directory. Leftover temporary directories of an earlier,
    killed generation are removed first (callers serialise generations with a lock).
    """
    out = Path(out)
    if episodes <= 0 or length <= 0:
        raise ValueError(f"generate: --episodes and --length must be > 0 (got {episodes}, {length})")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(
            f"generate: {out} exists and is not empty; choose another directory or remove it"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        with guard(tmp, "dataset generation"):
            _write_episodes(tmp, episodes, length, furniture, seed)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written dataset never keeps the space
        raise
    if out.is_dir():
        out.rmdir()  # empty (checked above); rename cannot replace a directory that has entries
    os.rename(tmp, out)
    return out


def _write_episodes(tmp: Path, episodes: int, length: int, furniture: str, seed: int) -> None:
    (tmp / furniture).mkdir(parents=True)
    for i in range(episodes):
        name = collector_name(i)
        data = collector_variant(generate_episode(seed, i, length, furniture), i)
        (tmp / furniture / name).mkdir()
        write_episode(tmp / furniture / name / f"{name}.pkl", data)
    meta = dict(
        generator="trainer.data.formats.generate",
        version=GENERATOR_VERSION,
        episodes=episodes,
        length=length,
        furniture=furniture,
        seed=seed,
        hz=10,
    )
    (tmp / "GENERATED.json").write_text(json.dumps(meta, indent=1) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.data.formats.generate", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out", type=Path, help="dataset root; episodes go to OUT/<task>/<i>.pkl")
    parser.add_argument("--episodes", type=int, required=True)
    parser.add_argument("--length", type=int, default=120, help="actions per episode (10 Hz)")
    parser.add_argument("--task", default="one_leg", help="furniture name stored in each episode")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        generate_dataset(args.out, args.episodes, args.length, args.task, args.seed)
    except (FileExistsError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    except OutOfSpace as exc:
        print(f"generate: {exc.line()}", file=sys.stderr)
        return 1
    print(f"wrote {len(discover(args.out, args.task).files)} episodes to {args.out / args.task}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
