"""A diverged run says so: non-finite losses and gradients found at the step's one collective, the first
rank and quantity named, the policy `train.nonfinite` applied, loss spikes made visible, and checkpoints
that never carry divergence.

    slots = local_slots(latent_sum, action_sum, rank, world_size)  # device tensor, no host sync
    # trainer.loop.train._agree appends the slots to the step's existing all_reduce (no extra collective)
    found = blame(step, reduced_slots, losses, grad_norm)   # Diverged | None, the same on every rank
    action = policy.decide(found)                           # APPLY | SKIP | STOP
    warning = spikes.observe(step, grad_norm)               # a WARNING line when grad_norm spikes

Blame: each rank sets a slot per own quantity (its latent and action loss summed over its micro-batches);
after the sum every rank sees which ranks' own values were non-finite. The reported rank is the lowest
such rank; a rank whose own losses are finite is never blamed (the reduced loss is non-finite on every
rank as soon as one is). A non-finite grad_norm with every loss finite is blamed on no single rank: the
norm is reduced over shards that the reduce-scatter has already mixed. That no checkpoint carries a
non-finite value is trainer/checkpoint/finite.py's (a save refuses; a resume checks).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

import torch

from trainer.outcomes import Diverged

APPLY, SKIP, STOP = "apply", "skip", "stop"
QUANTITIES = ("latent_loss", "action_loss")  # per-rank slots, in this order


def local_slots(
    latent_sum: torch.Tensor, action_sum: torch.Tensor, rank: int, world_size: int
) -> torch.Tensor:
    """len(QUANTITIES) x world_size slots, 1.0 where this rank's own value is non-finite (no host sync)."""
    slots = torch.zeros(len(QUANTITIES) * world_size, device=latent_sum.device, dtype=latent_sum.dtype)
    own = torch.stack([latent_sum, action_sum])
    slots[len(QUANTITIES) * rank : len(QUANTITIES) * (rank + 1)] = (~torch.isfinite(own)).to(slots.dtype)
    return slots


def _word(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def blame(step: int, slots: list[float], losses: dict[str, float], grad_norm: float) -> Diverged | None:
    """The step's non-finite finding from the reduced slots, or None when every value is finite."""
    values = {"latent_loss": losses["latent_loss"], "action_loss": losses["action_loss"]}
    values["grad_norm"] = grad_norm
    per = len(QUANTITIES)
    for index, flag in enumerate(slots):
        if flag > 0:
            rank, quantity = divmod(index, per)
            name = QUANTITIES[quantity]
            return Diverged(step, name, _word(values[name]), rank, values)
    if not math.isfinite(grad_norm):
        return Diverged(step, "grad_norm", _word(grad_norm), None, values)
    return None


class NonfinitePolicy:
    """train.nonfinite: stop (the first non-finite step ends the run) or skip (no update for that step,
    and the run stops as `stop` does once more than train.nonfinite_max_skips steps in a row were)."""

    def __init__(self, mode: str, max_skips: int):
        self.mode, self.max_skips = mode, max_skips
        self.in_a_row = 0
        self.skipped: list[int] = []

    def decide(self, found: Diverged | None) -> str:
        if found is None:
            self.in_a_row = 0
            return APPLY
        if self.mode == "skip" and self.in_a_row < self.max_skips:
            self.in_a_row += 1
            self.skipped.append(found.step)
            return SKIP
        found.policy, found.skipped = self.mode, len(self.skipped)
        return STOP

    def skip_note(self, found: Diverged) -> str:
        """The WARNING for a step whose update was skipped (the data position still advances)."""
        where = f"on rank {found.rank}" if found.rank is not None else "on every rank"
        return (
            f"WARNING: step {found.step}: {found.quantity} is {found.value} {where}: optimizer step skipped "
            f"(train.nonfinite=skip, {self.in_a_row} in a row, at most {self.max_skips})"
        )


class SpikeWatch:
    """The largest grad_norm and its step, and a WARNING when grad_norm exceeds `factor` x the running
    median of the last `window` finite values (after `warmup` of them; factor 0 turns warnings off)."""

    def __init__(self, factor: float, window: int = 50, warmup: int = 5):
        self.factor, self.warmup = factor, warmup
        self.recent: deque[float] = deque(maxlen=window)
        self.max_value: float | None = None
        self.max_step: int | None = None

    def observe(self, step: int, grad_norm: float) -> str | None:
        if not math.isfinite(grad_norm):
            return None
        if self.max_value is None or grad_norm > self.max_value:
            self.max_value, self.max_step = grad_norm, step
        warning = None
        if self.factor > 0 and len(self.recent) >= self.warmup:
            median = statistics.median(self.recent)
            if grad_norm > self.factor * median:
                warning = (
                    f"WARNING: step {step}: grad_norm {grad_norm:.4g} is {grad_norm / median:.1f}x its "
                    f"running median {median:.4g} (train.grad_spike_factor={self.factor:g}): the run may "
                    "be diverging; consider a lower train.lr"
                )
        self.recent.append(grad_norm)
        return warning

    def peak(self) -> dict[str, Any] | None:
        return {"value": self.max_value, "step": self.max_step} if self.max_value is not None else None
