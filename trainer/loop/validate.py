"""Held-out validation losses: how well the model fits episodes it never trained on.

    result = evaluate(rig, step)      # collective: every rank calls it at the same step; None: no split
    result.to_json()                  # {step, latent_loss, action_loss, loss, clips, episodes, seconds}

What is scored: every held-out episode (trainer/data/split.py, data.val_episodes) cut into
non-overlapping clips of data.frames latent frames from frame 0 (BatchStream.val_clips), one clip per
forward (B = 1), with the training loss (WorldModel.forward: trainer/recipe/losses.py, weighted by
the recipe's loss weights), averaged over clips.

Fixed draws: each clip's recipe draws (trainer/recipe/draws.py draw_micro_batch: flow levels, noise, chunk and
window) come from a generator seeded by (VAL_SEED, the episode's split key, the clip's first frame),
never by train.seed, the step or the rank, and never from a global RNG. So the same checkpoint scores the
same on every run, every rank count and every evaluation, and scores of different checkpoints differ only
by their weights. The text is never dropped and the history is clean (text_dropout and
noisy_history_prob are 0 here): the model is scored as it is used.

Rank counts: clip i is scored by rank i % world_size; each rank's sums (float64) meet in one all_reduce.
Ranks with fewer clips run a padding forward (its result is dropped) because FSDP's all-gathers are
collective. Nothing here touches training state: no grad, no global RNG, the data stream's training
order is a pure function of the step, and the FSDP parameters are resharded afterwards as a step leaves
them, so training after an evaluation continues bit for bit as without it (tests/test_validate.py).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from trainer.data.split import split_key
from trainer.recipe.batch import CleanBatch
from trainer.recipe.draws import EmptyText, draw_micro_batch

VAL_SEED = 0x7A11D  # fixed: never train.seed, so different runs score on the same draws


@dataclass(frozen=True)
class Validation:
    """The held-out losses of the model at `step` (means over `clips` clips of `episodes` episodes)."""

    step: int
    latent_loss: float
    action_loss: float
    clips: int
    episodes: int
    seconds: float

    @property
    def loss(self) -> float:
        return self.latent_loss + self.action_loss

    def metric(self, name: str) -> float:
        """checkpoint.best_by's value: val_action_loss, val_latent_loss or val_loss."""
        return {"val_action_loss": self.action_loss, "val_latent_loss": self.latent_loss}.get(name, self.loss)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "loss": self.loss}

    def metrics(self) -> dict[str, float]:
        """The keys added to the step's metrics.jsonl record (TensorBoard: val/<name>)."""
        return {
            "val_latent_loss": self.latent_loss,
            "val_action_loss": self.action_loss,
            "val_loss": self.loss,
            "val_s": self.seconds,
        }

    def describe(self) -> str:
        return (
            f"held-out at step {self.step}: latent_loss {self.latent_loss:.4f} | action_loss "
            f"{self.action_loss:.4f} ({self.clips} clips of {self.episodes} held-out episodes, "
            f"{self.seconds:.1f} s)"
        )


def clip_generator(name: str, start: int) -> torch.Generator:
    """The generator of one held-out clip's draws: (VAL_SEED, episode, first latent frame) only."""
    key = int(split_key(name)[:15], 16)
    state = np.random.SeedSequence([VAL_SEED, key, int(start)]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def val_batch(stream, episode: int, start: int) -> dict[str, torch.Tensor]:
    """One held-out clip with its fixed draws (CPU tensors, a full micro-batch of B = 1)."""
    recipe = dataclasses.replace(stream.cfg.recipe, text_dropout=0.0, noisy_history_prob=0.0)
    empty = EmptyText(emb=stream.empty_emb, mask=stream.empty_mask)
    clean = cast(CleanBatch, stream.clip_batch(episode, start))
    drawn = draw_micro_batch(recipe, clean, empty, clip_generator(stream.names[episode], start))
    return cast(dict[str, torch.Tensor], dict(drawn))


def _reshard(model: torch.nn.Module) -> None:
    """Leave the parameters sharded, as a training step leaves them."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def evaluate(rig, step: int) -> Validation | None:
    """Collective: the held-out losses at `step` (None when nothing is held out or checkpoint.validate
    is off). Timed as the step breakdown's `eval` phase."""
    stream, device = rig.stream, rig.device
    clips = stream.val_clips() if rig.cfg.checkpoint.validate else []
    if not clips:
        return None
    started = time.perf_counter()
    world, rank = rig.world_size, rig.rank
    sums = torch.zeros(3, dtype=torch.float64)  # latent, action, clips
    with rig.breakdown.phase("eval"), torch.no_grad():
        for i in range(math.ceil(len(clips) / world)):
            index = i * world + rank
            episode, start = clips[index] if index < len(clips) else clips[0]  # padding: FSDP's collectives
            batch = {k: v.to(device) for k, v in val_batch(stream, episode, start).items()}
            out = rig.model(batch)
            if index < len(clips):
                sums += torch.tensor(
                    [float(out["latent_loss"]), float(out["action_loss"]), 1.0], dtype=torch.float64
                )
        _reshard(rig.model)
        reduced = sums.to(device)
        dist.all_reduce(reduced)
    latent, action, count = reduced.cpu().tolist()
    return Validation(
        step=step,
        latent_loss=latent / count,
        action_loss=action / count,
        clips=int(count),
        episodes=len({e for e, _ in clips}),
        seconds=time.perf_counter() - started,
    )


__all__ = ["VAL_SEED", "Validation", "clip_generator", "evaluate", "val_batch"]
