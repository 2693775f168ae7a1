"""Frames -> latents: the video encoders the latent cache is made with (trainer/data/cache/store.py).

One camera's frames (T, 224, 224, 3) uint8 go in; (L, C, h, w) float32 latents come out, L = 1 + (T-1)//t
for the encoder's temporal factor t (the first frame alone, then groups of t frames, as the Wan2.2 VAE's
causal encoder does; trailing frames that do not fill a group are dropped). Views are encoded one by one;
trainer/data/encoding/views.py combines them (data.layout). `latent_side` x `latent_width` is one view's grid
(model.latent_size x model.latent_width, square when that is 0); `resized(side, width)` is the same encoder
(the same loaded weights) at another grid, the T-shape's half-size wrist views.

Streaming (bin/serve, trainer/serving/session.py): `stream()` is one episode's encoder state, as
upstream's server keeps it (`WanVAEStreamingWrapper`: the causal encoder's feature cache, cleared on reset):

    s = enc.stream()
    s.push(first)          # (1, H, W, 3): latent frame 0, encoded alone
    s.push(frames)         # (t*k, H, W, 3): k more latent frames, one per group of t frames, in order

Any other count is a StreamError naming what is expected and what came, and leaves the state as it was
(so is a push that fails while encoding). The latents a stream gives equal `encode` of the whole video:
the Wan VAE's causal convolutions see the same frames through the cache as in one pass (diffusers
`_encode`: the first frame alone, then groups of four, one `feat_cache` for the video); the stand-in's
groups are independent. tests/test_stream_encode.py holds both to 1e-5 in fp32, and to upstream's
algorithm (all of a request's frames in one encoder call).

    wan_vae     the Wan2.2 VAE through diffusers' AutoencoderKLWan, loaded from a local folder (the released
                model's vae/): frames resized bilinearly (align_corners False) to latent_size x the VAE's
                spatial factor, scaled to [-1, 1], bf16 on GPU (fp32 on CPU), the posterior mean, normalised
                by the VAE config's latents_mean/latents_std, as the reference's server (wan_va_server.py
                `_encode_obs`) does. normalised = True.
    patch_mean  a weights-free STAND-IN with the same layout: each latent cell averages its pixels (space-to-
                depth of an area-pooled image, mixed into C channels by a fixed orthonormal matrix); a latent
                frame averages its group of t frames (t = data.actions_per_frame /
                data.actions_per_video_frame). normalised = False: the stream standardises it by data
                statistics.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from trainer.data.encoding.folders import EncoderError, vae_folder


class StreamError(ValueError):
    """Frames pushed in a count the encoder cannot take; names what was expected and what came."""


class LatentStream(Protocol):
    pushed: int  # frames taken so far (0: a fresh episode)

    def expected(self, count: int) -> str | None: ...

    def push(self, frames: np.ndarray) -> np.ndarray: ...


class VideoEncoder(Protocol):
    name: str
    temporal: int  # frames per latent frame after the first
    channels: int
    latent_side: int  # latent grid height per view
    latent_width: int  # latent grid width per view
    resolution: int  # pixel height the frames are resized to before encoding (0: area pooling, no resize)
    normalised: bool  # latents already normalised (VAE statistics); else the stream standardises them
    stand_in: bool

    def config(self) -> dict[str, Any]: ...

    def encode(self, frames: np.ndarray) -> np.ndarray: ...

    def stream(self) -> LatentStream: ...

    def resized(self, side: int, width: int) -> VideoEncoder: ...


def expected_count(pushed: int, count: int, temporal: int) -> str | None:
    """None when `count` frames can follow `pushed`; else what was expected (the StreamError's text)."""
    if pushed == 0:
        if count < 1 or (count - 1) % temporal:
            return (
                f"the episode's first frames must be 1 + {temporal} x k (latent frame 0 alone, then "
                f"groups of {temporal}); got {count}"
            )
        return None
    if count < temporal or count % temporal:
        return (
            f"frames after the first must come in groups of {temporal} (one latent frame each); got {count}"
        )
    return None


class _Stream:
    """The shared bookkeeping: count checks, and a state restored when a push fails part way."""

    def __init__(self, temporal: int):
        self.temporal, self.pushed = temporal, 0

    def expected(self, count: int) -> str | None:
        return expected_count(self.pushed, count, self.temporal)

    def push(self, frames: np.ndarray) -> np.ndarray:
        problem = self.expected(int(frames.shape[0]))
        if problem is not None:
            raise StreamError(problem)
        saved = self._save()
        try:
            out = self._encode(frames, first=self.pushed == 0)
        except BaseException:
            self._restore(saved)
            raise
        self.pushed += int(frames.shape[0])
        return out

    def _save(self) -> Any:
        return None

    def _restore(self, saved: Any) -> None:
        pass

    def _encode(self, frames: np.ndarray, first: bool) -> np.ndarray:
        raise NotImplementedError


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def usable_frames(num_frames: int, temporal: int) -> int:
    """Frames the encoder uses: 1 + temporal * n <= num_frames."""
    return 1 + (num_frames - 1) // temporal * temporal if num_frames > 0 else 0


class PatchMeanEncoder:
    name = "patch_mean"
    normalised = False
    stand_in = True

    def __init__(self, channels: int, size: int, temporal: int = 1, seed: int = 0, width: int = 0):
        self.channels, self.latent_side, self.temporal, self.seed = channels, size, max(1, temporal), seed
        self.latent_width = width or size
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
            **({"width": self.latent_width} if self.latent_width != self.latent_side else {}),
            "ratio": self.ratio,
            "temporal": self.temporal,
            "seed": self.seed,
            "version": 2,
        }

    def resized(self, side: int, width: int) -> PatchMeanEncoder:
        return PatchMeanEncoder(self.channels, side, self.temporal, self.seed, width)

    def _pooled(self, frames: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() / 255.0 - 0.5
        return F.adaptive_avg_pool2d(x, (self.latent_side * self.ratio, self.latent_width * self.ratio))

    def _latents(self, x: torch.Tensor) -> np.ndarray:
        x = F.pixel_unshuffle(x, self.ratio)  # (L, 3 r^2, h, w)
        return np.ascontiguousarray(torch.einsum("cd,ndhw->nchw", self.mix, x).numpy(), dtype=np.float32)

    def _groups(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, self.temporal, *x.shape[1:]).mean(dim=1)

    @torch.no_grad()
    def encode(self, frames: np.ndarray) -> np.ndarray:
        """(T, H, W, 3) uint8 -> (1 + (T-1)//t, channels, h, w) float32."""
        used = usable_frames(frames.shape[0], self.temporal)
        x = self._pooled(frames[:used])
        if used > 1:  # frame 0 alone, then the mean of each group of t frames
            x = torch.cat([x[:1], self._groups(x[1:])])
        return self._latents(x)

    def stream(self) -> _PatchMeanStream:
        return _PatchMeanStream(self)


class _PatchMeanStream(_Stream):
    """The stand-in's groups are independent: a push is frame 0 alone, or its groups of t averaged."""

    def __init__(self, enc: PatchMeanEncoder):
        super().__init__(enc.temporal)
        self.enc = enc

    @torch.no_grad()
    def _encode(self, frames: np.ndarray, first: bool) -> np.ndarray:
        x = self.enc._pooled(frames)
        head, rest = (x[:1], x[1:]) if first else (x[:0], x)
        return self.enc._latents(torch.cat([head, self.enc._groups(rest)]) if len(rest) else head)


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


class WanVAEEncoder:
    """Sizes and the cache's config come from config.json alone; the weights load on the first encode."""

    name = "wan_vae"
    normalised = True
    stand_in = False

    def __init__(self, path: str, latent_side: int, device: torch.device | None = None, width: int = 0):
        self.folder = vae_folder(path)
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
        self.latent_side, self.latent_width = latent_side, width or latent_side
        self.resolution = latent_side * self.spatial
        weights = sorted(self.folder.glob("*.safetensors")) + sorted(self.folder.glob("*.bin"))
        if not weights:
            raise EncoderError(f"{self.folder}: no diffusion_pytorch_model*.safetensors beside config.json")
        self._weights = [(p.name, p.stat().st_size) for p in weights]
        self._shared: list[Any] = [None]  # the loaded AutoencoderKLWan, shared with resized() copies

    def config(self) -> dict[str, Any]:
        vae_config = {k: v for k, v in self.vae_config.items() if not k.startswith("_")}
        return {
            "name": self.name,
            "vae_config": vae_config,
            "weights": self._weights,
            "resolution": self.resolution,
            **({"width": self.latent_width * self.spatial} if self.latent_width != self.latent_side else {}),
            "dtype": str(self.dtype),
            "posterior": "mean",
            "resize": "bilinear, align_corners=False",
        }

    def resized(self, side: int, width: int) -> WanVAEEncoder:
        """The same VAE (the same weights, loaded once) at another latent grid (the T-shape's wrists)."""
        other = copy.copy(self)
        other.latent_side, other.latent_width = side, width
        other.resolution = side * self.spatial
        other._shared = self._shared
        return other

    def _model(self):
        if self._shared[0] is None:
            from diffusers import AutoencoderKLWan  # the preparation and serving paths only

            try:
                vae = AutoencoderKLWan.from_pretrained(str(self.folder), torch_dtype=self.dtype)
            except (OSError, ValueError, RuntimeError) as exc:
                raise EncoderError(
                    f"{self.folder}: cannot load AutoencoderKLWan ({type(exc).__name__}: {exc})"
                ) from exc
            self._shared[0] = vae.to(self.device).eval()
        return self._shared[0]

    def video(self, frames: np.ndarray) -> torch.Tensor:
        """(T, H, W, 3) uint8 -> (1, 3, T, h*s, w*s) in [-1, 1]: resized bilinearly (align_corners False)
        frame by frame, as upstream's `_encode_obs` resizes a request's frames."""
        video = torch.from_numpy(np.ascontiguousarray(frames)).float().permute(0, 3, 1, 2)
        size = (self.resolution, self.latent_width * self.spatial)
        video = F.interpolate(video, size=size, mode="bilinear", align_corners=False)
        return (video.permute(1, 0, 2, 3).unsqueeze(0) / 255.0 * 2.0 - 1.0).to(self.device, self.dtype)

    def normalise(self, mu: torch.Tensor) -> np.ndarray:
        """The posterior mean (1, C, L, h, w) -> (L, C, h, w), normalised by the VAE config's statistics."""
        mu = (mu.float().cpu() - self.mean) / self.std
        return np.ascontiguousarray(mu[0].permute(1, 0, 2, 3).numpy(), dtype=np.float32)

    @torch.no_grad()
    def encode(self, frames: np.ndarray) -> np.ndarray:
        """The whole video through diffusers' AutoencoderKLWan.encode (training's latents)."""
        vae = self._model()
        used = usable_frames(frames.shape[0], self.temporal)
        mu = vae.encode(self.video(frames[:used])).latent_dist.mean  # (1, C, L, h, w)
        return self.normalise(mu)

    def stream(self) -> _WanStream:
        return _WanStream(self)


class _WanStream(_Stream):
    """The causal encoder's feature cache for one episode (diffusers' `feat_cache` / `feat_idx`, the
    mechanism upstream's WanVAEStreamingWrapper drives): frame 0 alone, then one encoder call per group of
    t frames, as AutoencoderKLWan._encode walks a whole video, so a stream equals `encode`."""

    def __init__(self, enc: WanVAEEncoder):
        super().__init__(enc.temporal)
        self.enc = enc
        self.vae = enc._model()
        convs = sum(1 for m in self.vae.encoder.modules() if type(m).__name__ == "WanCausalConv3d")
        self.cache: list[Any] = [None] * convs

    def _save(self) -> Any:
        return list(self.cache)  # the encoder replaces entries, never writes into a cached tensor

    def _restore(self, saved: Any) -> None:
        self.cache = saved

    @torch.no_grad()
    def _encode(self, frames: np.ndarray, first: bool) -> np.ndarray:
        x = self.enc.video(frames)
        patch = getattr(self.vae.config, "patch_size", None)
        if patch is not None:
            from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

            x = patchify(x, patch_size=patch)
        bounds = ([(0, 1)] if first else []) + [
            (s, s + self.temporal) for s in range(1 if first else 0, x.shape[2], self.temporal)
        ]
        outs = [self.vae.encoder(x[:, :, a:b], feat_cache=self.cache, feat_idx=[0]) for a, b in bounds]
        enc = self.vae.quant_conv(torch.cat(outs, dim=2))
        return self.enc.normalise(enc[:, : self.enc.channels])  # (mu, logvar): the mean


ENCODERS = ("patch_mean", "wan_vae")


def temporal_factor(cfg) -> int:
    """Video frames per latent frame after the first: actions_per_frame / actions_per_video_frame."""
    d = cfg.data
    return max(1, int(d.actions_per_frame) // max(1, int(getattr(d, "actions_per_video_frame", 1))))


def make_encoder(cfg, device: torch.device | None = None) -> VideoEncoder:
    """The video encoder data.encoder names, checked against the model's latent channels and the actions'
    rate (data.actions_per_frame = its temporal factor x data.actions_per_video_frame)."""
    d, m = cfg.data, cfg.model
    width = int(getattr(m, "latent_width", 0) or 0)
    per_video = int(getattr(d, "actions_per_video_frame", 1))
    if d.encoder == "patch_mean":
        return PatchMeanEncoder(m.latent_channels, m.latent_size, temporal_factor(cfg), width=width)
    if d.encoder == "wan_vae":
        if not d.vae_path:
            raise EncoderError(
                "data.encoder=wan_vae needs data.vae_path: the Wan2.2 VAE folder (the released model's vae/)"
            )
        enc = WanVAEEncoder(d.vae_path, m.latent_size, device, width)
        if enc.channels != m.latent_channels:
            raise EncoderError(
                f"{enc.folder / 'config.json'}: z_dim {enc.channels} != model.latent_channels "
                f"{m.latent_channels}; set model.latent_channels={enc.channels}"
            )
        if enc.temporal * per_video != d.actions_per_frame:
            raise EncoderError(
                f"{enc.folder / 'config.json'}: the VAE makes one latent frame per {enc.temporal} video "
                f"frames, so with data.actions_per_video_frame={per_video} data.actions_per_frame must be "
                f"{enc.temporal * per_video}, not {d.actions_per_frame}"
            )
        return enc
    raise EncoderError(f"data.encoder={d.encoder!r} is not a known encoder (known: {', '.join(ENCODERS)})")
