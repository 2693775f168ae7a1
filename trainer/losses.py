"""Flow matching (rectified flow), as LingBot-VA trains both streams.

    x_s = (1 - s) x + s e        s in [0, 1] per frame, e ~ N(0, I)
    target = e - x               the velocity the model predicts
Losses are MSE normalised per frame (then averaged over frames), the action loss over used channels only.
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


def latent_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """pred/target (B, F, C, H, W): mean squared error per frame, then mean over frames."""
    err = (pred.float() - target.float()).square()
    return err.flatten(2).mean(dim=2).mean()


def action_loss(pred: torch.Tensor, target: torch.Tensor, channel_mask: torch.Tensor, actions_per_frame: int):
    """pred/target (B, F * actions_per_frame, A); channel_mask (A,) 1 for used channels.

    Per frame: squared error summed over its action steps and used channels, divided by their count.
    """
    b, n, a = pred.shape
    mask = channel_mask.to(torch.float32).expand(b, n, a)
    err = (pred.float() - target.float()).square() * mask
    frames = n // actions_per_frame
    per_frame = err.reshape(b, frames, -1).sum(-1) / mask.reshape(b, frames, -1).sum(-1).clamp_min(1)
    return per_frame.mean()
