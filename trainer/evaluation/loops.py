"""Upstream's two evaluation clients' loops, product code: what the simulator evaluation, the tests and
bench/ drive a served policy with.

Written here line by line from upstream 58c2ae5 (read, not copied or imported; upstream needs LIBERO and
RoboTwin's simulators):
    libero_episode    evaluation/libero/client.py `run_one`
    robotwin_episode  evaluation/robotwin/eval_polict_client_openpi.py `eval_policy` (its loop, `format_obs`,
                      `add_init_pose`, and geometry.py `euler2quat` for the 14-channel branch)
Both talk through any client with `infer(dict) -> dict` that raises on a text reply (trainer/serving/
client.py PolicyClient, as upstream's WebsocketClientPolicy): reset with the prompt; per chunk
`infer(obs=first_obs)` (the first observation re-sent with every request), the (C, F, N) action,
`assert N % 4 == 0`, every action of latent frames 1..F-1 (0..F-1 after the first chunk) stepped, an
observation kept whenever (j + 1) % (N // 4) == 0 (four key frames per latent frame), then
`infer(obs=key_frame_list, compute_kv_cache=True, imagine=False, state=action)`.

The environment is anything with the simulator's side of the loop (`LiberoEnv`, `RoboTwinEnv` below):
the real LIBERO simulator (trainer/evaluation/sim/), or the stand-ins of trainer/evaluation/standin.py.
Camera sizes: LIBERO's client asks for 128 x 128 (`camera_heights`/`camera_widths` in run_one); RoboTwin's
cameras are taken as 240 x 320 (H x W) for the head and both wrists: RoboTwin 2.0's D435 camera config
(320 x 240) is an assumption here, not read from upstream; upstream's example frames at 58c2ae5
(example/robotwin/*.png) are 224 x 320, and the server resizes any size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

LIBERO_CAMERAS = ("observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb")
LIBERO_SIZE = (128, 128)
ROBOTWIN_CAMERAS = (
    "observation.images.cam_high",
    "observation.images.cam_left_wrist",
    "observation.images.cam_right_wrist",
)
ROBOTWIN_SIZE = (240, 320)  # assumed (see the module docstring)


class LiberoEnv(Protocol):
    """The simulator side of LIBERO's loop: reset() -> images by client key; step(action) -> (images, done);
    the step count so far."""

    timestep: int

    def reset(self) -> dict[str, np.ndarray]: ...

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], bool]: ...


class RoboTwinEnv(Protocol):
    """RoboTwin's TASK_ENV as eval_policy uses it."""

    step_lim: int
    eval_success: bool
    init_pose: np.ndarray

    @property
    def take_action_cnt(self) -> int: ...

    def get_obs(self) -> dict: ...

    def take_action(self, ee_action: np.ndarray, action_type: str = "ee") -> None: ...

    def reset(self) -> object: ...


@dataclass
class Episode:
    """What a driver saw: the served actions per chunk, the key frames sent, whether it ended on done."""

    actions: list[np.ndarray] = field(default_factory=list)
    key_frames: list[int] = field(default_factory=list)  # per compute_kv_cache, the frames it carried
    done: bool = False


def libero_episode(
    client, sim: LiberoEnv, prompt: str, max_steps: int = 800, episode_seed: int | None = None
) -> Episode:
    """evaluation/libero/client.py run_one's loop (upstream steps until `timestep < 800`). `episode_seed`
    (not upstream's): sent with the reset, the server's noise index for this episode (serving/protocol.py)."""
    out = Episode()
    first_obs = sim.reset()
    seed = {} if episode_seed is None else {"episode_seed": episode_seed}
    client.infer(dict(reset=True, prompt=prompt, **seed))
    done = False
    first = True
    while sim.timestep < max_steps:
        ret = client.infer(dict(obs=first_obs, prompt=prompt))
        action = ret["action"]
        out.actions.append(action)

        key_frame_list = []
        assert action.shape[2] % 4 == 0
        action_per_frame = action.shape[2] // 4
        start_idx = 1 if first else 0
        for i in range(start_idx, action.shape[1]):
            for j in range(action.shape[2]):
                ee_action = action[:, i, j]
                observes, done = sim.step(ee_action)
                if done:
                    break
                if (j + 1) % action_per_frame == 0:
                    key_frame_list.append(observes)

            if done:
                break

        first = False

        if done:
            break
        else:
            client.infer(dict(obs=key_frame_list, compute_kv_cache=True, imagine=False, state=action))
            out.key_frames.append(len(key_frame_list))
    out.done = done
    return out


# -- RoboTwin ----------------------------------------------------------------------------------------
def euler2quat(ai: float, aj: float, ak: float) -> np.ndarray:
    """geometry.py euler2quat with axes 'sxyz' (what the client calls): quaternion w, x, y, z."""
    ai, aj, ak = ai / 2.0, aj / 2.0, ak / 2.0
    ci, si, cj, sj, ck, sk = np.cos(ai), np.sin(ai), np.cos(aj), np.sin(aj), np.cos(ak), np.sin(ak)
    cc, cs, sc, ss = ci * ck, ci * sk, si * ck, si * sk
    return np.array([cj * cc + sj * ss, cj * sc - sj * cs, cj * ss + sj * cc, cj * cs - sj * sc])


