"""The LingBot-VA attention mask over one packed micro-batch, as a FlexAttention mask_mod.

Token order in the packed sequence (all samples of the micro-batch concatenated, as LingBot-VA's
`forward_train` does): [noisy video | clean video | noisy action | clean action | padding]. Inside each
group, samples follow each other, and inside a sample tokens are frame-major.

Every token carries three ids:
  seq_id    which sample it belongs to (packing); -1 for padding
  block_id  2k for video chunk k, 2k+1 for action chunk k (chunk = frames_per_chunk frames)
  noise_id  NOISY (0) or CLEAN (1); -1 for padding

A query may attend a key when they are in the same sample, within the sliding window
(|block_q - block_kv| <= window), and one of:
  clean -> clean  block-causal          block_kv <= block_q
  noisy -> clean  strictly earlier      block_kv <  block_q
  noisy -> noisy  same block only       block_kv == block_q
Clean tokens never see noisy ones. Padding sees nothing and is seen by nothing.

The same mask_mod serves both backends: FlexAttention turns it into a BlockMask, the sdpa backend
evaluates it on a broadcast index grid (`dense_mask`), so the two cannot drift apart.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from trainer.data.encoding import views

NOISY = 0
CLEAN = 1
PAD = -1


@dataclass(frozen=True)
class SequenceShape:
    """How many tokens of each kind one sample contributes to the packed sequence."""

    frames: int  # video (latent) frames per sample
    tokens_per_frame: int  # video tokens per frame after patchify
    actions_per_frame: int  # action tokens per video frame

    @property
    def video_tokens(self) -> int:
        return self.frames * self.tokens_per_frame

    @property
    def action_tokens(self) -> int:
        return self.frames * self.actions_per_frame

    def tokens(self, batch_size: int) -> int:
        """Real (unpadded) tokens of a packed micro-batch: noisy + clean, video + action."""
        return 2 * batch_size * (self.video_tokens + self.action_tokens)

    def padded_tokens(self, batch_size: int, block: int) -> int:
        n = self.tokens(batch_size)
        return n + (-n) % block


@dataclass
class TokenLayout:
    """Per-token ids of one packed micro-batch (1-D long tensors of the padded length)."""

    seq_ids: torch.Tensor
    block_ids: torch.Tensor
    noise_ids: torch.Tensor
    frame_ids: torch.Tensor  # frame index inside its sample (for positions/timesteps); -1 for padding
    sections: tuple[
        int, int, int, int, int
    ]  # lengths: noisy video, clean video, noisy action, clean action, pad

    @property
    def length(self) -> int:
        return int(self.seq_ids.numel())


def _group_ids(batch_size: int, frames: int, per_frame: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """seq ids and frame ids of one token group, samples after each other, frame-major inside."""
    seq = torch.arange(batch_size, device=device).repeat_interleave(frames * per_frame)
    frame = torch.arange(frames, device=device).repeat_interleave(per_frame).repeat(batch_size)
    return seq, frame


def token_layout(
    shape: SequenceShape,
    batch_size: int,
    frames_per_chunk: int | torch.Tensor,
    pad_to: int,
    device: torch.device | str = "cpu",
) -> TokenLayout:
    """Ids for a packed micro-batch of `batch_size` samples, padded to a multiple of `pad_to`.

    frames_per_chunk may be a 0-d tensor (already on `device`), so a per-step choice costs no host sync.
    """
    v_seq, v_frame = _group_ids(batch_size, shape.frames, shape.tokens_per_frame, device)
    a_seq, a_frame = _group_ids(batch_size, shape.frames, shape.actions_per_frame, device)
    v_block = torch.div(v_frame, frames_per_chunk, rounding_mode="floor") * 2
    a_block = torch.div(a_frame, frames_per_chunk, rounding_mode="floor") * 2 + 1
    real = 2 * (v_seq.numel() + a_seq.numel())
    pad = (-real) % pad_to

    def cat(noisy_v, clean_v, noisy_a, clean_a, pad_value):
        parts = [
            noisy_v,
            clean_v,
            noisy_a,
            clean_a,
            torch.full((pad,), pad_value, dtype=torch.long, device=device),
        ]
        return torch.cat([p.long() for p in parts])

    zeros_v, zeros_a = torch.zeros_like(v_seq), torch.zeros_like(a_seq)
    return TokenLayout(
        seq_ids=cat(v_seq, v_seq, a_seq, a_seq, PAD),
        block_ids=cat(v_block, v_block, a_block, a_block, PAD),
        noise_ids=cat(zeros_v + NOISY, zeros_v + CLEAN, zeros_a + NOISY, zeros_a + CLEAN, PAD),
        frame_ids=cat(v_frame, v_frame, a_frame, a_frame, PAD),
        sections=(v_seq.numel(), v_seq.numel(), a_seq.numel(), a_seq.numel(), pad),
    )


def lingbot_mask_mod(layout: TokenLayout, window: int | torch.Tensor):
    """The mask_mod(b, h, q_idx, kv_idx) -> bool of the LingBot-VA rules (see module docstring)."""
    seq, block, noise = layout.seq_ids, layout.block_ids, layout.noise_ids

    def mask_mod(b, h, q_idx, kv_idx):
        sq, skv = seq[q_idx], seq[kv_idx]
        bq, bkv = block[q_idx], block[kv_idx]
        nq, nkv = noise[q_idx], noise[kv_idx]
        clean_to_clean = (nq == CLEAN) & (nkv == CLEAN) & (bkv <= bq)
        noisy_to_clean = (nq == NOISY) & (nkv == CLEAN) & (bkv < bq)
        noisy_to_noisy = (nq == NOISY) & (nkv == NOISY) & (bkv == bq)
        same_sample = (sq == skv) & (sq >= 0)
        in_window = (bq - bkv).abs() <= window
        return (clean_to_clean | noisy_to_clean | noisy_to_noisy) & same_sample & in_window

    return mask_mod


def dense_mask(mask_mod, length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Evaluate a mask_mod on the full (length, length) grid: True where a query may attend a key."""
    q_idx = torch.arange(length, device=device)[:, None]
    kv_idx = torch.arange(length, device=device)[None, :]
    zero = torch.zeros((), dtype=torch.long, device=device)
    return mask_mod(zero, zero, q_idx, kv_idx)


@functools.lru_cache(maxsize=64)
def mask_density(shape: SequenceShape, batch_size: int, frames_per_chunk: int, window: int) -> float:
    """Mean number of attended keys per real query token (for the FLOP count), once per shape: a dense
    mask of the whole micro-batch (4,224 tokens squared at the cluster config), built for every plan row."""
    layout = token_layout(shape, batch_size, frames_per_chunk, pad_to=1)
    allowed = dense_mask(lingbot_mask_mod(layout, window), layout.length)
    return float(allowed.sum()) / layout.length


def sequence_shape(cfg) -> SequenceShape:
    """The run's per-sample shape: each camera view is encoded separately and the views composed into
    one grid (trainer/data/encoding/views.py grid: data.layout), so a latent frame holds (H / patch) x
    (W / patch) tokens (2 square views side by side at the cluster config: 2,176 real tokens per group,
    4,224 per micro-batch)."""
    hh, ww = views.grid(cfg)
    return SequenceShape(
        frames=cfg.data.frames,
        tokens_per_frame=(hh // cfg.model.patch) * (ww // cfg.model.patch),
        actions_per_frame=cfg.data.actions_per_frame,
    )
