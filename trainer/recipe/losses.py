"""Flow matching (rectified flow), as LingBot-VA trains both streams.

    x_s = (1 - s) x + s e        s in [0, 1] per frame, e ~ N(0, I)
    target = e - x               the velocity the model predicts
Losses (the reference's compute_loss in wan_va/train.py): squared error weighted per (sample, frame) by the
schedule's training weight (trainer/recipe/draws.py), summed per frame, divided by the frame's element count
(actions: used channels only), averaged over (sample, frame).
"""

from __future__ import annotations

import torch


def _per_frame(sigma: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B, F) sigmas broadcast against a (B, F, ...) tensor."""
    return sigma.reshape(*sigma.shape, *([1] * (like.dim() - sigma.dim())))


def add_noise(x: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    s = _per_frame(sigma, x)
    return (1 - s) * x + s * noise


def velocity_target(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    return noise - x


def sample_sigmas(shape, generator: torch.Generator, shift: float = 1.0) -> torch.Tensor:
    """Uniform sigmas with the SD3/Wan time shift (shift > 1 puts more weight on noisy levels)."""
    s = torch.rand(shape, generator=generator)
    return shift * s / (1 + (shift - 1) * s)


def latent_loss(
    pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """pred/target (B, F, C, H, W), weights (B, F): weighted squared error summed per frame, divided by
    the frame's element count (+1e-6, as the reference), then the mean over (sample, frame)."""
    err = (pred.float() - target.float()).square()
    if weights is not None:
        err = err * _per_frame(weights.float(), err)
    per_frame = err.flatten(2)
    return (per_frame.sum(dim=2) / (per_frame.shape[2] + 1e-6)).mean()


def action_loss(
    pred: torch.Tensor,
    target: torch.Tensor,
    channel_mask: torch.Tensor,
    actions_per_frame: int,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """pred/target (B, F * actions_per_frame, A); channel_mask broadcastable to them, 1 on used channels;
    weights (B, F). Per frame: weighted squared error over its action steps and used channels, divided by
    their count (+1e-6, as the reference); then the mean over (sample, frame)."""
    b, n, a = pred.shape
    frames = n // actions_per_frame
    mask = channel_mask.to(torch.float32).expand(b, n, a)
    err = (pred.float() - target.float()).square() * mask
    if weights is not None:
        err = err * weights.float().repeat_interleave(actions_per_frame, dim=1)[..., None]
    per_frame = err.reshape(b, frames, -1).sum(-1) / (mask.reshape(b, frames, -1).sum(-1) + 1e-6)
    return per_frame.mean()
