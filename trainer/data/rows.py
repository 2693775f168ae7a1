"""Which rows of an episode are encoded, and by which encoder per camera (trainer/data/cache.py's entries,
LeRobot's too: lerobot_cache.py). `spec`: a cache.CacheSpec (not imported: cache.py imports this).

    video_rows(frames, spec)       the rows 0, a, 2a, ... of a camera's images (a = spec.stride,
                                   data.actions_per_video_frame); the actions stay one per row
    camera_encoders(spec, video)   camera -> the encoder at its latent size (spec.view_sizes, from
                                   trainer/data/views.py): `video` itself, or video.resized(h, w)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainer.data.encoder import VideoEncoder


def video_rows(frames: np.ndarray, spec: Any) -> np.ndarray:
    """The rows of an episode's images that are its video frames: rows 0, a, 2a, ... (a = the spec's
    actions_per_video_frame; every row at a = 1). The actions stay one per row."""
    return frames if spec.stride == 1 else frames[:: spec.stride]


def camera_encoders(spec: Any, video: VideoEncoder) -> dict[str, VideoEncoder]:
    """camera -> the encoder at its latent size (spec.view_sizes): `video` itself at the main size, else
    `video.resized(h, w)` (the same weights on another grid: the T-shape's half-size wrist views)."""
    out: dict[str, VideoEncoder] = {}
    resized: dict[tuple[int, int], VideoEncoder] = {(video.latent_side, video.latent_width): video}
    for cam, size in zip(spec.cameras, spec.view_sizes(), strict=True):
        if size not in resized:
            resized[size] = video.resized(*size)
        out[cam] = resized[size]
    return out
