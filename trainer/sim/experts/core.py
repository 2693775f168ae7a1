"""The pieces every scripted expert is made of: the simulator's state read once per step, a servo onto
LIBERO's 7-D delta end-effector action, and a script of phases.

    s = State(env, obs)                     # eef pose, gripper width, bodies / geoms / joints by name
    a = servo(s, pos, rot, grip)            # the OSC_POSE action that moves the eef towards (pos, rot)
    class Drawer(Script): phases = (...)    # each phase: (name, method(state) -> Step)

LIBERO's controller is robosuite's OSC_POSE with delta input: action[:3] in [-1, 1] is a position delta
scaled by 0.05 m, action[3:6] in [-1, 1] an axis-angle rotation delta scaled by 0.5 rad, applied in the
world frame (`goal = R(delta) @ current`), action[6] the gripper (-1 open, +1 closed). Runs inside the
simulator environment: numpy and robosuite's transform_utils only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

POS_SCALE = 0.05  # m per unit of action[:3] (the controller's output_max)
ROT_SCALE = 0.5  # rad per unit of action[3:6]
OPEN, CLOSED = -1.0, 1.0
DOWN = np.diag([1.0, -1.0, -1.0])  # the eef's rotation at rest: the gripper pointing down, fingers along y


def rot_x(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def rot_y(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def rot_z(a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def axis_angle(r: np.ndarray) -> np.ndarray:
    """The rotation vector of a rotation matrix (angle in [0, pi])."""
    cos = np.clip((np.trace(r) - 1) / 2, -1.0, 1.0)
    angle = float(np.arccos(cos))
    if angle < 1e-6:
        return np.zeros(3)
    axis = np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]])
    norm = np.linalg.norm(axis)
    if norm < 1e-6:  # angle ~ pi: the axis from the symmetric part
        axis = np.sqrt(np.clip((np.diag(r) + 1) / 2, 0, None))
        k = int(np.argmax(axis))
        axis = (r[:, k] + np.eye(3)[:, k]) / 2
        norm = np.linalg.norm(axis)
    return axis / norm * angle


def quat_mat(q: np.ndarray) -> np.ndarray:
    """robosuite's (x, y, z, w) quaternion as a rotation matrix."""
    x, y, z, w = q / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])  # fmt: skip


class State:
    """One step's view of the simulator: the eef from obs, everything else from env.env.sim by name."""

    def __init__(self, env: Any, obs: dict):
        self.inner = env.env
        self.sim = self.inner.sim
        self.model = self.sim.model
        self.pos = np.asarray(obs["robot0_eef_pos"], dtype=float)
        self.rot = quat_mat(np.asarray(obs["robot0_eef_quat"], dtype=float))
        self.width = float(np.sum(np.abs(obs["robot0_gripper_qpos"])))  # the fingers' opening, m

    def body(self, name: str) -> np.ndarray:
        return self.sim.data.body_xpos[self.model.body_name2id(name)].copy()

    def body_rot(self, name: str) -> np.ndarray:
        return self.sim.data.body_xmat[self.model.body_name2id(name)].reshape(3, 3).copy()

    def obj(self, name: str) -> np.ndarray:
        """An object's position: its main body (LIBERO's obj_body_id)."""
        return self.sim.data.body_xpos[self.inner.obj_body_id[name]].copy()

    def obj_rot(self, name: str) -> np.ndarray:
        return self.sim.data.body_xmat[self.inner.obj_body_id[name]].reshape(3, 3).copy()

    def joint(self, name: str) -> float:
        return float(self.sim.data.qpos[self.model.jnt_qposadr[self.model.joint_name2id(name)]])

    def joint_axis(self, name: str) -> np.ndarray:
        return self.sim.data.xaxis[self.model.joint_name2id(name)].copy()

    def joint_anchor(self, name: str) -> np.ndarray:
        return self.sim.data.xanchor[self.model.joint_name2id(name)].copy()

    def geoms(self, body: str) -> list[int]:
        """The body's collision geoms (contype or conaffinity set)."""
        bid, m = self.model.body_name2id(body), self.model
        return [
            g
            for g in range(m.ngeom)
            if m.geom_bodyid[g] == bid and (m.geom_contype[g] or m.geom_conaffinity[g])
        ]

    def geom(self, g: int) -> np.ndarray:
        return self.sim.data.geom_xpos[g].copy()

    def top(self, g: int) -> float:
        """The height of a (box) geom's highest point."""
        r = self.sim.data.geom_xmat[g].reshape(3, 3)
        return float(self.sim.data.geom_xpos[g][2] + np.abs(r[2]) @ self.model.geom_size[g])


def servo(s: State, pos: np.ndarray, rot: np.ndarray, grip: float, speed: float = 1.0) -> np.ndarray:
    """The action moving the eef towards (pos, rot): each delta clipped to `speed` of the controller's
    range (1.0: 5 cm and 0.5 rad a step)."""
    dp = np.clip((pos - s.pos) / POS_SCALE, -speed, speed)
    dr = np.clip(axis_angle(rot @ s.rot.T) / ROT_SCALE, -1.0, 1.0)
    return np.concatenate([dp, dr, [grip]]).astype(np.float32)


@dataclass
class Step:
    """A phase's wish for this step: where the eef goes, the gripper, and whether the phase is over."""

    pos: np.ndarray
    rot: np.ndarray
    grip: float
    done: bool = False
    speed: float = 1.0


class Script:
    """An expert as phases run in order: each phase's method returns this step's Step; a done Step moves
    to the next phase at once (the last phase holds). `t` counts the current phase's steps; `memo` keeps
    what a phase latched (e.g. the grasp point). Deterministic given the state and the steps so far."""

    phases: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.phase, self.t = 0, 0
        self.memo: dict[str, Any] = {}

    def act(self, env: Any, obs: dict) -> np.ndarray:
        s = State(env, obs)
        for _ in range(len(self.phases)):
            method: Callable[[State], Step] = getattr(self, self.phases[self.phase])
            step = method(s)
            if not step.done or self.phase == len(self.phases) - 1:
                break
            self.phase, self.t = self.phase + 1, 0
        self.t += 1
        return servo(s, step.pos, step.rot, step.grip, step.speed)

    @staticmethod
    def near(
        s: State, pos: np.ndarray, tol: float = 0.01, rot: np.ndarray | None = None, rtol: float = 0.1
    ) -> bool:
        if np.linalg.norm(pos - s.pos) > tol:
            return False
        return rot is None or bool(np.linalg.norm(axis_angle(rot @ s.rot.T)) <= rtol)
