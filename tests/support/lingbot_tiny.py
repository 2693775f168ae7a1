"""A tiny LingBot-VA for the model tests: its config, micro-batches in the trainer/recipe/batch.py contract.

The clean part is synthetic (random latents, actions in the FurnitureBench slots, random prompt embeddings);
every random draw comes from recipe/draws.py draw_micro_batch, as in training. A tiny model in the released
key layout is written with trainer.model.export_reference (real code, stand-in weights).
"""

from __future__ import annotations

import numpy as np
import torch

from trainer.config import RunConfig, apply_overrides, check_config
from trainer.recipe.batch import ACTION_SLOTS, CleanBatch, action_slot_mask
from trainer.recipe.draws import EmptyText, draw_micro_batch

TEXT_LEN = 5
VIEWS = 2  # two camera views combined along the width
TINY = {
    "model.dim": 48,
    "model.heads": 4,  # head dim 12: RoPE splits it 4 / 4 / 4
    "model.depth": 2,
    "model.ffn_dim": 96,
    "model.text_dim": 16,
    "model.freq_dim": 32,
    "model.latent_channels": 4,
    "model.latent_size": 4,
    "model.attn_block": 32,
    "data.frames": 4,
    "data.actions_per_frame": 3,
    "train.batch_size": 2,
    "train.grad_accum": 2,
}


def tiny_cfg(**overrides) -> RunConfig:
    cfg = RunConfig()
    apply_overrides(cfg, {**TINY, **overrides}, "test")
    check_config(cfg)
    return cfg


def _seeded(*parts: int) -> torch.Generator:
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def empty_text(cfg) -> EmptyText:
    return EmptyText(torch.zeros(TEXT_LEN, cfg.model.text_dim), torch.zeros(TEXT_LEN, dtype=torch.bool))


def clean_batch(cfg, batch_size: int, seed: int) -> CleanBatch:
    g = _seeded(seed, 0xC1EA)
    m, f, n = cfg.model, cfg.data.frames, cfg.data.actions_per_frame
    side = m.latent_size
    mask = action_slot_mask(m.action_dim, len(ACTION_SLOTS))
    actions = torch.randn(batch_size, f * n, m.action_dim, generator=g).clamp(-1.5, 1.5) * mask
    text_mask = torch.zeros(batch_size, TEXT_LEN, dtype=torch.bool)
    text_mask[:, :3] = True
    return {
        "latents": torch.randn(batch_size, f, m.latent_channels, side, side * VIEWS, generator=g),
        "actions": actions,
        "action_mask": mask.expand(batch_size, f * n, -1).clone(),
        "text_emb": torch.randn(batch_size, TEXT_LEN, m.text_dim, generator=g) * text_mask[..., None],
        "text_mask": text_mask,
    }


def micro_batch(cfg, batch_size: int = 2, seed: int = 0, draw_seed: int | None = None) -> dict:
    clean = clean_batch(cfg, batch_size, seed)
    return dict(
        draw_micro_batch(
            cfg.recipe, clean, empty_text(cfg), _seeded(seed if draw_seed is None else draw_seed)
        )
    )


class TinyStream:
    """micro_batch(step, micro) for one rank: a deterministic function of (step, micro, rank); with
    repeat=True the same batches every step (so a few steps visibly lower the loss)."""

    def __init__(self, cfg, rank: int = 0, repeat: bool = False):
        self.cfg, self.rank, self.repeat = cfg, rank, repeat

    def micro_batch(self, step: int, micro: int) -> dict:
        seed = ((0 if self.repeat else step) * 1000 + micro) * 10 + self.rank
        return micro_batch(self.cfg, self.cfg.train.batch_size, seed)
