"""Our side of the inference parity: run ChunkSampler on a golden case's inputs, as the upstream client did.

`run_case(model, meta, tensors, name)` -> {"chunk<k>.<latents|actions_norm|actions_robot>": tensor};
`compare(...)` -> the max abs difference of each against the upstream's values in the fixture.
"""

from __future__ import annotations

import torch

from trainer.config import InferConfig
from trainer.data.normalize import QuantileNormalizer
from trainer.recipe.batch import ACTION_SLOTS
from trainer.sampling.sampler import ChunkSampler, to_robot_units


def run_case(model, meta: dict, tensors: dict, name: str, kv_cache: bool = True) -> dict[str, torch.Tensor]:
    c = meta["cases"][name]
    f, n = meta["frames_per_chunk"], meta["actions_per_frame"]
    icfg = InferConfig(
        frames_per_chunk=f,
        window=c["window"],
        video_steps=c["video_steps"],
        action_steps=c["action_steps"],
        video_shift=c["video_shift"],
        action_shift=c["action_shift"],
        guidance=c["guidance"],
        action_guidance=c["action_guidance"],
        video_exec_step=c["video_exec_step"],
        kv_cache=kv_cache,
    )
    t = {k[len(name) + 4 :]: v for k, v in tensors.items() if k.startswith(f"{name}.in.")}
    norm = QuantileNormalizer(t["q01"].numpy(), t["q99"].numpy())
    mask = torch.zeros(model.cfg.model.action_dim, dtype=torch.bool)
    mask[list(ACTION_SLOTS)] = True
    real = t["real_latents"]
    executed = torch.zeros(t["real_actions"].shape[0], mask.numel())
    executed[:, list(ACTION_SLOTS)] = torch.from_numpy(norm.normalize(t["real_actions"].numpy(), clip=1.5))
    sampler = ChunkSampler(
        model, icfg, mask, t["prompt_emb"], t["empty_emb"], video_grid=tuple(real.shape[1:])
    )
    out = {}
    for k in range(c["chunks"]):
        chunk = sampler.sample(
            first_latent=real[0] if k == 0 else None,
            latent_noise=t["video_noise"][k],
            action_noise=t["action_noise"][k],
        )
        out[f"chunk{k}.latents"] = chunk.latents
        out[f"chunk{k}.actions_norm"] = chunk.actions
        out[f"chunk{k}.actions_robot"] = torch.from_numpy(to_robot_units(chunk.actions, norm, ACTION_SLOTS))
        if k + 1 < c["chunks"]:
            sl = slice(k * f, (k + 1) * f)
            sampler.observe(real[sl], executed[k * f * n : (k + 1) * f * n])
    return out


def compare(model, meta: dict, tensors: dict, name: str, kv_cache: bool = True) -> dict[str, float]:
    ours = run_case(model, meta, tensors, name, kv_cache)
    return {k: float((v - tensors[f"{name}.out.{k}"]).abs().max()) for k, v in ours.items()}
