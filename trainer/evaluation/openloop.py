"""Open-loop evaluation on demonstrations: predict each next chunk's actions from the real history.

For each episode (latents [L, C, H, W] and the normalised actions [L*N, A] the model trains on, as
trainer/data/stream.py's BatchStream holds them), as a robot client drives the reference's server:

    chunk 0: sample conditioned on the observed frame 0  -> frames 1..F-1 are predictions
    then:    observe the demonstration's real frames and executed actions of that chunk (history),
             sample the next chunk                       -> all F frames are predictions
    ... until fewer than F frames are left (the tail is not evaluated; counted in `frames_skipped`).

Scored on the predicted frames: the action error against the demonstration per channel, normalised and in
robot units (the normaliser's de-normalisation of the same normalised values), grouped for FurnitureBench's
8 channels (position dx dy dz, rotation qx qy qz qw, gripper); and the latent error of the generated video
against the real latents. The noise of chunk k of episode e is drawn from a generator seeded by
(seed, e, k): the numbers are reproducible and comparable across checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trainer.sampling.rundata import Episode
from trainer.sampling.sampler import ChunkSampler, seeded

FURNITURE_CHANNELS = ("dx", "dy", "dz", "qx", "qy", "qz", "qw", "grip")
FURNITURE_GROUPS = {"position": (0, 1, 2), "rotation": (3, 4, 5, 6), "gripper": (7,)}


@dataclass
class _Errors:
    """Sums of absolute / squared errors per robot channel, and the latent error sums."""

    norm_abs: np.ndarray
    robot_abs: np.ndarray
    norm_sq: np.ndarray
    actions: int = 0
    latent_abs: float = 0.0
    latent_sq: float = 0.0
    latent_values: int = 0
    chunks: int = 0
    frames: int = 0
    frames_skipped: int = 0

    @classmethod
    def zeros(cls, channels: int) -> _Errors:
        return cls(np.zeros(channels), np.zeros(channels), np.zeros(channels))


def _score(err: _Errors, pred: torch.Tensor, real: torch.Tensor, slots, normalizer) -> None:
    p, r = pred[:, list(slots)].double().numpy(), real[:, list(slots)].double().numpy()
    err.norm_abs += np.abs(p - r).sum(0)
    err.norm_sq += ((p - r) ** 2).sum(0)
    err.robot_abs += np.abs(normalizer.denormalize(p) - normalizer.denormalize(r)).sum(0)
    err.actions += p.shape[0]


def evaluate_episode(
    sampler: ChunkSampler, ep: Episode, index: int, seed: int, slots, normalizer, err, trace=None
) -> None:
    """Score one episode into `err`; with `trace` (a list), append per chunk (first action row, predicted
    and recorded robot-unit actions [rows, len(slots)]) for plots.py."""
    f, n = sampler.icfg.frames_per_chunk, sampler.model.apf
    chunks = ep.latents.shape[0] // f
    err.frames_skipped += ep.latents.shape[0] - chunks * f
    if ep.prompt_emb is not None:
        sampler.set_prompt(ep.prompt_emb)
    sampler.reset()
    for k in range(chunks):
        frames = slice(k * f, (k + 1) * f)
        chunk = sampler.sample(
            first_latent=ep.latents[0] if k == 0 else None, generator=seeded(seed, index, k)
        )
        start = 1 if k == 0 else 0  # chunk 0's frame 0 is the observation (and zero actions)
        real_lat = ep.latents[frames][start:]
        diff = chunk.latents[start:].cpu() - real_lat
        err.latent_abs += float(diff.abs().sum())
        err.latent_sq += float((diff**2).sum())
        err.latent_values += diff.numel()
        real_act = ep.actions[k * f * n : (k + 1) * f * n][start * n :]
        _score(err, chunk.actions[start * n :].cpu(), real_act, slots, normalizer)
        if trace is not None:
            pred = chunk.actions[start * n :].cpu()[:, list(slots)].double().numpy()
            real = real_act[:, list(slots)].double().numpy()
            trace.append(((k * f + start) * n, normalizer.denormalize(pred), normalizer.denormalize(real)))
        err.chunks += 1
        err.frames += f - start
        if k + 1 < chunks:
            sampler.observe(ep.latents[frames], ep.actions[k * f * n : (k + 1) * f * n])


def summarise(err: _Errors, channel_names: Sequence[str]) -> dict:
    count = max(err.actions, 1)
    norm, robot = err.norm_abs / count, err.robot_abs / count
    out: dict = {
        "chunks": err.chunks,
        "frames": err.frames,
        "frames_skipped": err.frames_skipped,
        "actions": err.actions,
        "action_mae_norm": float(norm.mean()),
        "action_rmse_norm": float(np.sqrt(err.norm_sq.sum() / (count * len(norm)))),
        "per_channel": {
            name: {"mae_norm": float(a), "mae_robot": float(b)}
            for name, a, b in zip(channel_names, norm, robot, strict=True)
        },
        "latent_mae": err.latent_abs / max(err.latent_values, 1),
        "latent_mse": err.latent_sq / max(err.latent_values, 1),
    }
    if tuple(channel_names) == FURNITURE_CHANNELS:
        out["groups"] = {
            g: {"mae_norm": float(norm[list(i)].mean()), "mae_robot": float(robot[list(i)].mean())}
            for g, i in FURNITURE_GROUPS.items()
        }
    return out


def evaluate_open_loop(
    sampler: ChunkSampler,
    episodes: Sequence[Episode],
    slots: Sequence[int],
    normalizer,
    seed: int = 0,
    traces: dict | None = None,
) -> dict:
    """Open-loop scores over `episodes` (all of them together, and per episode); with `traces` (a dict),
    each episode's chunks by name (see evaluate_episode)."""
    names = channel_names(slots)
    total = _Errors.zeros(len(slots))
    per_episode = {}
    for index, ep in enumerate(episodes):
        err = _Errors.zeros(len(slots))
        trace: list | None = None if traces is None else traces.setdefault(ep.name, [])
        evaluate_episode(sampler, ep, index, seed, slots, normalizer, err, trace)
        per_episode[ep.name] = summarise(err, names)
        for field in ("norm_abs", "robot_abs", "norm_sq"):
            setattr(total, field, getattr(total, field) + getattr(err, field))
        for field in (
            "actions",
            "latent_abs",
            "latent_sq",
            "latent_values",
            "chunks",
            "frames",
            "frames_skipped",
        ):
            setattr(total, field, getattr(total, field) + getattr(err, field))
    return {"episodes": len(episodes), "overall": summarise(total, names), "per_episode": per_episode}


def channel_names(slots: Sequence[int]) -> tuple[str, ...]:
    return FURNITURE_CHANNELS if len(slots) == len(FURNITURE_CHANNELS) else tuple(f"ch{i}" for i in slots)
