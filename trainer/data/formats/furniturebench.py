"""FurnitureBench demonstrations as their own tools write them: read, validate, write one episode file.

Two formats are read (checked against clvrai/furniture-bench, never copied):

1. The collector's `.pkl` (`furniture_bench/data/data_collector.py` `DataCollector.save`), one pickled dict:
    furniture          str, e.g. "one_leg"
    observations       list of dicts, normally len(actions) + 1 (the final observation is appended)
        color_image1   (224, 224, 3) uint8   wrist camera (resized)
        color_image2   (224, 224, 3) uint8   front camera (resized and centre-cropped)
        color_image3   (224, 224, 3) uint8   rear camera: NOT in the collector's pkl (only its mp4), present
                                             in some converted collections; read when data.cameras asks
        robot_state    dict (robot/panda.py PandaState): ee_pos (3,) ee_quat (4,) ee_pos_vel (3,)
                       ee_ori_vel (3,) joint_positions (7,) joint_velocities (7,) joint_torques (7,)
                       gripper_width (1,) (a 0-d array in simulation); float64 or float32
        parts_poses    (7 * parts,) float   kept available (Episode.parts_poses), not trained on
    actions            list of (8,) arrays: dx dy dz, quaternion x y z w, gripper
    rewards, skills    one per action (skills: 1 where a skill completes)
    success            bool;  error bool;  error_description  str (or the PandaError value)
    cam2_to_base, cam3_to_base (4, 4), cam1_intr, cam2_intr, cam3_intr (3, 3)   real robot only: kept in
                       Episode.extras
   An observation failure (`info["obs_success"]` False) saves the episode with error True, the last action
   and reward popped but the last skill kept: skills is then one longer than actions. Such an episode is
   read with that extra skill dropped (Episode.notes says so).

2. The output of the authors' `furniture_bench/scripts/preprocess_data.py`: images channel-first
   (3, 224, 224), robot_state one 14-d vector (`filter_and_concat_robot_state`: ee_pos ee_quat ee_pos_vel
   ee_ori_vel gripper_width) or absent (--no-robot-state), the final observation dropped unless
   --save-last-step, no success/error keys, leading no-op actions removed, the actions' quaternion sign
   flipped positive (and positions divided by --norm-pos-* under --norm-pos-acts). It is read: images back
   to channel-last, the 14-d vector in Episode.robot_state["concat14"], Episode.format == "preprocessed".

Recorded at 10 Hz. Every problem is a DatasetError naming the file and the key.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from provision.atomic import write_atomic

CAMERAS = ("color_image1", "color_image2", "color_image3")  # wrist, front, rear
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
PREPROCESSED_STATE_DIM = 14  # robot_state.py ROBOT_STATES: ee_pos ee_quat ee_pos_vel ee_ori_vel gripper_width
REAL_ROBOT_EXTRAS = {
    "cam2_to_base": (4, 4),
    "cam3_to_base": (4, 4),
    "cam1_intr": (3, 3),
    "cam2_intr": (3, 3),
    "cam3_intr": (3, 3),
}
CONTROL_HZ = 10
COLLECTOR = "collector"
PREPROCESSED = "preprocessed"
PREPROCESSED_NAME = "furniture_bench/scripts/preprocess_data.py output"


class DatasetError(ValueError):
    """An episode file that cannot be used; the message names the file and the key."""


@dataclass
class Episode:
    path: Path
    furniture: str
    images: dict[str, np.ndarray]  # camera -> (T_obs, 224, 224, 3) uint8
    robot_state: dict[str, np.ndarray]  # key -> (T_obs, dim) float32 ("concat14" for preprocessed files)
    actions: np.ndarray  # (T, 8) float32
    rewards: np.ndarray  # (T,) float32
    skills: np.ndarray  # (T,) float32
    success: bool | None = None  # None: the file does not say (preprocess_data.py output)
    error: bool | None = None
    error_description: str = ""
    parts_poses: np.ndarray | None = None  # (T_obs, 7 * parts) float32 when every observation has it
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # real-robot calibration
    format: str = COLLECTOR
    notes: list[str] = field(default_factory=list)  # what the reader adjusted (said once per episode)

    @property
    def num_actions(self) -> int:
        return int(self.actions.shape[0])

    @property
    def num_observations(self) -> int:
        return int(next(iter(self.images.values())).shape[0]) if self.images else self.num_actions + 1


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
        arr = arr.reshape(shape)  # e.g. gripper_width stored as a scalar (simulation squeezes it)
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


def detect_format(data: dict) -> str:
    """COLLECTOR or PREPROCESSED, from the first observation (channel-first images / a vector state)."""
    observations = data.get("observations")
    if (
        not isinstance(observations, list | tuple)
        or not observations
        or not isinstance(observations[0], dict)
    ):
        return COLLECTOR  # validation reports the real problem
    first = observations[0]
    state = first.get("robot_state", None)
    image = first.get("color_image1", first.get("color_image2"))
    channel_first = (
        isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[0] == 3 != image.shape[-1]
    )
    vector_state = isinstance(state, np.ndarray) or ("robot_state" not in first and "success" not in data)
    return PREPROCESSED if channel_first or vector_state else COLLECTOR


def episode_status(data: Any) -> tuple[bool | None, bool | None, str]:
    """(success, error, error_description) as the collector wrote them; None where absent."""
    if not isinstance(data, dict):
        return None, None, ""
    success = data.get("success")
    error = data.get("error")
    desc = data.get("error_description", "")
    return (
        None if success is None else bool(success),
        None if error is None else bool(error),
        "" if desc is None else str(desc),
    )


def _image(path: Path, where: str, value, fmt: str) -> np.ndarray:
    if fmt == PREPROCESSED:
        img = _array(path, where, value, (3, *IMAGE_SHAPE[:2]))
        img = np.moveaxis(img, 0, -1)
    else:
        arr = np.asarray(value) if not isinstance(value, np.ndarray) else value
        if arr.ndim == 3 and arr.shape == (3, *IMAGE_SHAPE[:2]):
            _fail(path, where, "channel-first image in a collector-format file (mixed formats)")
        img = _array(path, where, value, IMAGE_SHAPE)
    if img.dtype != np.uint8:
        _fail(path, where, f"expected uint8, got {img.dtype}")
    return img


def validate_episode(data, path: Path, cameras=CAMERAS[:2]) -> Episode:
    """Check one unpickled episode and convert it to arrays; DatasetError names file and key (and says
    when the file is preprocess_data.py output)."""
    try:
        return _validate(data, Path(path), cameras)
    except DatasetError as exc:
        if (
            isinstance(data, dict)
            and detect_format(data) == PREPROCESSED
            and PREPROCESSED_NAME not in str(exc)
        ):
            raise DatasetError(f"{exc} (the file is {PREPROCESSED_NAME})") from exc
        raise


def _sequences(path: Path, data: dict, fmt: str, label: str) -> tuple[list, list, list, list, list[str]]:
    """The four per-step sequences with their lengths checked (collector quirks repaired, said in notes)."""
    observations = _sequence(path, data, "observations")
    actions = _sequence(path, data, "actions")
    rewards = _sequence(path, data, "rewards")
    skills = _sequence(path, data, "skills")
    notes: list[str] = []
    if fmt == PREPROCESSED:
        notes.append(
            f"read as {PREPROCESSED_NAME}: channel-first images, 14-d robot_state, no success/error "
            "flags; its actions are as preprocess_data.py left them (leading no-ops removed, quaternion "
            "sign made positive, positions divided by --norm-pos-* if it ran with --norm-pos-acts)"
        )
    if not actions:
        _fail(path, "actions", f"empty episode (no actions){label}")
    steps = len(actions)
    if len(observations) not in (steps, steps + 1):
        _fail(
            path,
            "observations",
            f"expected {steps + 1} (len(actions) + 1) entries, got {len(observations)}{label}",
        )
    if len(rewards) != steps:
        _fail(path, "rewards", f"expected {steps} entries (one per action), got {len(rewards)}{label}")
    if len(skills) == steps + 1 and fmt == COLLECTOR:
        # data_collector.py on an observation failure pops the last action and reward, not the skill
        skills = skills[:steps]
        notes.append(
            "observation-failure episode: the collector kept one skill more than actions; dropped it"
        )
    elif fmt == PREPROCESSED and len(skills) > steps:
        skills = skills[:steps]  # --done-when-assembled / skill ranges cut actions but not skills
        notes.append("preprocess_data.py cut actions but not skills; skills truncated to the actions")
    if len(skills) != steps:
        _fail(path, "skills", f"expected {steps} entries (one per action), got {len(skills)}{label}")
    return observations, actions, rewards, skills, notes


def _observations(path: Path, observations: list, cameras, fmt: str, label: str):
    """Images per camera, robot state and (where every step has them) parts poses, checked per step."""
    images = {cam: np.empty((len(observations), *IMAGE_SHAPE), np.uint8) for cam in cameras}
    state: dict[str, np.ndarray] = {}
    if fmt == COLLECTOR:
        state = {k: np.empty((len(observations), n), np.float32) for k, n in ROBOT_STATE.items()}
    poses: list[np.ndarray] | None = []
    for i, obs in enumerate(observations):
        where = f"observations[{i}]"
        if not isinstance(obs, dict):
            _fail(path, where, f"expected a dict, got {type(obs).__name__}")
        for cam in cameras:
            if cam not in obs:
                hint = ""
                if cam == "color_image3":
                    hint = (
                        " (the collector's .pkl holds color_image1/2 only; color_image3 is in its mp4): "
                        "choose data.cameras from the views the files have"
                    )
                _fail(path, f"{where}.{cam}", f"missing{label}{hint}")
            images[cam][i] = _image(path, f"{where}.{cam}", obs[cam], fmt)
        if fmt == PREPROCESSED:
            if "robot_state" in obs:
                vec = _array(
                    path, f"{where}.robot_state", obs["robot_state"], (PREPROCESSED_STATE_DIM,), np.float32
                )
                state.setdefault(
                    "concat14", np.empty((len(observations), PREPROCESSED_STATE_DIM), np.float32)
                )
                if "concat14" in state:
                    state["concat14"][i] = vec
        else:
            if "robot_state" not in obs:
                _fail(path, f"{where}.robot_state", "missing")
            rs = obs["robot_state"]
            if not isinstance(rs, dict):
                _fail(path, f"{where}.robot_state", f"expected a dict, got {type(rs).__name__}")
            for key, n in ROBOT_STATE.items():
                if key not in rs:
                    _fail(path, f"{where}.robot_state.{key}", "missing")
                state[key][i] = _array(path, f"{where}.robot_state.{key}", rs[key], (n,), np.float32)
        if poses is not None:
            pp = obs.get("parts_poses")
            if pp is None:
                poses = None
            else:
                arr = np.asarray(pp, dtype=np.float32).reshape(-1)
                if poses and arr.shape != poses[0].shape:
                    _fail(path, f"{where}.parts_poses", f"expected shape {poses[0].shape}, got {arr.shape}")
                poses.append(arr)
    return images, state, poses


def _validate(data, path: Path, cameras) -> Episode:
    if not isinstance(data, dict):
        _fail(path, "<top level>", f"expected a dict, got {type(data).__name__}")
    if "furniture" not in data:
        _fail(path, "furniture", "missing")
    if not isinstance(data["furniture"], str):
        _fail(path, "furniture", f"expected a str, got {type(data['furniture']).__name__}")
    fmt = detect_format(data)
    label = f" ({PREPROCESSED_NAME})" if fmt == PREPROCESSED else ""
    observations, actions, rewards, skills, notes = _sequences(path, data, fmt, label)
    images, state, poses = _observations(path, observations, cameras, fmt, label)

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
    extras = {
        key: _array(path, key, data[key], shape, np.float32)
        for key, shape in REAL_ROBOT_EXTRAS.items()
        if key in data and data[key] is not None
    }
    success, error, description = episode_status(data)
    return Episode(
        path=path,
        furniture=data["furniture"],
        images=images,
        robot_state=state,
        actions=act,
        rewards=rew,
        skills=skl,
        success=success,
        error=error,
        error_description=description,
        parts_poses=np.stack(poses) if poses else None,
        extras=extras,
        format=fmt,
        notes=notes,
    )


def load_pickle(path: Path) -> Any:
    """The unpickled content of an episode file; DatasetError (naming the file) when unreadable."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError, IndexError) as exc:
        raise DatasetError(
            f"{path}: <file>: not a readable episode pickle ({type(exc).__name__}: {exc})"
        ) from exc


def read_episode(path: Path, cameras=CAMERAS[:2]) -> Episode:
    path = Path(path)
    return validate_episode(load_pickle(path), path, cameras)


def write_episode(path: Path, data: dict) -> None:
    """Pickle one episode dict; written to a temporary name and renamed, so a kill leaves no half file."""
    write_atomic(path, pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
