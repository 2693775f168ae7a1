"""Upstream's streamed encoding as its server runs it, re-written from reading (hewu2008/lingbot-va 58c2ae5,
`wan_va/modules/utils.py` WanVAEStreamingWrapper, `wan_va/wan_va_server.py` `_encode_obs`), to hold the
project's streams to it in tests. Nothing here is imported by the product.

Per episode, one feature-cache list per VAE pass (cleared on reset). Per request, every frame of every
camera is resized bilinearly (align_corners False) to the camera's pixel size, scaled to [-1, 1], and ALL of
the request's frames go through the causal encoder in ONE call with the cache (`encode_chunk`), then
quant_conv; the posterior mean is normalised as (mu - latents_mean) * (1 / latents_std). Cameras are the
batch axis of one call and end side by side along the width; RoboTwin's T-shape (`robotwin_tshape`) encodes
the high camera in one pass and the two wrists, at half height and width, in a second pass with its own
cache, then lays the wrists side by side ABOVE the high camera.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


class UpstreamStream:
    def __init__(self, vae):
        self.vae = vae
        self.convs = sum(1 for m in vae.encoder.modules() if type(m).__name__ == "WanCausalConv3d")
        self.clear()

    def clear(self) -> None:
        self.cache: list = [None] * self.convs

    @torch.no_grad()
    def encode_chunk(self, x: torch.Tensor) -> torch.Tensor:
        from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

        if getattr(self.vae.config, "patch_size", None) is not None:
            x = patchify(x, self.vae.config.patch_size)
        return self.vae.quant_conv(self.vae.encoder(x, feat_cache=self.cache, feat_idx=[0]))


def _video(frames: list[np.ndarray], size: tuple[int, int]) -> torch.Tensor:
    """(T, H, W, 3) uint8 frames of one camera -> (1, 3, T, h, w) in [-1, 1]."""
    x = torch.from_numpy(np.stack(frames)).float().permute(3, 0, 1, 2)  # (3, T, H, W)
    x = F.interpolate(x, size=size, mode="bilinear", align_corners=False).unsqueeze(0)
    return x / 255.0 * 2.0 - 1.0


def _normalised(vae, enc: torch.Tensor) -> torch.Tensor:
    mu, _ = torch.chunk(enc, 2, dim=1)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return (mu.float() - mean) * inv_std


@torch.no_grad()
def encode_obs(streams: list[UpstreamStream], images: list[dict], cams: list[str], size: tuple[int, int],
               tshape: bool = False) -> np.ndarray:  # fmt: skip
    """One request's frames (a list of camera -> image maps) -> (L, C, H, W) latents, upstream's layout."""
    h, w = size
    if tshape:
        high = _video([im[cams[0]] for im in images], (h, w))
        wrists = torch.cat([_video([im[c] for im in images], (h // 2, w // 2)) for c in cams[1:]])
        enc_high = streams[0].encode_chunk(high)
        enc_wrists = streams[1].encode_chunk(wrists)
        enc = torch.cat([torch.cat(enc_wrists.split(1, dim=0), dim=-1), enc_high], dim=-2)
        lat = _normalised(streams[0].vae, enc)
    else:
        videos = torch.cat([_video([im[c] for im in images], (h, w)) for c in cams])
        lat = _normalised(streams[0].vae, streams[0].encode_chunk(videos))
        lat = torch.cat(lat.split(1, dim=0), dim=-1)
    return lat[0].permute(1, 0, 2, 3).numpy()
