"""The episodes an evaluation runs on, exactly as training sees them, and the sampler for a run config.

`load_episodes(cfg)` goes through the training data path (trainer/data/stream.py: dataset, latent cache,
BatchStream on one process, rank 0 of 1), so latents and normalised actions are the ones the model was
trained on (same normaliser, same clipping, same lead-in), and names each episode by its source file
relative to the dataset root, in the order BatchStream holds them (the manifest's used episodes with at
least data.frames latent frames, as stream.load_cached keeps them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainer.batch import ACTION_SLOTS
from trainer.data.furniturebench import DatasetError
from trainer.inference.evaluate import Episode
from trainer.inference.sampler import ChunkSampler


@dataclass
class EvalData:
    names: list[str]
    latents: list[torch.Tensor]  # [L, C, H, W] each
    actions: list[torch.Tensor]  # [L*N, A] normalised each
    normalizer: object
    slots: tuple[int, ...]
    action_mask: torch.Tensor
    prompt_emb: torch.Tensor
    empty_emb: torch.Tensor

    def select(self, names: Sequence[str]) -> list[Episode]:
        index = {n: i for i, n in enumerate(self.names)}
        return [Episode(n, self.latents[index[n]], self.actions[index[n]]) for n in names]


def _names(manifest: dict, frames: int) -> list[str]:
    return [
        ep["file"] for ep in manifest["episodes"] if ep["status"] == "used" and ep["latent_frames"] >= frames
    ]


def load_episodes(cfg) -> EvalData:
    from trainer.data.multiroot import data_roots
    from trainer.data.normalize import dataset_normalizer
    from trainer.data.prepare import data_root, ensure_cache
    from trainer.data.sources import discover_source
    from trainer.data.stream import BatchStream, ensure_dataset, load_cached

    if len(data_roots(cfg)) > 1:
        raise DatasetError(
            f"data.path={cfg.data.path}: bin/evaluate reads one dataset root; pick one with "
            "--set data.path=<root> (its held-out episodes are then that root's own split)"
        )
    log = print
    ensure_dataset(cfg)
    directory, manifest = ensure_cache(cfg, 0, 1, log)
    found = discover_source(cfg, data_root(cfg))
    latents, actions, text, _, _ = load_cached(cfg, directory, manifest, found, log)
    names = _names(manifest, cfg.data.frames)
    if not latents or len(names) != len(latents):
        raise DatasetError(f"{directory}: {len(latents)} usable episodes, {len(names)} named in its manifest")
    normalised = manifest["spec"]["encoder"] != "patch_mean"
    normalizer = dataset_normalizer(cfg, manifest, directory)
    stream = BatchStream(cfg, 0, 1, latents, actions, text, normalised=normalised, normalizer=normalizer)
    grid = tuple(stream.latents[0].shape[1:])
    m = cfg.model
    if grid[0] != m.latent_channels:
        raise DatasetError(
            f"{directory}: latents have {grid[0]} channels, the model takes {m.latent_channels} "
            "(evaluate with the data config the model was trained on)"
        )
    return EvalData(
        names=names,
        latents=[x.float() for x in stream.latents],
        actions=list(stream.actions),
        normalizer=stream.normalizer,
        slots=tuple(list(cfg.data.action_slots or ACTION_SLOTS)[: m.action_used]),
        action_mask=stream.action_mask,
        prompt_emb=stream.text_emb,
        empty_emb=stream.empty_emb,
    )


def make_sampler(model, cfg, data: EvalData) -> ChunkSampler:
    grid = tuple(data.latents[0].shape[1:])
    return ChunkSampler(model, cfg.infer, data.action_mask, data.prompt_emb, data.empty_emb, video_grid=grid)
