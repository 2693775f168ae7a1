"""Stand-in simulators: no simulator, for driving a served policy where no real one runs (RoboTwin's needs
SAPIEN and Vulkan) and for the loop's own tests. Never a success rate: `done` comes only at a set step.

StandInSim: each camera's image is a fixed random picture (seeded per camera) at the client's resolution,
shifted and brightened by the actions applied so far, so the key frames change with the served actions and
are the same on every run with the same actions. RoboTwinSim: RoboTwin's TASK_ENV shape over it (three
cameras, joint vector, end poses, 16-value end-effector actions).
"""

from __future__ import annotations

import numpy as np

from trainer.evaluation.loops import ROBOTWIN_SIZE


class StandInSim:
    """Deterministic images that follow the actions: reset() -> obs, step(action) -> (obs, done)."""

    def __init__(
        self, cameras: dict[str, tuple[int, int]], state_dim: int, done_at: int | None = None, seed: int = 0
    ):
        self.cameras, self.state_dim, self.done_at = dict(cameras), state_dim, done_at
        self.base = {
            cam: np.random.default_rng([seed, i]).integers(0, 256, (*hw, 3), dtype=np.uint8)
            for i, (cam, hw) in enumerate(self.cameras.items())
        }
        self.timestep = 0
        self.state = np.zeros(state_dim)
        self.applied: list[np.ndarray] = []

    def reset(self) -> dict[str, np.ndarray]:
        self.timestep, self.state, self.applied = 0, np.zeros(self.state_dim), []
        return self.images()

    def images(self) -> dict[str, np.ndarray]:
        total = float(np.tanh(self.state.sum()))  # bounded, whatever the actions
        shift = int(round(8 * total)) + self.timestep
        return {
            cam: np.ascontiguousarray(
                np.roll((base.astype(np.int16) + int(32 * total)) % 256, shift, axis=1).astype(np.uint8)
            )
            for cam, base in self.base.items()
        }

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], bool]:
        action = np.asarray(action, np.float64).reshape(-1)
        if action.shape[0] != self.state_dim or not np.isfinite(action).all():
            raise ValueError(f"the simulator takes {self.state_dim} finite values, got {action!r}")
        self.applied.append(action)
        self.state = self.state + action
        self.timestep += 1
        done = self.done_at is not None and self.timestep >= self.done_at
        return self.images(), done


class RoboTwinSim(StandInSim):
    """RoboTwin's TASK_ENV as the client uses it: get_obs (three cameras, joint vector, end poses),
    take_action(ee, action_type='ee') of 16 values, take_action_cnt, step_lim, eval_success."""

    def __init__(self, step_lim: int, size: tuple[int, int] = ROBOTWIN_SIZE, seed: int = 0):
        cams = {"head_camera": size, "left_camera": size, "right_camera": size}
        super().__init__(cams, 16, None, seed)
        self.step_lim, self.eval_success = step_lim, False
        self.init_pose = np.array([0.1, 0.2, 0.3, 0, 0, 0, 1, 0.5, -0.1, 0.2, 0.3, 0, 0, 0, 1, 0.5])

    @property
    def take_action_cnt(self) -> int:
        return self.timestep

    def get_obs(self) -> dict:
        images = self.images()
        pose = self.init_pose + self.state
        return {
            "observation": {cam: {"rgb": img} for cam, img in images.items()},
            "joint_action": {"vector": np.tanh(self.state[:14]).astype(np.float64)},
            "endpose": {
                "left_endpose": list(pose[:7]),
                "left_gripper": float(pose[7]),
                "right_endpose": list(pose[8:15]),
                "right_gripper": float(pose[15]),
            },
        }

    def take_action(self, ee_action: np.ndarray, action_type: str = "ee") -> None:
        assert action_type == "ee" and ee_action.shape == (16,)
        self.step(ee_action)
