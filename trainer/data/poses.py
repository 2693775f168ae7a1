"""Poses relative to an episode's first row (data.relative_poses), as upstream's get_relative_pose does.

    relative_to_first(actions, starts) -> actions    # (T, K) -> (T, K), a new array

Contract: for each start column s in `starts`, columns s .. s+6 of `actions` are a pose x y z qx qy qz qw
(quaternion scalar LAST, scipy's order). Row i becomes
    translation  t_i - t_0
    rotation     q_0^-1 * q_i   (the Hamilton product; scipy: first_rot.inv() * rot, as_quat())
so row 0 is the zero translation and the identity rotation (0, 0, 0, 1). Quaternions are normalised first
(scipy's Rotation.from_quat normalises), and the sign is what the product gives: no canonicalisation to
w >= 0 (scipy's as_quat does not canonicalise by default). Every other column is unchanged. The reference
row is the EPISODE's first row (upstream takes the clip's; its client adds the episode's initial pose back,
add_init_pose in evaluation/robotwin/eval_polict_client_openpi.py).

Why not scipy: it is not in the tool env nor in the provisioned one, and the maths is a quaternion
conjugate and one product; numpy, in float64, then cast back to the actions' dtype.
A start whose 7 columns do not fit the action row is a DatasetError naming data.relative_poses.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trainer.data.formats.furniturebench import DatasetError

POSE_WIDTH = 7  # x y z qx qy qz qw


def quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product a * b of (..., 4) quaternions in x y z w order."""
    ax, ay, az, aw = np.moveaxis(a, -1, 0)
    bx, by, bz, bw = np.moveaxis(b, -1, 0)
    return np.stack(
        [
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
            aw * bw - ax * bx - ay * by - az * bz,
        ],
        axis=-1,
    )


def quat_inverse(q: np.ndarray) -> np.ndarray:
    """The inverse of unit (..., 4) x y z w quaternions: the conjugate."""
    return q * np.array([-1.0, -1.0, -1.0, 1.0])


def _unit(q: np.ndarray, where: str) -> np.ndarray:
    norm = np.linalg.norm(q, axis=-1, keepdims=True)
    if not np.all(norm > 0):
        raise DatasetError(f"{where}: a zero quaternion cannot be a rotation (data.relative_poses)")
    return q / norm


def relative_to_first(actions: np.ndarray, starts: Sequence[int], where: str = "actions") -> np.ndarray:
    """The actions with the poses at `starts` made relative to row 0 (see the module); `where` names the
    episode in errors."""
    out = np.array(actions, copy=True)
    if not len(starts) or out.shape[0] == 0:
        return out
    width = out.shape[1]
    for s in starts:
        if s < 0 or s + POSE_WIDTH > width:
            raise DatasetError(
                f"{where}: data.relative_poses start {s} needs columns {s}..{s + POSE_WIDTH - 1} "
                f"(x y z qx qy qz qw) but an action row has {width} (the data.action_map channels); "
                "fix data.relative_poses or data.action_map"
            )
        pose = out[:, s : s + POSE_WIDTH].astype(np.float64)
        trans, quat = pose[:, :3], _unit(pose[:, 3:], where)
        out[:, s : s + 3] = trans - trans[:1]
        out[:, s + 3 : s + POSE_WIDTH] = quat_multiply(quat_inverse(quat[:1]), quat)
    return out


def episode_actions(cfg, actions: np.ndarray, where: str) -> np.ndarray:
    """An episode's actions as the stream uses them: data.relative_poses applied when it is set."""
    starts = list(getattr(cfg.data, "relative_poses", []) or [])
    return relative_to_first(actions, starts, where) if starts else actions


def check_normalize(cfg, where: str = "data") -> None:
    """data.relative_poses with dataset statistics (data.normalize quantile / mean_std, which describe the
    ABSOLUTE actions) is refused: a DatasetError naming the fix, data.normalize=fit."""
    starts = list(getattr(cfg.data, "relative_poses", []) or [])
    if starts and cfg.data.normalize in ("quantile", "mean_std"):  # fixed: the config's, of relative poses
        raise DatasetError(
            f"{where}: data.relative_poses={starts} makes poses relative to each episode's first row, but "
            f"data.normalize={cfg.data.normalize} uses the dataset's statistics of the absolute actions; "
            "set data.normalize=fit (quantiles of the relative training actions) or data.relative_poses=[]"
        )
