"""Write a small LeRobot dataset with lerobot's own writer: v2.1 with lerobot 0.3.3, v3.0 with 0.4.4 (run by
tests/support/lerobot_env.py `run_writer`, inside a cached test-only environment; the suite imports only
TASKS, frame(), libero_row() and robotwin_row() from it).

    python lerobot_write.py ROOT --episodes 3 --length 13 [--size 32] [--vcodec libsvtav1]
                            [--layout test|libero|robotwin]

--layout test (the default). Features: two video cameras (`observation.images.front`,
`observation.images.wrist`, encoded by `save_episode` with lerobot's defaults: libsvtav1, yuv420p, g=2,
crf=30, unless --vcodec (every layout); lerobot 0.4.x concatenates every episode's video into
videos/<camera>/chunk-000/file-000.mp4), one image camera (`observation.images.still`: PNG bytes in the
parquet, lossless), `observation.state` (6,) and `action` (7,) float32. Episode e's task is TASKS[e % 2].
The exact frames written go to ROOT/../<name>.frames.npz (`<camera>__<episode>` -> (T, H, W, 3) uint8)
for the tests to compare, and every layout's numeric columns to ROOT/../<name>.actions.npz
(`action__<episode>`, `observation.state__<episode>` -> (T, D) float32).

--layout libero: upstream LingBot-VA's LIBERO layout (wan_va/configs/va_libero_cfg.py obs_cam_keys, height
and width 128; evaluation/libero/client.py: LIBERO's camera_heights/widths 128): video cameras
`observation.images.agentview_rgb` and `observation.images.eye_in_hand_rgb` at --size (default 128) square,
`action` (7,) float32 (xyz delta, rotation delta (axis-angle), gripper: LIBERO's delta end-effector
controller, each in [-1, 1], the gripper -1 open / +1 closed), `observation.state` (8,) (eef xyz, axis-angle,
two gripper fingers). Rows = video frames (one action per video frame). Episode e has length + e rows.

--layout robotwin: upstream's RoboTwin layout (va_robotwin_cfg.py obs_cam_keys; its format_obs in
evaluation/robotwin/eval_polict_client_openpi.py: `observation.images.cam_high`, `cam_left_wrist`,
`cam_right_wrist`, `observation.state` = the joint vector): three video cameras at --size rows x 4/3 as
many columns (default 240 x 320: RoboTwin's D435 camera config as we know it; RoboTwin's
task_config/_camera_config.yml is not in the upstream mirror, so this is not checked against it),
`action` (16,) float32 = [left xyz, left quat xyzw (unit), left gripper, right xyz, right quat xyzw, right
gripper]: ABSOLUTE end-effector poses moving smoothly (upstream makes them relative with get_relative_pose
on action[:, :7] and action[:, 8:15]), grippers in [0, 1]; `observation.state` (14,) (6 joints + gripper per
arm). A video frame on every row (the trainer uses every 4th: data.actions_per_video_frame 4).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

TASKS = ("put the red cube in the bowl", "open the drawer")
VIDEO_KEYS = ("observation.images.front", "observation.images.wrist")
IMAGE_KEY = "observation.images.still"
LIBERO_KEYS = ("observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb")
LIBERO_TASKS = ("put the black bowl on the plate", "open the top drawer of the cabinet")
ROBOTWIN_KEYS = (
    "observation.images.cam_high", "observation.images.cam_left_wrist", "observation.images.cam_right_wrist"
)  # fmt: skip
ROBOTWIN_TASKS = ("lift the pot with both arms", "place the empty cup on the coaster")
LAYOUTS = ("test", "libero", "robotwin")
DEFAULT_SIZE = {"test": 32, "libero": 128, "robotwin": 240}


def frame(camera: int, episode: int, t: int, size: int, width: int = 0) -> np.ndarray:
    """A smooth, moving pattern (AV1 at crf 30 keeps it well above the tests' PSNR floor); size x size, or
    size rows x width columns."""
    width = width or size
    y, x = np.mgrid[0:size, 0:width].astype(np.float32) / np.float32([size, width])[:, None, None]
    phase = 0.35 * t + 1.3 * episode + 2.1 * camera
    r = 0.5 + 0.4 * np.sin(2 * np.pi * (x + 0.1 * t) + phase)
    g = 0.5 + 0.4 * np.cos(2 * np.pi * (y - 0.07 * t) + phase)
    b = 0.5 + 0.3 * np.sin(2 * np.pi * (x + y) + 0.5 * phase)
    return (np.stack([r, g, b], axis=-1) * 255).round().astype(np.uint8)


def _quat_xyzw(axis_angle: np.ndarray) -> np.ndarray:
    """A unit quaternion (x, y, z, w) from an axis-angle vector (SciPy's from_rotvec, written out)."""
    angle = float(np.linalg.norm(axis_angle))
    axis = axis_angle / angle if angle > 0 else np.zeros(3)
    return np.concatenate([axis * np.sin(angle / 2), [np.cos(angle / 2)]]).astype(np.float32)


def libero_row(episode: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """(action (7,), observation.state (8,)): smooth delta commands in [-1, 1] and the pose they drive."""
    k = np.arange(6, dtype=np.float64)
    delta = 0.8 * np.sin(0.15 * t + 0.9 * k + 0.7 * episode)
    grip = 1.0 if np.sin(0.1 * t + episode) > 0 else -1.0  # LIBERO: -1 open, +1 closed
    action = np.concatenate([delta, [grip]]).astype(np.float32)
    pose = 0.05 * np.cos(0.15 * t + 0.9 * k + 0.7 * episode) / 0.15
    fingers = [0.04 * (1 - grip) / 2, -0.04 * (1 - grip) / 2]
    return action, np.concatenate([pose, fingers]).astype(np.float32)


def robotwin_row(episode: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """(action (16,), observation.state (14,)): two arms' absolute end-effector poses moving smoothly
    (xyz in metres about a per-arm base, a slowly turning orientation as a unit quaternion xyzw) and
    grippers in [0, 1]; the state is 6 joints + gripper per arm."""
    parts, state = [], []
    for arm, side in enumerate((-1.0, 1.0)):
        phase = 0.05 * t + 0.6 * episode + 1.7 * arm
        xyz = np.array(
            [0.3 * side + 0.05 * np.sin(phase), 0.1 + 0.04 * np.cos(phase), 0.9 + 0.03 * np.sin(2 * phase)]
        )
        rot = np.array(
            [0.3 * np.sin(phase), 0.2 * np.cos(0.7 * phase), 0.5 * side + 0.25 * np.sin(0.5 * phase)]
        )
        grip = 0.5 + 0.5 * np.sin(0.08 * t + episode + arm)
        parts += [xyz.astype(np.float32), _quat_xyzw(rot), np.float32([grip])]
        joints = 0.5 * np.sin(0.05 * t + np.arange(6) + episode + 2.0 * arm)
        state += [joints.astype(np.float32), np.float32([grip])]
    return np.concatenate(parts).astype(np.float32), np.concatenate(state).astype(np.float32)


def _stub_torchvision() -> None:
    """lerobot 0.3.3 imports torchvision at module level but its writer never calls it (transforms apply
    when rows are read; torchvision.io decodes only for the torchvision video backend). PyPI's
    torchvision 0.28.0 is the CUDA build (its ops do not load beside the CPU torch) and no CPU wheel is
    reachable here, so a module that raises on use stands in: a call would fail loudly, never silently."""
    import importlib.machinery
    import types

    def unavailable(*args, **kwargs):
        raise NotImplementedError("torchvision is a stand-in in the test writer's environment")

    tv = types.ModuleType("torchvision")
    tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
    tv.transforms = types.ModuleType("torchvision.transforms")  # type: ignore[attr-defined]
    tv.transforms.ToTensor = unavailable  # type: ignore[attr-defined]
    tv.set_video_backend = unavailable  # type: ignore[attr-defined]
    sys.modules["torchvision"], sys.modules["torchvision.transforms"] = tv, tv.transforms  # type: ignore[attr-defined]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--length", type=int, default=13)
    parser.add_argument("--size", type=int, default=0, help="frame rows (default: the layout's)")
    parser.add_argument("--vcodec", default="")
    parser.add_argument("--layout", choices=LAYOUTS, default="test")
    args = parser.parse_args(argv)

    _stub_torchvision()
    import lerobot
    from lerobot.datasets import lerobot_dataset, video_utils
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    v3 = not lerobot.__version__.startswith("0.3")
    if args.vcodec and not v3:  # lerobot 0.3.3's save_episode calls encode_video_frames with its defaults
        original = video_utils.encode_video_frames

        def encode(imgs_dir, video_path, fps, **kwargs):
            return original(imgs_dir, video_path, fps, vcodec=args.vcodec, **kwargs)

        lerobot_dataset.encode_video_frames = encode  # type: ignore[attr-defined]

    s = args.size or DEFAULT_SIZE[args.layout]
    width = s * 4 // 3 if args.layout == "robotwin" else s
    video_keys = {"test": VIDEO_KEYS, "libero": LIBERO_KEYS, "robotwin": ROBOTWIN_KEYS}[args.layout]
    image_keys = (IMAGE_KEY,) if args.layout == "test" else ()
    tasks = {"test": TASKS, "libero": LIBERO_TASKS, "robotwin": ROBOTWIN_TASKS}[args.layout]
    dims = {"test": (6, 7), "libero": (8, 7), "robotwin": (14, 16)}[args.layout]
    hwc = {"dtype": "video", "shape": (s, width, 3), "names": ["height", "width", "channels"]}
    features = {
        **{k: dict(hwc) for k in video_keys},
        **{k: {**hwc, "dtype": "image"} for k in image_keys},
        "observation.state": {"dtype": "float32", "shape": (dims[0],),
                              "names": [f"q{i}" for i in range(dims[0])]},
        "action": {"dtype": "float32", "shape": (dims[1],), "names": [f"a{i}" for i in range(dims[1])]},
    }  # fmt: skip
    robot = {"test": "test_arm", "libero": "panda", "robotwin": "aloha-agilex"}[args.layout]
    ds = LeRobotDataset.create(
        repo_id=f"lingbot/{args.layout}", fps=10, features=features, root=args.root, robot_type=robot,
        use_videos=True, image_writer_threads=0, **({"vcodec": args.vcodec} if v3 and args.vcodec else {}),
    )  # fmt: skip
    written: dict[str, np.ndarray] = {}
    numeric: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(0)
    cameras = (*video_keys, *image_keys)
    for e in range(args.episodes):
        frames: dict[str, list[np.ndarray]] = {k: [] for k in cameras}
        columns: dict[str, list[np.ndarray]] = {"action": [], "observation.state": []}
        for t in range(args.length + e):
            row = {k: frame(c, e, t, s, width) for c, k in enumerate(cameras)}
            for k, img in row.items():
                frames[k].append(img)
            if args.layout == "libero":
                action, state = libero_row(e, t)
            elif args.layout == "robotwin":
                action, state = robotwin_row(e, t)
            else:
                state = np.sin(0.2 * t + np.arange(6, dtype=np.float32) + e).astype(np.float32)
                action = (0.1 * t + rng.normal(size=7)).astype(np.float32)
            columns["action"].append(action)
            columns["observation.state"].append(state)
            values = {**row, "observation.state": state, "action": action}
            if v3:  # lerobot 0.4.x: the task is a key of the frame
                ds.add_frame({**values, "task": tasks[e % 2]})
            else:
                ds.add_frame(values, task=tasks[e % 2])
        ds.save_episode(**({"parallel_encoding": False} if v3 else {}))
        for k, imgs in frames.items():
            written[f"{k}__{e}"] = np.stack(imgs)
        for k, rows in columns.items():
            numeric[f"{k}__{e}"] = np.stack(rows)
    if v3:
        ds.finalize()  # lerobot 0.4.x: closes the parquet writers (their footers)
    np.savez_compressed(args.root.parent / f"{args.root.name}.frames.npz", **written)  # type: ignore[arg-type]
    np.savez_compressed(args.root.parent / f"{args.root.name}.actions.npz", **numeric)  # type: ignore[arg-type]
    print(f"wrote {args.episodes} episodes to {args.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
