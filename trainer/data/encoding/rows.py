"""Which rows of an episode are encoded, and by which encoder per camera (trainer/data/cache/store.py's
entries, LeRobot's too: lerobot_entries.py). `spec`: a store.CacheSpec (not imported: store.py imports this).

    video_rows(frames, spec)       the rows 0, a, 2a, ... of a camera's images (a = spec.stride,
                                   data.actions_per_video_frame); the actions stay one per row
    camera_encoders(cameras, sizes, video)
                                   camera -> the encoder at its latent size (views.view_sizes: a
                                   CacheSpec's for the cache, the run config's for bin/serve): `video`
                                   itself, or video.resized(h, w); the one place cameras get encoders
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainer.data.encoding.encoder import VideoEncoder


def video_rows(frames: np.ndarray, spec: Any) -> np.ndarray:
    """The rows of an episode's images that are its video frames: rows 0, a, 2a, ... (a = the spec's
    actions_per_video_frame; every row at a = 1). The actions stay one per row."""
    return frames if spec.stride == 1 else frames[:: spec.stride]


def camera_encoders(
    cameras: Sequence[str], sizes: Sequence[tuple[int, int]], video: VideoEncoder
) -> dict[str, VideoEncoder]:
    """camera -> the encoder at its latent size (`sizes`, the cameras' order): `video` itself at the main
    size, else `video.resized(h, w)` (the same weights on another grid: the T-shape's half-size wrist
    views), one resized encoder per size."""
    out: dict[str, VideoEncoder] = {}
    resized: dict[tuple[int, int], VideoEncoder] = {(video.latent_side, video.latent_width): video}
    for cam, size in zip(cameras, sizes, strict=True):
        size = (int(size[0]), int(size[1]))
        if size not in resized:
            resized[size] = video.resized(*size)
        out[cam] = resized[size]
    return out
