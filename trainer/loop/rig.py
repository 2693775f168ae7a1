"""The records one rank's training passes between build, train_step, the loop and its observers.

    Rig         what trainer.loop.train.build returns: model, optimizer, schedule, stream, Checkpointer, timer
    StepOutput  what trainer.loop.train.train_step returns for one optimizer step
    LoopState   what trainer.loop.train.loop carries from step to step (and the summary reports)

Types only: no behaviour, so train.py (which fills them) and observe.py (which reports
them) both import this module and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.attempt import COMPLETED
from trainer.checkpoint.checkpointer import Checkpointer, CheckpointInfo
from trainer.checkpoint.diskspace import OutOfSpace
from trainer.config import RunConfig
from trainer.loop.divergence import APPLY, NonfinitePolicy, SpikeWatch
from trainer.loop.timing import StepBreakdown
from trainer.outcomes import Diverged


@dataclass
class Rig:
    """What build() returns: everything a step needs, and where the run resumed from."""

    cfg: RunConfig
    rank: int
    world_size: int
    device: torch.device
    model: Any  # the FSDP2-sharded WorldModel from trainer.model.parallel.build_model
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    stream: Any  # trainer.data's stream: micro_batch(step, micro), tokens_per_micro_batch
    checkpointer: Checkpointer
    breakdown: StepBreakdown
    start_step: int = 0
    resumed: CheckpointInfo | None = None
    why_fresh: str = ""


@dataclass
class StepOutput:
    latent_sum: torch.Tensor  # this rank's latent loss summed over its micro-batches (not averaged)
    action_sum: torch.Tensor
    grad_norm: float
    lr: float  # the LR this step used


@dataclass
class LoopState:
    """What the loop carries from step to step, and what the summary reports."""

    status: str = COMPLETED
    step: int = 0
    losses: dict[str, float] | None = None
    last_ckpt: CheckpointInfo | None = None
    timings: list[dict[str, float]] = field(default_factory=list)
    failure: OutOfSpace | None = None  # a write on this rank ran out of space: stop at the next safe point
    stopping: bool = False  # every rank agreed to stop after this step (a signal or a stop request)
    action: str = APPLY  # this step's update: applied, skipped or the run stops (trainer/loop/divergence.py)
    diverged: Diverged | None = None  # why the run stopped on non-finite values
    policy: NonfinitePolicy = field(default_factory=lambda: NonfinitePolicy("stop", 1))
    spikes: SpikeWatch = field(default_factory=lambda: SpikeWatch(0.0))
    notes: list[str] = field(default_factory=list)  # WARNING lines to log after this step's line
    validation: Any = None  # the last trainer.loop.validate.Validation (held-out losses), None before one
