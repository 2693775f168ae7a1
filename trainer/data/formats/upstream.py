"""The reference's own latent layout (upstream LingBot-VA `wan_va/dataset/lerobot_latent_dataset.py`, read
there by LatentLeRobotDataset; read here, never copied), written and read beside a LeRobot dataset:

    <root>/latents/chunk-XXX/<camera key>/episode_XXXXXX_<start>_<end>.pth    torch.save of a dict:
        latent              ((f h w), c) bfloat16   the latent grid, rows in f, h, w order
        latent_num_frames   f;  latent_height h;  latent_width w
        text_emb            (L, D) bfloat16  the episode task's embedding (the reference reads the first
                                             camera's)
        frame_ids           the rows whose video frames the latents cover: start, start + a, ...,
                            start + (f - 1) t a (a = data.actions_per_video_frame, the reference's
                            frame_stride; t the encoder's temporal factor, the Wan2.2 VAE's 4: each
                            latent frame after the first then holds t a = data.actions_per_frame actions,
                            the reference's frame_stride * 4)
        fps                 the dataset's fps

One file per episode and camera covering the whole episode: start 0, end = its frame count. The reference
trains on the `action_config` segments of meta/episodes.jsonl; an episode without them needs
`"action_config": [{"start_frame": 0, "end_frame": <length>, ...}]` added there to be found by it (this
project does not rewrite meta/). `write` (data.upstream_latents=write) stores what the cache gets;
`read` (data.upstream_latents=read) takes latents from existing files instead of encoding, and refuses
files whose grid or channels differ from the config's encoder at that camera's size (data.layout: the
T-shape's wrist views at half height and width; naming the file).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from provision.atomic import write_atomic
from trainer.data.formats.furniturebench import DatasetError
from trainer.data.formats.lerobot import LeRobotInfo


def latent_file(ds: LeRobotInfo, episode: int, camera: str, start: int, end: int) -> Path:
    chunk = episode // ds.chunks_size
    return ds.root / "latents" / f"chunk-{chunk:03d}" / camera / f"episode_{episode:06d}_{start}_{end}.pth"


def _length(ds: LeRobotInfo, episode: int) -> int:
    for e in ds.episodes:
        if int(e["episode_index"]) == episode:
            return int(e["length"])
    raise DatasetError(f"{ds.episodes_file}: episode {episode} not listed")


def write_episode_latents(ds: LeRobotInfo, episode: int, latents: dict, text_emb: np.ndarray, spec) -> None:
    """One .pth per camera (atomically: provision/atomic.py)."""
    import torch

    end = _length(ds, episode)
    for camera, lat in latents.items():
        f, c, h, w = lat.shape
        record: dict[str, Any] = {
            "latent": torch.from_numpy(
                np.ascontiguousarray(lat.transpose(0, 2, 3, 1).reshape(f * h * w, c))
            ).to(torch.bfloat16),
            "latent_num_frames": f,
            "latent_height": h,
            "latent_width": w,
            "text_emb": torch.from_numpy(np.asarray(text_emb, np.float32)).to(torch.bfloat16),
            "frame_ids": list(range(0, 1 + (f - 1) * spec.temporal * spec.stride, spec.stride)),
            "fps": ds.fps,
        }
        buf = io.BytesIO()
        torch.save(record, buf)
        path = latent_file(ds, episode, camera, 0, end)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, buf.getvalue())


def read_episode_latents(ds: LeRobotInfo, episode: int, cameras: list[str], spec) -> dict[str, np.ndarray]:
    """camera -> (f, c, h, w) float32 from the reference's files, checked against the spec's grid."""
    import torch

    out = {}
    end = _length(ds, episode)
    sizes = dict(zip(spec.cameras, spec.view_sizes(), strict=True))
    for camera in cameras:
        path = latent_file(ds, episode, camera, 0, end)
        if not path.is_file():
            raise DatasetError(
                f"{path}: missing (data.upstream_latents=read); write them with data.upstream_latents=write "
                "or set data.upstream_latents=off to encode the videos"
            )
        try:
            record = torch.load(path, map_location="cpu", weights_only=True)
            f, h, w = (int(record[k]) for k in ("latent_num_frames", "latent_height", "latent_width"))
            lat = record["latent"].float().reshape(f, h, w, -1).permute(0, 3, 1, 2).numpy()
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise DatasetError(f"{path}: not a reference latent file ({type(exc).__name__}: {exc})") from exc
        want_h, want_w = sizes[camera]
        if lat.shape[1] != spec.latent_channels or (h, w) != (want_h, want_w):
            raise DatasetError(
                f"{path}: latents of {lat.shape[1]} channels on a {h}x{w} grid; the config's encoder makes "
                f"{spec.latent_channels} on {want_h}x{want_w} for camera {camera} (model.latent_channels, "
                "model.latent_size, model.latent_width, data.layout)"
            )
        out[camera] = lat
    return out
