"""Write a small LeRobot dataset with lerobot's own writer: v2.1 with lerobot 0.3.3, v3.0 with 0.4.4 (run by
tests/support/lerobot_env.py `run_writer`, inside a cached test-only environment; the suite imports only
TASKS and frame() from it).

    python lerobot_write.py ROOT --episodes 3 --length 13 [--size 32] [--vcodec libsvtav1]

Features: two video cameras (`observation.images.front`, `observation.images.wrist`, encoded by
`save_episode` with lerobot's defaults: libsvtav1, yuv420p, g=2, crf=30, unless --vcodec; lerobot 0.4.x
concatenates every episode's video into videos/<camera>/chunk-000/file-000.mp4), one image
camera (`observation.images.still`: PNG bytes in the parquet, lossless), `observation.state` (6,) and
`action` (7,) float32. Episode e's task is TASKS[e % 2]. The exact frames written go to
ROOT/../<name>.frames.npz (`<camera>__<episode>` -> (T, H, W, 3) uint8) for the tests to compare.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

TASKS = ("put the red cube in the bowl", "open the drawer")
VIDEO_KEYS = ("observation.images.front", "observation.images.wrist")
IMAGE_KEY = "observation.images.still"


def frame(camera: int, episode: int, t: int, size: int) -> np.ndarray:
    """A smooth, moving pattern (AV1 at crf 30 keeps it well above the tests' PSNR floor)."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    phase = 0.35 * t + 1.3 * episode + 2.1 * camera
    r = 0.5 + 0.4 * np.sin(2 * np.pi * (x + 0.1 * t) + phase)
    g = 0.5 + 0.4 * np.cos(2 * np.pi * (y - 0.07 * t) + phase)
    b = 0.5 + 0.3 * np.sin(2 * np.pi * (x + y) + 0.5 * phase)
    return (np.stack([r, g, b], axis=-1) * 255).round().astype(np.uint8)


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
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--vcodec", default="")
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

    s = args.size
    features = {
        **{k: {"dtype": "video", "shape": (s, s, 3), "names": ["height", "width", "channels"]}
           for k in VIDEO_KEYS},
        IMAGE_KEY: {"dtype": "image", "shape": (s, s, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (6,), "names": [f"q{i}" for i in range(6)]},
        "action": {"dtype": "float32", "shape": (7,), "names": [f"a{i}" for i in range(7)]},
    }  # fmt: skip
    ds = LeRobotDataset.create(
        repo_id="lingbot/test", fps=10, features=features, root=args.root, robot_type="test_arm",
        use_videos=True, image_writer_threads=0, **({"vcodec": args.vcodec} if v3 and args.vcodec else {}),
    )  # fmt: skip
    written: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(0)
    for e in range(args.episodes):
        frames: dict[str, list[np.ndarray]] = {k: [] for k in (*VIDEO_KEYS, IMAGE_KEY)}
        for t in range(args.length + e):
            row = {k: frame(c, e, t, s) for c, k in enumerate((*VIDEO_KEYS, IMAGE_KEY))}
            for k, img in row.items():
                frames[k].append(img)
            state = np.sin(0.2 * t + np.arange(6, dtype=np.float32) + e).astype(np.float32)
            action = (0.1 * t + rng.normal(size=7)).astype(np.float32)
            values = {**row, "observation.state": state, "action": action}
            if v3:  # lerobot 0.4.x: the task is a key of the frame
                ds.add_frame({**values, "task": TASKS[e % 2]})
            else:
                ds.add_frame(values, task=TASKS[e % 2])
        ds.save_episode(**({"parallel_encoding": False} if v3 else {}))
        for k, imgs in frames.items():
            written[f"{k}__{e}"] = np.stack(imgs)
    if v3:
        ds.finalize()  # lerobot 0.4.x: closes the parquet writers (their footers)
    np.savez_compressed(args.root.parent / f"{args.root.name}.frames.npz", **written)  # type: ignore[arg-type]
    print(f"wrote {args.episodes} episodes to {args.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
