"""The micro-batch contract between the data stream (trainer/data/stream.py) and the model (trainer/model/).

One micro-batch is a dict of tensors. The stream builds the *clean* part (`CleanBatch`) from the cache,
then makes every random draw of the training recipe with ONE call, owned by trainer/recipe/draws.py:

    from trainer.recipe.draws import EmptyText, draw_micro_batch

    empty = EmptyText(emb=empty_emb, mask=empty_mask)          # the empty prompt's T5 embedding, [L, D] / [L]
    g = _seeded(seed, step, micro, rank)                       # a fresh torch.Generator per micro-batch
    batch: MicroBatch = draw_micro_batch(cfg.recipe, clean, empty, g)
    out = model(batch)                                         # {"loss", "latent_loss", "action_loss"}

`draw_micro_batch` consumes the generator in a fixed order (documented there) and nothing else (no global
RNG), so a micro-batch is a pure function of (clean batch, generator seed) and the model's forward is
deterministic: resume stays bitwise. Keys the stream adds itself (e.g. `sample_index`) pass through.

Shapes (B samples, F latent frames, C latent channels, H x W latent grid, A = model.action_dim,
N = data.actions_per_frame, L text tokens, D = model.text_dim):

Clean part, made by the stream
  latents      float32 [B, F, C, H, W]  normalised VAE latents of the camera views, ALREADY COMBINED the way
                                        the reference combines them: the reference concatenates the views'
                                        latents along the width in `obs_cam_keys` order before the model
                                        (wan_va/dataset/lerobot_latent_dataset.py `_cat_video_latents`,
                                        env_type 'none', as its franka/libero/demo configs use), so
                                        W = views x per-view width; the model takes one combined grid.
  actions      float32 [B, F*N, A]      quantile-normalised (q01/q99 -> [-1, 1]) and clipped to
                                        +-recipe.action_clip (1.5), robot channel j in slot
                                        ACTION_SLOTS[j], zero in unused slots (reference
                                        `_action_post_process`; FurnitureBench's 8 channels dx dy dz qx qy
                                        qz qw grip -> slots 0..6 and 28, as the reference maps one arm +
                                        gripper: `used_action_channel_ids`).
  action_mask  bool    [B, F*N, A]      True on used slots (a (A,) mask broadcasts and is accepted).
  text_emb     float32 [B, L, D]        the episode's prompt embedding (T5 umt5-xxl last hidden state,
                                        zero-padded to L; the reference uses L = 512 and attends all L).
  text_mask    bool    [B, L]           True on real prompt tokens (used only with model.text_mask=true;
                                        the reference attends the zero padding too).

Random draws, made by trainer.recipe.draws.draw_micro_batch (never by the stream itself)
  latent_sigma    float32 [B, F]        flow level of each video frame; one per frame index per batch
                                        (rows equal), shifted by recipe.video_shift, on the reference's
                                        1000-step grid.
  latent_noise    float32 [B, F, C, H, W]
  history_sigma   float32 [B, F]        level of the noise on the clean history (0 = clean): with
                                        probability recipe.noisy_history_prob per batch, else zeros.
  history_noise   float32 [B, F, C, H, W]
  action_sigma    float32 [B, F]        one per frame index per batch, shifted by recipe.action_shift.
  action_noise    float32 [B, F*N, A]
  frames_per_chunk long [] (0-d)        redrawn per micro-batch from recipe.chunk_min..chunk_max
  window          long [] (0-d)         redrawn per micro-batch from recipe.window_min..window_max
  text_dropped    bool [B]              True where text_emb/text_mask were replaced by the empty prompt
                                        (probability recipe.text_dropout per sample).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

import torch

# FurnitureBench action channel j -> slot in the model's 30-wide action vector (one arm + gripper, as the
# reference's configs map a single arm: pose channels first, the gripper at slot 28).
ACTION_SLOTS: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 28)


class BatchError(ValueError):
    """A micro-batch that breaks the contract; the message names the key, the shape and what was expected."""


class CleanBatch(TypedDict):
    latents: torch.Tensor
    actions: torch.Tensor
    action_mask: torch.Tensor
    text_emb: torch.Tensor
    text_mask: torch.Tensor


class MicroBatch(CleanBatch):
    latent_sigma: torch.Tensor
    latent_noise: torch.Tensor
    history_sigma: torch.Tensor
    history_noise: torch.Tensor
    action_sigma: torch.Tensor
    action_noise: torch.Tensor
    frames_per_chunk: torch.Tensor
    window: torch.Tensor
    text_dropped: torch.Tensor
    sample_index: NotRequired[torch.Tensor]


CLEAN_KEYS: tuple[str, ...] = tuple(CleanBatch.__annotations__)
DRAW_KEYS: tuple[str, ...] = (
    "latent_sigma",
    "latent_noise",
    "history_sigma",
    "history_noise",
    "action_sigma",
    "action_noise",
    "frames_per_chunk",
    "window",
    "text_dropped",
)


def action_slot_mask(action_dim: int, used: int) -> torch.Tensor:
    """(action_dim,) bool: True on the slots FurnitureBench's first `used` channels go to."""
    if used > len(ACTION_SLOTS) or max(ACTION_SLOTS[:used]) >= action_dim:
        raise BatchError(
            f"action_slot_mask: {used} channels do not fit action_dim {action_dim} with slots {ACTION_SLOTS}"
        )
    mask = torch.zeros(action_dim, dtype=torch.bool)
    mask[list(ACTION_SLOTS[:used])] = True
    return mask


def _expect(batch: dict, key: str, shape: tuple[int | None, ...]) -> torch.Tensor:
    if key not in batch:
        raise BatchError(f"micro-batch: missing key {key!r} (see trainer/recipe/batch.py for the contract)")
    t = batch[key]
    if not isinstance(t, torch.Tensor) or t.dim() != len(shape):
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise BatchError(f"micro-batch: {key!r} has shape {got}, expected {len(shape)} dims {shape}")
    for i, (want, have) in enumerate(zip(shape, t.shape, strict=True)):
        if want is not None and want != have:
            raise BatchError(f"micro-batch: {key!r} has shape {tuple(t.shape)}, dim {i} should be {want}")
    return t


def check_clean(batch: dict, actions_per_frame: int, action_dim: int, text_dim: int) -> None:
    """Raise BatchError unless `batch` holds the clean part of the contract with consistent shapes."""
    b, f, _, _, _ = _expect(batch, "latents", (None,) * 5).shape
    _expect(batch, "actions", (b, f * actions_per_frame, action_dim))
    mask = batch.get("action_mask")
    if not (isinstance(mask, torch.Tensor) and mask.shape == (action_dim,)):
        _expect(batch, "action_mask", (b, f * actions_per_frame, action_dim))
    length = _expect(batch, "text_emb", (b, None, text_dim)).shape[1]
    _expect(batch, "text_mask", (b, length))


def check_micro_batch(batch: dict, actions_per_frame: int, action_dim: int, text_dim: int) -> None:
    """Raise BatchError unless `batch` is a complete micro-batch (clean part and every recipe draw)."""
    check_clean(batch, actions_per_frame, action_dim, text_dim)
    lat = batch["latents"]
    b, f = lat.shape[:2]
    for key in ("latent_sigma", "history_sigma", "action_sigma"):
        _expect(batch, key, (b, f))
    for key in ("latent_noise", "history_noise"):
        _expect(batch, key, tuple(lat.shape))
    _expect(batch, "action_noise", tuple(batch["actions"].shape))
    _expect(batch, "frames_per_chunk", ())
    _expect(batch, "window", ())
    _expect(batch, "text_dropped", (b,))
