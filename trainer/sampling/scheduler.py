"""The flow-matching sampling schedule of inference (the reference's FlowMatchScheduler at inference).

n steps: sigmas s_i = linspace(1, 0, n + 1)[:-1] shifted by shift * s / (1 + (shift - 1) s) (sigma_min 0,
extra_one_step), timesteps t_i = 1000 s_i; an Euler step moves x by v * (s_{i+1} - s_i), with s_n = 0.
The denoising loop then runs one more pass at t = 0 (`loop_timesteps`) whose only use is to write the final
sample into the KV cache; with `exec_steps` = k (the reference's video_exec_step) the loop stops after the
first k timesteps of that padded list instead and every one of them, the last included, takes a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FlowSchedule:
    sigmas: torch.Tensor  # (n,) float32, decreasing from 1
    num_train_timesteps: int = 1000

    @classmethod
    def make(cls, steps: int, shift: float, num_train_timesteps: int = 1000) -> FlowSchedule:
        if steps < 1:
            raise ValueError(f"a sampling schedule needs >= 1 step, got {steps}")
        s = torch.linspace(1.0, 0.0, steps + 1)[:-1]
        return cls(shift * s / (1 + (shift - 1) * s), num_train_timesteps)

    @property
    def timesteps(self) -> torch.Tensor:
        return self.sigmas * self.num_train_timesteps

    def loop_timesteps(self, exec_steps: int = -1) -> list[float]:
        """The denoising loop's timesteps: the schedule, then 0 (the cache pass); or its first exec_steps."""
        padded = [float(t) for t in self.timesteps] + [0.0]
        return padded if exec_steps == -1 else padded[:exec_steps]

    def step(self, velocity: torch.Tensor, index: int, sample: torch.Tensor) -> torch.Tensor:
        """Euler step from schedule index `index` to the next sigma (0 after the last)."""
        sigma = self.sigmas[index]
        nxt = self.sigmas[index + 1] if index + 1 < len(self.sigmas) else torch.tensor(0.0)
        return sample + velocity * (nxt - sigma)
