"""Frames -> latents: a swappable encoder stage, and an on-disk cache of the latents per episode.

LingBot-VA trains on precomputed VAE latents (Wan2.2 VAE). The default here needs no downloaded weights:
`patch_mean` averages each latent cell's pixels (space-to-depth of an area-pooled image) and mixes the
3*r*r values into `channels` with a fixed orthonormal matrix drawn from a fixed seed. A learned VAE
plugs in by registering another encoder under a new name (ENCODERS) and choosing it with data.encoder.

Cache: <dataset>/.latents/<encoder key>/<furniture>/<episode>.npz with the latents and the actions, keyed
by the source file's size and mtime, so later runs never decode images. Files are written under a
temporary name and renamed; a missing or stale entry is recomputed.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from trainer.data.furniturebench import read_episode


class PatchMeanEncoder:
    name = "patch_mean"

    def __init__(self, channels: int, size: int, seed: int = 0):
        self.channels, self.size = channels, size
        self.ratio = max(1, math.ceil(math.sqrt(channels / 3)))
        depth = 3 * self.ratio**2
        g = torch.Generator().manual_seed(seed)
        basis, _ = torch.linalg.qr(torch.randn(max(depth, channels), max(depth, channels), generator=g))
        self.mix = basis[
            :channels, :depth
        ].contiguous()  # (channels, depth), orthonormal rows when depth >= channels

    @property
    def cache_key(self) -> str:
        return f"{self.name}-c{self.channels}-s{self.size}-r{self.ratio}-v1"

    @torch.no_grad()
    def encode(self, frames: np.ndarray) -> np.ndarray:
        """(N, H, W, 3) uint8 -> (N, channels, size, size) float32."""
        x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() / 255.0 - 0.5
        x = F.adaptive_avg_pool2d(x, self.size * self.ratio)
        x = F.pixel_unshuffle(x, self.ratio)  # (N, 3 r^2, size, size)
        # contiguous: fresh and cached latents must reduce in the same order (bitwise-equal statistics)
        return np.ascontiguousarray(torch.einsum("cd,ndhw->nchw", self.mix, x).numpy(), dtype=np.float32)


ENCODERS = {"patch_mean": PatchMeanEncoder}


def make_encoder(name: str, channels: int, size: int):
    if name not in ENCODERS:
        raise ValueError(
            f"data.encoder={name!r} is not a known encoder (known: {', '.join(sorted(ENCODERS))})"
        )
    return ENCODERS[name](channels, size)


def _source_tag(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def encoded_episode(
    path: Path, encoder, camera: str, cache_root: Path | None
) -> tuple[np.ndarray, np.ndarray]:
    """(latents (T_obs, C, S, S), actions (T, 8)) of one episode file, from the cache when valid."""
    path = Path(path)
    entry = None
    if cache_root is not None:
        entry = cache_root / encoder.cache_key / camera / path.parent.name / f"{path.stem}.npz"
        if entry.is_file():
            try:
                with np.load(entry, allow_pickle=False) as z:
                    if str(z["source"]) == _source_tag(path):
                        return z["latents"], z["actions"]
            except (OSError, KeyError, ValueError):
                pass  # unreadable entry: recompute and overwrite
    episode = read_episode(path, cameras=(camera,))
    latents = encoder.encode(episode.images[camera])
    if entry is not None:
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = entry.with_name(f".{entry.stem}.tmp{os.getpid()}.npz")
            np.savez(tmp, latents=latents, actions=episode.actions, source=np.array(_source_tag(path)))
            os.replace(tmp, entry)
        except OSError as exc:  # read-only dataset: the cache is an optimisation, run without it
            warnings.warn(f"latent cache not written ({entry}: {exc}); encoding in memory", stacklevel=2)
    return latents, episode.actions
