"""How the cameras' latents make one latent grid: the one owner of data.layout, read by data preparation
(trainer/data/cache/prepare.py, lerobot_entries.py: each camera's encoder size), the training stream
(trainer/data/stream.py: the composed grid) and bin/serve (trainer/serving/session.py: the same grid
from streamed frames).

    view_sizes(cfg)          [(h, w), ...] each camera's latent size, in data.cameras order
    grid(cfg)                (H, W) the composed grid
    compose(latents, layout) per-camera (L, C, h, w) -> (L, C, H, W)

Layouts (data.layout):
    side_by_side  every camera at (latent_size, latent_width), laid along the width in data.cameras order
                  (upstream `_cat_video_latents`, env_type none; `_encode_obs`: the views' latents split on
                  the batch axis and concatenated on the last one)
    tshape        RoboTwin (upstream env_type robotwin_tshape, va_robotwin_cfg.py): data.cameras[0] (the high
                  camera) at full size; the others (the two wrist cameras) at half height and half width,
                  side by side, stacked ABOVE it (`_cat_video_latents`: cat([wrists, high], dim=height);
                  `_encode_obs`: the same, the wrists through a second VAE pass at height // 2, width // 2).
                  The grid is (3h/2, w).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LAYOUTS = ("side_by_side", "tshape")


def view_size(cfg) -> tuple[int, int]:
    """(h, w): one full-size view's latent grid (model.latent_size, model.latent_width or latent_size)."""
    h = int(cfg.model.latent_size)
    return h, int(getattr(cfg.model, "latent_width", 0) or h)


def view_sizes(cfg) -> list[tuple[int, int]]:
    h, w = view_size(cfg)
    cams = list(cfg.data.cameras)
    if layout_of(cfg) == "tshape":
        return [(h, w)] + [(h // 2, w // 2)] * (len(cams) - 1)
    return [(h, w)] * len(cams)


def layout_of(cfg) -> str:
    return str(getattr(cfg.data, "layout", "side_by_side"))


def grid(cfg) -> tuple[int, int]:
    """(H, W) of the composed latent grid."""
    h, w = view_size(cfg)
    if layout_of(cfg) == "tshape":
        return h + h // 2, w
    return h, w * len(cfg.data.cameras)


def compose(latents: Sequence[np.ndarray], layout: str) -> np.ndarray:
    """Per-camera latents (L, C, h_i, w_i), data.cameras order -> one (L, C, H, W) grid (see the module)."""
    n = min(int(x.shape[0]) for x in latents)
    views = [np.asarray(x[:n]) for x in latents]
    if layout == "side_by_side":
        return np.concatenate(views, axis=-1)
    if layout == "tshape":
        high, wrists = views[0], views[1:]
        top = np.concatenate(wrists, axis=-1)
        if top.shape[-1] != high.shape[-1] or any(v.shape[-2] * 2 != high.shape[-2] for v in wrists):
            raise ValueError(
                f"tshape: wrist views {[tuple(v.shape[-2:]) for v in wrists]} are not half of the high "
                f"view {tuple(high.shape[-2:])} side by side"
            )
        return np.concatenate([top, high], axis=-2)
    raise ValueError(f"data.layout={layout!r} is not a known layout (known: {', '.join(LAYOUTS)})")
