"""FurnitureBench demonstrations in their published `.pkl` format: read, validate, write.

Format (furniture-bench docs, `furniture_bench/data/data_collector.py`): one pickled dict per episode
    furniture     str, e.g. "one_leg"
    observations  list of dicts, len(actions) + 1 (the final observation is appended at the end)
        color_image1  (224, 224, 3) uint8   wrist camera
        color_image2  (224, 224, 3) uint8   front camera
        robot_state   dict: ee_pos (3,) ee_quat (4,) ee_pos_vel (3,) ee_ori_vel (3,) joint_positions (7,)
                      joint_velocities (7,) joint_torques (7,) gripper_width (1,)
        (parts_poses and others may be present; not used here)
    actions       list of (8,) arrays: dx dy dz, quaternion x y z w, gripper
    rewards       list of scalars; skills: list of scalars (1 when a skill completes)
    success, error, error_description  (written by the collector; optional here)
Recorded at 10 Hz. The directory layout is <root>/<furniture>/<n>.pkl.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from provision.atomic import write_atomic

CAMERAS = ("color_image1", "color_image2")  # wrist, front
IMAGE_SHAPE = (224, 224, 3)
ACTION_DIM = 8
ROBOT_STATE = {
    "ee_pos": 3,
    "ee_quat": 4,
    "ee_pos_vel": 3,
    "ee_ori_vel": 3,
    "joint_positions": 7,
    "joint_velocities": 7,
    "joint_torques": 7,
    "gripper_width": 1,
}
CONTROL_HZ = 10


class DatasetError(ValueError):
    """An episode file that cannot be used; the message names the file and the key."""


@dataclass
class Episode:
    path: Path
    furniture: str
    images: dict[str, np.ndarray]  # camera -> (T_obs, 224, 224, 3) uint8
    robot_state: dict[str, np.ndarray]  # key -> (T_obs, dim) float32
    actions: np.ndarray  # (T, 8) float32
    rewards: np.ndarray  # (T,) float32
    skills: np.ndarray  # (T,) float32

    @property
    def num_actions(self) -> int:
        return int(self.actions.shape[0])

    @property
    def num_observations(self) -> int:
        return int(next(iter(self.images.values())).shape[0])


def _fail(path: Path, key: str, problem: str):
    raise DatasetError(f"{path}: {key}: {problem}")


def _array(path, key, value, shape, dtype=None) -> np.ndarray:
    try:
        arr = np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as exc:
        _fail(path, key, f"not an array ({exc})")
    if arr.dtype == object:
        _fail(path, key, f"expected a numeric array of shape {shape}, got an object array")
    if arr.size == int(np.prod(shape)) and arr.shape != shape and arr.ndim <= 1:
        arr = arr.reshape(shape)  # e.g. gripper_width stored as a scalar
    if arr.shape != shape:
        _fail(path, key, f"expected shape {shape}, got {arr.shape}")
    return arr


def _sequence(path, data, key) -> list:
    if key not in data:
        _fail(path, key, "missing")
    value = data[key]
    if isinstance(value, np.ndarray):
        return list(value)
    if not isinstance(value, list | tuple):
        _fail(path, key, f"expected a list, got {type(value).__name__}")
    return list(value)


def validate_episode(data, path: Path, cameras=CAMERAS) -> Episode:
    """Check one unpickled episode and convert it to arrays; DatasetError names file and key."""
    path = Path(path)
    if not isinstance(data, dict):
        _fail(path, "<top level>", f"expected a dict, got {type(data).__name__}")
    if "furniture" not in data:
        _fail(path, "furniture", "missing")
    if not isinstance(data["furniture"], str):
        _fail(path, "furniture", f"expected a str, got {type(data['furniture']).__name__}")
    observations = _sequence(path, data, "observations")
    actions = _sequence(path, data, "actions")
    rewards = _sequence(path, data, "rewards")
    skills = _sequence(path, data, "skills")
    if not actions:
        _fail(path, "actions", "empty episode (no actions)")
    steps = len(actions)
    if len(observations) not in (steps, steps + 1):
        _fail(
            path, "observations", f"expected {steps + 1} (len(actions) + 1) entries, got {len(observations)}"
        )
    for key, seq in (("rewards", rewards), ("skills", skills)):
        if len(seq) != steps:
            _fail(path, key, f"expected {steps} entries (one per action), got {len(seq)}")

    images = {cam: np.empty((len(observations), *IMAGE_SHAPE), np.uint8) for cam in cameras}
    state = {k: np.empty((len(observations), n), np.float32) for k, n in ROBOT_STATE.items()}
    for i, obs in enumerate(observations):
        where = f"observations[{i}]"
        if not isinstance(obs, dict):
            _fail(path, where, f"expected a dict, got {type(obs).__name__}")
        for cam in cameras:
            if cam not in obs:
                _fail(path, f"{where}.{cam}", "missing")
            img = _array(path, f"{where}.{cam}", obs[cam], IMAGE_SHAPE)
            if img.dtype != np.uint8:
                _fail(path, f"{where}.{cam}", f"expected uint8, got {img.dtype}")
            images[cam][i] = img
        if "robot_state" not in obs:
            _fail(path, f"{where}.robot_state", "missing")
        rs = obs["robot_state"]
        if not isinstance(rs, dict):
            _fail(path, f"{where}.robot_state", f"expected a dict, got {type(rs).__name__}")
        for key, n in ROBOT_STATE.items():
            if key not in rs:
                _fail(path, f"{where}.robot_state.{key}", "missing")
            state[key][i] = _array(path, f"{where}.robot_state.{key}", rs[key], (n,), np.float32)

    act = np.stack(
        [_array(path, f"actions[{i}]", a, (ACTION_DIM,), np.float32) for i, a in enumerate(actions)]
    )
    if not np.isfinite(act).all():
        bad = int(np.argwhere(~np.isfinite(act))[0][0])
        _fail(path, f"actions[{bad}]", "not finite")
    rew = np.array(
        [_array(path, f"rewards[{i}]", r, (), np.float32) for i, r in enumerate(rewards)], np.float32
    )
    skl = np.array(
        [_array(path, f"skills[{i}]", s, (), np.float32) for i, s in enumerate(skills)], np.float32
    )
    return Episode(path, data["furniture"], images, state, act, rew, skl)


def read_episode(path: Path, cameras=CAMERAS) -> Episode:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = pickle.load(f)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError) as exc:
        raise DatasetError(
            f"{path}: <file>: not a readable episode pickle ({type(exc).__name__}: {exc})"
        ) from exc
    return validate_episode(data, path, cameras)


def write_episode(path: Path, data: dict) -> None:
    """Pickle one episode dict; written to a temporary name and renamed, so a kill leaves no half file."""
    write_atomic(path, pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))


def episode_files(root: Path, furniture: str) -> list[Path]:
    """<root>/<furniture>/*.pkl in numeric order (FurnitureBench names them 0.pkl, 1.pkl, ...)."""
    folder = Path(root) / furniture

    def order(p: Path):
        return (0, int(p.stem), "") if p.stem.isdigit() else (1, 0, p.stem)

    return sorted(folder.glob("*.pkl"), key=order) if folder.is_dir() else []
