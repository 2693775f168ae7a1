"""The reference training recipe's random draws and its flow-matching schedule (upstream 58c2ae5).

    batch = draw_micro_batch(cfg.recipe, clean, EmptyText(emb, mask), generator)   # see recipe/batch.py

Everything random about a micro-batch comes from `generator`, consumed in this fixed order:
  1. video timestep ids   rand(F)  (rand(B, F) with sigma_per=sample_frame)
  2. video noise          randn(B, F, C, H, W)
  3. noisy history        rand(1) (augment if < noisy_history_prob), rand(F) (levels), randn(B, F, C, H, W)
  4. action timestep ids  rand(F)  (rand(B, F) with sigma_per=sample_frame)
  5. action noise         randn(B, F*N, A)
  6. chunk, window        randint(chunk_min, chunk_max + 1, ()), randint(window_min, window_max + 1, ())
  7. text dropout         rand(B) < text_dropout
The history noise and levels are drawn even when the coin says "clean", so the stream's length never depends
on an outcome.

The schedule is the reference's FlowMatchScheduler(shift, sigma_min=0, extra_one_step=True) with
set_timesteps(T=1000, training=True): sigma_i = shift(1 - i/T), i = 0..T-1, timestep = 1000 sigma; a draw
u ~ U[lo, hi) picks i = floor(u T). Loss weights are its `training_weight` table (a Gaussian bump over
timesteps, normalised to mean 1), looked up at the nearest grid timestep, as the reference does.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from trainer.recipe.batch import BatchError, CleanBatch, MicroBatch

RECIPE_CHOICES = {
    "loss_weighting": ("reference", "none"),
    "sigma_per": ("frame", "sample_frame"),
    "action_rope": ("reference", "aligned"),
}


class EmptyText(NamedTuple):
    """The empty prompt's embedding (text-condition dropout replaces a sample's prompt with it)."""

    emb: torch.Tensor  # [L, text_dim]
    mask: torch.Tensor  # [L] bool


def check_recipe(recipe) -> None:
    """Raise ValueError naming the recipe.* key that cannot be used."""
    for key, choices in RECIPE_CHOICES.items():
        if getattr(recipe, key) not in choices:
            raise ValueError(f"recipe.{key}={getattr(recipe, key)!r}: expected one of {', '.join(choices)}")
    checks = [
        (recipe.num_train_timesteps > 0, "recipe.num_train_timesteps must be > 0"),
        (recipe.video_shift > 0 and recipe.action_shift > 0, "recipe.video_shift/action_shift must be > 0"),
        (0 <= recipe.noisy_history_prob <= 1, "recipe.noisy_history_prob must be in [0, 1]"),
        (
            0 <= recipe.noisy_history_min <= recipe.noisy_history_max <= 1,
            "recipe.noisy_history_min/max must satisfy 0 <= min <= max <= 1",
        ),
        (1 <= recipe.chunk_min <= recipe.chunk_max, "recipe.chunk_min/max must satisfy 1 <= min <= max"),
        (0 <= recipe.window_min <= recipe.window_max, "recipe.window_min/max must satisfy 0 <= min <= max"),
        (0 <= recipe.text_dropout <= 1, "recipe.text_dropout must be in [0, 1]"),
        (recipe.action_clip > 0, "recipe.action_clip must be > 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def sigma_table(shift: float, steps: int = 1000) -> torch.Tensor:
    """(steps,) float32 training sigmas, largest first: shift * s / (1 + (shift - 1) s), s = 1 - i/steps."""
    with unset_fake_temporarily():  # a cached table is always real (see _real_tables)
        return _real_tables(shift, steps)[0]


def weight_table(shift: float, steps: int = 1000) -> torch.Tensor:
    """(steps,) float32 loss weights per grid timestep (the reference's `training_weight`)."""
    with unset_fake_temporarily():
        return _real_tables(shift, steps)[1]


@functools.cache
def _real_tables(shift: float, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Both tables, computed once per (shift, steps) and never under a FakeTensorMode: the plan traces a
    step under one (trainer/plan/memory.py), and a fake table cached there was read by the next real step
    in the same process (an H200's `illegal memory access`; tests/test_plan.py)."""
    s = torch.linspace(1.0, 0.0, steps + 1)[:-1]
    sigma = shift * s / (1 + (shift - 1) * s)
    x = sigma * steps
    y = torch.exp(-2 * ((x - steps / 2) / steps) ** 2)
    shifted = y - y.min()
    return sigma, shifted * (steps / shifted.sum())


def loss_weights(sigma: torch.Tensor, shift: float, steps: int, weighting: str) -> torch.Tensor:
    """Per-(sample, frame) loss weights for flow levels `sigma` [B, F] (nearest grid timestep)."""
    if weighting == "none":
        return torch.ones_like(sigma, dtype=torch.float32)
    grid = sigma_table(shift, steps).to(sigma.device) * steps
    t = sigma.float().reshape(-1) * steps
    ids = (grid[:, None] - t[None]).abs().argmin(dim=0)
    return weight_table(shift, steps).to(sigma.device)[ids].reshape(sigma.shape)


def draw_sigmas(
    shape: tuple[int, ...],
    shift: float,
    steps: int,
    generator: torch.Generator,
    lo: float = 0.0,
    hi: float = 1.0,
) -> torch.Tensor:
    """Flow levels on the grid: i = floor(u steps), u ~ U[lo, hi) (reference `sample_timestep_id`)."""
    u = torch.rand(shape, generator=generator) * (hi - lo) + lo
    ids = (u * steps).clamp(min=0, max=steps - 1).to(torch.int64)
    return sigma_table(shift, steps)[ids]


def _frame_sigmas(recipe, b: int, f: int, shift: float, g: torch.Generator, lo=0.0, hi=1.0) -> torch.Tensor:
    steps = recipe.num_train_timesteps
    if recipe.sigma_per == "frame":  # one per frame index, shared by the whole batch
        return draw_sigmas((f,), shift, steps, g, lo, hi).expand(b, f).contiguous()
    return draw_sigmas((b, f), shift, steps, g, lo, hi)


def draw_micro_batch(recipe, clean: CleanBatch, empty: EmptyText, generator: torch.Generator) -> MicroBatch:
    """The clean batch plus every random draw of the recipe (order in the module docstring)."""
    check_recipe(recipe)
    g = generator
    latents, actions = clean["latents"], clean["actions"]
    b, f = latents.shape[:2]
    latent_sigma = _frame_sigmas(recipe, b, f, recipe.video_shift, g)
    latent_noise = torch.randn(latents.shape, generator=g)
    augment = bool(torch.rand(1, generator=g)[0] < recipe.noisy_history_prob)
    lo, hi = recipe.noisy_history_min, recipe.noisy_history_max
    history_draw = _frame_sigmas(recipe, b, f, recipe.video_shift, g, lo, hi)
    history_noise = torch.randn(latents.shape, generator=g)
    history_sigma = history_draw if augment else torch.zeros_like(history_draw)
    action_sigma = _frame_sigmas(recipe, b, f, recipe.action_shift, g)
    action_noise = torch.randn(actions.shape, generator=g)
    chunk = torch.randint(recipe.chunk_min, recipe.chunk_max + 1, (), generator=g)
    window = torch.randint(recipe.window_min, recipe.window_max + 1, (), generator=g)
    dropped = torch.rand(b, generator=g) < recipe.text_dropout

    text_emb, text_mask = clean["text_emb"], clean["text_mask"]
    if bool(dropped.any()):
        if empty.emb.shape != text_emb.shape[1:] or empty.mask.shape != text_mask.shape[1:]:
            raise BatchError(
                f"empty prompt embedding {tuple(empty.emb.shape)} / mask {tuple(empty.mask.shape)} does not "
                f"match text_emb {tuple(text_emb.shape[1:])} / text_mask {tuple(text_mask.shape[1:])}"
            )
        keep = ~dropped
        text_emb = torch.where(keep[:, None, None], text_emb, empty.emb.to(text_emb.dtype)[None])
        text_mask = torch.where(keep[:, None], text_mask, empty.mask.to(text_mask.dtype)[None])

    out = dict(clean)
    out.update(
        text_emb=text_emb,
        text_mask=text_mask,
        latent_sigma=latent_sigma,
        latent_noise=latent_noise,
        history_sigma=history_sigma,
        history_noise=history_noise,
        action_sigma=action_sigma,
        action_noise=action_noise,
        frames_per_chunk=chunk,
        window=window,
        text_dropped=dropped,
    )
    return out  # type: ignore[return-value]