def _quat_mul_xyzw(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """scipy's (R.from_quat(a) * R.from_quat(b)).as_quat() for unit quaternions x, y, z, w (the Hamilton
    product a b; scipy normalises its inputs, and its sign is that of the product)."""
    a = a / np.linalg.norm(a)
    b = b / np.linalg.norm(b)
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array([
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
        aw * bw - ax * bx - ay * by - az * bz,
    ])  # fmt: skip


def add_eef_pose(new_pose: np.ndarray, init_pose: np.ndarray) -> np.ndarray:
    out_rot = _quat_mul_xyzw(init_pose[3:7], new_pose[3:7])
    out_trans = new_pose[:3] + init_pose[:3]
    return np.concatenate([out_trans, out_rot, new_pose[7:8]])


def add_init_pose(new_pose: np.ndarray, init_pose: np.ndarray) -> np.ndarray:
    left_pose = add_eef_pose(new_pose[:8], init_pose[:8])
    right_pose = add_eef_pose(new_pose[8:], init_pose[8:])
    return np.concatenate([left_pose, right_pose])


def format_obs(observation: dict, prompt: str) -> dict:
    return {
        "observation.images.cam_high": observation["observation"]["head_camera"]["rgb"],  # H,W,3
        "observation.images.cam_left_wrist": observation["observation"]["left_camera"]["rgb"],
        "observation.images.cam_right_wrist": observation["observation"]["right_camera"]["rgb"],
        "observation.state": observation["joint_action"]["vector"],
        "task": prompt,
    }


# long: upstream's eval_policy loop for one episode, kept in its order line by line so the two can be read
# side by side
def robotwin_episode(
    client,
    task_env: RoboTwinEnv,
    prompt: str,
    video_guidance_scale: float = 5,
    action_guidance_scale: float = 1,
) -> Episode:
    """evaluation/robotwin/eval_polict_client_openpi.py eval_policy's loop for one episode."""
    out = Episode()
    save_visualization = False
    task_env.reset()
    client.infer(dict(reset=True, prompt=prompt, save_visualization=save_visualization))

    first = True
    initial_obs = task_env.get_obs()
    inint_eef_pose = (
        initial_obs["endpose"]["left_endpose"]
        + [initial_obs["endpose"]["left_gripper"]]
        + initial_obs["endpose"]["right_endpose"]
        + [initial_obs["endpose"]["right_gripper"]]
    )
    inint_eef_pose = np.array(inint_eef_pose, dtype=np.float64)
    first_obs = None
    while task_env.take_action_cnt < task_env.step_lim:
        if first:
            observation = task_env.get_obs()
            first_obs = format_obs(observation, prompt)

        ret = client.infer(
            dict(
                obs=first_obs,
                prompt=prompt,
                save_visualization=save_visualization,
                video_guidance_scale=video_guidance_scale,
                action_guidance_scale=action_guidance_scale,
            )
        )
        action = ret["action"]
        out.actions.append(action)
        key_frame_list = []

        assert action.shape[2] % 4 == 0
        action_per_frame = action.shape[2] // 4

        start_idx = 1 if first else 0
        for i in range(start_idx, action.shape[1]):
            for j in range(action.shape[2]):
                ee_action = action[:, i, j]
                if action.shape[0] == 14:
                    ee_action = np.concatenate([
                        ee_action[:3],
                        euler2quat(ee_action[3], ee_action[4], ee_action[5]),
                        ee_action[6:10],
                        euler2quat(ee_action[10], ee_action[11], ee_action[12]),
                        ee_action[13:14],
                    ])  # fmt: skip
                elif action.shape[0] == 16:
                    ee_action = add_init_pose(ee_action, inint_eef_pose)
                    ee_action = np.concatenate([
                        ee_action[:3],
                        ee_action[3:7] / np.linalg.norm(ee_action[3:7]),
                        ee_action[7:11],
                        ee_action[11:15] / np.linalg.norm(ee_action[11:15]),
                        ee_action[15:16],
                    ])  # fmt: skip
                else:
                    raise NotImplementedError
                task_env.take_action(ee_action, action_type="ee")

                if (j + 1) % action_per_frame == 0:
                    obs = format_obs(task_env.get_obs(), prompt)
                    key_frame_list.append(obs)

        first = False

        client.infer(
            dict(
                obs=key_frame_list,
                compute_kv_cache=True,
                imagine=False,
                save_visualization=save_visualization,
                state=action,
            )
        )
        out.key_frames.append(len(key_frame_list))

        if task_env.eval_success:
            out.done = True
            break
    return out
