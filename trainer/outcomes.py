"""The typed records of why a run failed, beyond a rank's error: Diverged (non-finite values, found by
loop/divergence.py on the ranks) and Hung (no step for too long, found by the launcher's stall detector,
trainer/launcher/stall.py). trainer/attempt.py carries them in the rank records, hung.node<N>.json and
summary.json; this module only defines them (it imports nothing of the project).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of `data` that are fields of dataclass `cls` (older or newer writers may differ)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _fmt(value: float) -> str:
    return f"{value:.4g}"


@dataclass
class Diverged:
    """A run stopped on non-finite values (trainer/loop/divergence.py finds them): carried by the rank records
    and summary.json (`diverged`); its line() is the launcher's one line."""

    step: int
    quantity: str  # latent_loss | action_loss | grad_norm | the tensor a refused checkpoint save named
    value: str  # nan | inf | -inf
    rank: int | None  # the first rank whose own value is non-finite; None: no single rank's (grad_norm)
    values: dict[str, float]  # the step's reduced latent_loss, action_loss, grad_norm
    policy: str = "stop"  # train.nonfinite
    skipped: int = 0  # steps skipped before this one (train.nonfinite=skip)
    last_finite_checkpoint: dict[str, Any] | None = None  # {step, path}; every saved checkpoint is finite

    def line(self) -> str:
        where = (
            f"on rank {self.rank}" if self.rank is not None else "on every rank (their own losses are finite)"
        )
        order = ("latent_loss", "action_loss", "grad_norm")  # fixed: the JSON round trip sorts keys
        named = sorted(self.values.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 3)
        others = ", ".join(f"{k} {_fmt(v)}" for k, v in named if k != self.quantity)
        ckpt = self.last_finite_checkpoint
        if ckpt is not None:
            last = f"the last finite checkpoint is {Path(ckpt['path']).name}"
            again = f"run the same command again (it resumes from step {ckpt['step']}) --set train.lr=<lower>"
        else:
            last, again = "no checkpoint was saved before it", "start again with --set train.lr=<lower>"
        skipped = f" after {self.skipped} skipped step(s) (train.nonfinite=skip)" if self.skipped else ""
        return (
            f"diverged at step {self.step}{skipped}: {self.quantity} is {self.value} {where} ({others}); "
            f"{last}; fix: lower train.lr / check the data / {again}"
        )

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Diverged | None:
        try:
            return cls(**known_fields(cls, data)) if isinstance(data, dict) else None
        except TypeError:
            return None


@dataclass
class Hung:
    """hung.node<N>.json and summary.json's `hung`: what the launcher's stall detector saw on one node."""

    node: int
    line: str  # the one line it said: how long without a step, the median step time, the silent ranks
    last_step: int | None  # the last step any rank completed (None: none in this attempt)
    silent_ranks: list[int]
    stalled_s: float  # seconds without a completed step when it fired
    limit_s: float
    median_step_s: float | None
    stack_files: dict[str, str]  # rank -> file with its Python stacks (py-spy dump)
    innermost: dict[str, str]  # rank -> its main thread's innermost frame, one line each
    stopped_ranks: list[int] = field(default_factory=list)  # ranks the OS reported stopped (SIGSTOP)
    policy: str = "fail"  # fail | requeue (config hang.policy, resolved)
    requeue: str | None = None  # what came of the requeue (None: not asked)
