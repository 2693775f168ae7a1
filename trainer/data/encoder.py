"""Frames -> latents: the video encoders the latent cache is made with (trainer/data/cache.py).

One camera's frames (T, 224, 224, 3) uint8 go in; (L, C, h, w) float32 latents come out, L = 1 + (T-1)//t
for the encoder's temporal factor t (the first frame alone, then groups of t frames, as the Wan2.2 VAE's
causal encoder does; trailing frames that do not fill a group are dropped). Views are encoded one by one;
the stream combines them (trainer/data/stream.py).

    wan_vae     the Wan2.2 VAE through diffusers' AutoencoderKLWan, loaded from a local folder (the released
                model's vae/): frames resized bilinearly (align_corners False) to latent_size x the VAE's
                spatial factor, scaled to [-1, 1], bf16 on GPU (fp32 on CPU), the posterior mean, normalised
                by the VAE config's latents_mean/latents_std, as the reference's server (wan_va_server.py
                `_encode_obs`) does. normalised = True.
    patch_mean  a weights-free STAND-IN with the same layout: each latent cell averages its pixels (space-to-
                depth of an area-pooled image, mixed into C channels by a fixed orthonormal matrix); a latent
                frame averages its group of t frames (t = data.actions_per_frame). normalised = False: the
                stream standardises it by data statistics.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F


class EncoderError(ValueError):
    """An encoder that cannot be built (missing folder, wrong sizes); names the folder/key and the fix."""


class VideoEncoder(Protocol):
    name: str
    temporal: int  # frames per latent frame after the first
    channels: int
    latent_side: int  # latent grid side per view
    resolution: int  # pixel side the frames are resized to before encoding (0: area pooling, no resize)
    normalised: bool  # latents already normalised (VAE statistics); else the stream standardises them
    stand_in: bool

    def config(self) -> dict[str, Any]: ...

    def encode(self, frames: np.ndarray) -> np.ndarray: ...


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def usable_frames(num_frames: int, temporal: int) -> int:
    """Frames the encoder uses: 1 + temporal * n <= num_frames."""
    return 1 + (num_frames - 1) // temporal * temporal if num_frames > 0 else 0


class PatchMeanEncoder:
    name = "patch_mean"
    normalised = False
    stand_in = True

    def __init__(self, channels: int, size: int, temporal: int = 1, seed: int = 0):
        self.channels, self.latent_side, self.temporal, self.seed = channels, size, max(1, temporal), seed
        self.resolution = 0
        self.ratio = max(1, math.ceil(math.sqrt(channels / 3)))
        depth = 3 * self.ratio**2
        g = torch.Generator().manual_seed(seed)
        n = max(depth, channels)
        basis, _ = torch.linalg.qr(torch.randn(n, n, generator=g))
        self.mix = basis[:channels, :depth].contiguous()  # orthonormal rows when depth >= channels

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "channels": self.channels,
            "size": self.latent_side,
            "ratio": self.ratio,
            "temporal": self.temporal,
            "seed": self.seed,
            "version": 2,
        }

    @torch.no_grad()
    def encode(self, frames: np.ndarray) -> np.ndarray:
        """(T, H, W, 3) uint8 -> (1 + (T-1)//t, channels, size, size) float32."""
        t = self.temporal
        used = usable_frames(frames.shape[0], t)
        x = torch.from_numpy(np.ascontiguousarray(frames[:used])).permute(0, 3, 1, 2).float() / 255.0 - 0.5
        x = F.adaptive_avg_pool2d(x, self.latent_side * self.ratio)
        if used > 1:  # frame 0 alone, then the mean of each group of t frames
            x = torch.cat([x[:1], x[1:].reshape(-1, t, *x.shape[1:]).mean(dim=1)])
        x = F.pixel_unshuffle(x, self.ratio)  # (L, 3 r^2, size, size)
        return np.ascontiguousarray(torch.einsum("cd,ndhw->nchw", self.mix, x).numpy(), dtype=np.float32)


def _vae_folder(path: str) -> Path:
    folder = Path(path).expanduser()
    if (folder / "vae" / "config.json").is_file():
        folder = folder / "vae"  # the released model's root was given
    if not (folder / "config.json").is_file():
        raise EncoderError(
            f"data.vae_path={path!r}: no {folder / 'config.json'}; point it at the Wan2.2 VAE folder "
            "(the released model's vae/, holding config.json and diffusion_pytorch_model.safetensors)"
        )
    return folder


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


class WanVAEEncoder:
    """Sizes and the cache's config come from config.json alone; the weights load on the first encode."""

    name = "wan_vae"
    normalised = True
    stand_in = False

    def __init__(self, path: str, latent_side: int, device: torch.device | None = None):
        self.folder = _vae_folder(path)
        try:
            self.vae_config = json.loads((self.folder / "config.json").read_text())
        except ValueError as exc:
            raise EncoderError(f"{self.folder / 'config.json'}: not valid JSON ({exc})") from exc
        cfg = self.vae_config
        try:
            self.channels = int(cfg["z_dim"])
            downsample = cfg.get("temperal_downsample", [False, True, True])
            self.temporal = int(cfg.get("scale_factor_temporal") or 2 ** sum(bool(x) for x in downsample))
            self.spatial = int(cfg.get("scale_factor_spatial") or 8 * (cfg.get("patch_size") or 1))
            self.mean = torch.tensor(cfg["latents_mean"], dtype=torch.float32).view(1, -1, 1, 1, 1)
            self.std = torch.tensor(cfg["latents_std"], dtype=torch.float32).view(1, -1, 1, 1, 1)
        except (KeyError, TypeError, ValueError) as exc:
            raise EncoderError(
                f"{self.folder / 'config.json'}: not a Wan VAE config ({exc!r} missing or bad)"
            ) from exc
        self.device = device or default_device()
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.latent_side = latent_side
        self.resolution = latent_side * self.spatial
        weights = sorted(self.folder.glob("*.safetensors")) + sorted(self.folder.glob("*.bin"))
        if not weights:
            raise EncoderError(f"{self.folder}: no diffusion_pytorch_model*.safetensors beside config.json")
        self._weights = [(p.name, p.stat().st_size) for p in weights]
        self._vae: Any = None

    def config(self) -> dict[str, Any]:
        vae_config = {k: v for k, v in self.vae_config.items() if not k.startswith("_")}
        return {
            "name": self.name,
            "vae_config": vae_config,
            "weights": self._weights,
            "resolution": self.resolution,
            "dtype": str(self.dtype),
            "posterior": "mean",
            "resize": "bilinear, align_corners=False",
        }

    def _model(self):
        if self._vae is None:
            from diffusers import AutoencoderKLWan  # the preparation path only

            try:
                vae = AutoencoderKLWan.from_pretrained(str(self.folder), torch_dtype=self.dtype)
            except (OSError, ValueError, RuntimeError) as exc:
                raise EncoderError(
                    f"{self.folder}: cannot load AutoencoderKLWan ({type(exc).__name__}: {exc})"
                ) from exc
            self._vae = vae.to(self.device).eval()
        return self._vae

    @torch.no_grad()
    def encode(self, frames: np.ndarray) -> np.ndarray:
        vae = self._model()
        used = usable_frames(frames.shape[0], self.temporal)
        video = torch.from_numpy(np.ascontiguousarray(frames[:used])).float().permute(0, 3, 1, 2)
        size = (self.resolution, self.resolution)
        video = F.interpolate(video, size=size, mode="bilinear", align_corners=False)
        video = (video.permute(1, 0, 2, 3).unsqueeze(0) / 255.0 * 2.0 - 1.0).to(self.device, self.dtype)
        mu = vae.encode(video).latent_dist.mean.float().cpu()  # (1, C, L, h, w)
        mu = (mu - self.mean) / self.std
        return np.ascontiguousarray(mu[0].permute(1, 0, 2, 3).numpy(), dtype=np.float32)


ENCODERS = ("patch_mean", "wan_vae")


def make_encoder(cfg, device: torch.device | None = None) -> VideoEncoder:
    """The video encoder data.encoder names, checked against the model's latent channels."""
    d, m = cfg.data, cfg.model
    if d.encoder == "patch_mean":
        return PatchMeanEncoder(m.latent_channels, m.latent_size, d.actions_per_frame)
    if d.encoder == "wan_vae":
        if not d.vae_path:
            raise EncoderError(
                "data.encoder=wan_vae needs data.vae_path: the Wan2.2 VAE folder (the released model's vae/)"
            )
        enc = WanVAEEncoder(d.vae_path, m.latent_size, device)
        if enc.channels != m.latent_channels:
            raise EncoderError(
                f"{enc.folder / 'config.json'}: z_dim {enc.channels} != model.latent_channels "
                f"{m.latent_channels}; set model.latent_channels={enc.channels}"
            )
        if enc.temporal != d.actions_per_frame:
            raise EncoderError(
                f"{enc.folder / 'config.json'}: the VAE makes one latent frame per {enc.temporal} frames "
                f"(10 Hz, one action per frame), so data.actions_per_frame must be {enc.temporal}, not "
                f"{d.actions_per_frame}"
            )
        return enc
    raise EncoderError(f"data.encoder={d.encoder!r} is not a known encoder (known: {', '.join(ENCODERS)})")
