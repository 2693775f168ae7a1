"""The episodes an evaluation runs on, exactly as training sees them, and the sampler for a run config.

`load_episodes(cfg)` goes through the training data path (trainer/data/stream.py build_stream: dataset,
latent cache, BatchStream on one process, rank 0 of 1; several LeRobot roots as training combines them),
so latents and normalised actions are the ones the model was trained on (same normaliser, same clipping,
same lead-in, the same video stride, camera layout (checked against trainer/data/encoding/views.py grid) and
relative poses), and names each episode as training's split does (its source file relative to the dataset
root; `<k>:<root name>/<file>` with several roots), in the order BatchStream holds them. Each episode
carries its own prompt: a LeRobot episode's task embedding (the prompt it was trained with), else the
dataset's one prompt; the sampler is given it before the episode (trainer/evaluation/openloop.py
evaluate_episode).

`serving_inputs(cfg, text)` is what bin/serve needs of the run's data (the action normaliser, the empty
prompt, the latent grid, the stand-in latents' standardisation): from the config alone when nothing needs
the dataset (data.normalize fixed, the real VAE: a released folder served as upstream's server serves it,
the empty prompt embedded by `text`), else through `load_episodes` (`needs_dataset` says why).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainer.data.encoding import views
from trainer.data.formats.furniturebench import DatasetError
from trainer.recipe.batch import ACTION_SLOTS
from trainer.sampling.sampler import ChunkSampler


@dataclass
class Episode:
    name: str
    latents: torch.Tensor  # [L, C, H, W]
    actions: torch.Tensor  # [L*N, A] normalised, unused channels zero
    prompt_emb: torch.Tensor | None = None  # (L, D): its own prompt (a LeRobot task); None: the sampler's


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
    prompts: list[torch.Tensor] | None = None  # (L, D) per episode (LeRobot: its task); None: prompt_emb
    latent_stats: tuple | None = None  # the stand-in latents' (mean, std) per channel; None: VAE latents

    def select(self, names: Sequence[str]) -> list[Episode]:
        index = {n: i for i, n in enumerate(self.names)}
        prompts = self.prompts
        return [
            Episode(
                n,
                self.latents[index[n]],
                self.actions[index[n]],
                None if prompts is None else prompts[index[n]],
            )
            for n in names
        ]


def load_episodes(cfg) -> EvalData:
    from trainer.data.stream import build_stream

    stream = build_stream(cfg, 0, 1)
    names = list(stream.names)
    if not stream.latents or len(names) != len(stream.latents):
        raise DatasetError(f"{cfg.data.path}: {len(stream.latents)} usable episodes, {len(names)} named")
    grid = tuple(stream.latents[0].shape[1:])
    m = cfg.model
    if grid[0] != m.latent_channels or grid[1:] != views.grid(cfg):
        raise DatasetError(
            f"{cfg.data.path}: latents of {grid[0]} channels on a {grid[1]}x{grid[2]} grid, the model takes "
            f"{m.latent_channels} on {'x'.join(map(str, views.grid(cfg)))} (model.latent_channels, "
            "model.latent_size / latent_width, data.layout, data.cameras: evaluate with the data config "
            "the model was trained on)"
        )
    prompts = None
    if stream.task_emb is not None:  # LeRobot: the task of each episode
        prompts = [stream.task_emb[k].clone() for k in stream.episode_task]
    return EvalData(
        names=names,
        latents=[x.float() for x in stream.latents],
        actions=list(stream.actions),
        normalizer=stream.normalizer,
        slots=tuple(list(cfg.data.action_slots or ACTION_SLOTS)[: m.action_used]),
        action_mask=stream.action_mask,
        prompt_emb=stream.text_emb,
        empty_emb=stream.empty_emb,
        prompts=prompts,
        latent_stats=stream.latent_stats,
    )


def make_sampler(model, cfg, data: EvalData) -> ChunkSampler:
    grid = tuple(data.latents[0].shape[1:])
    return ChunkSampler(model, cfg.infer, data.action_mask, data.prompt_emb, data.empty_emb, video_grid=grid)


@dataclass
class ServingInputs:
    """What bin/serve takes from the run's data (trainer/serving/session.py load_served)."""

    normalizer: object
    slots: tuple[int, ...]
    action_mask: torch.Tensor
    empty_emb: torch.Tensor
    grid: tuple[int, int, int]  # (C, H, W) of the composed latents
    latent_stats: tuple | None  # the stand-in latents' (mean, std); None: VAE latents
    source: str  # where they came from, for the log


def needs_dataset(cfg) -> str | None:
    """Why serving cfg reads its dataset; None when the config alone gives everything."""
    if cfg.data.normalize != "fixed":
        return f"data.normalize={cfg.data.normalize}: the action statistics come from the dataset"
    if cfg.data.encoder == "patch_mean":
        return "data.encoder=patch_mean: the stand-in latents are standardised by the dataset's statistics"
    return None


def serving_inputs(cfg, text) -> ServingInputs:
    """ServingInputs from the config (see the module docstring), else from load_episodes; a DatasetError
    there says why the dataset was needed."""
    why = needs_dataset(cfg)
    if why is None:
        from trainer.data.normalize import config_normalizer

        slots = tuple(list(cfg.data.action_slots or ACTION_SLOTS)[: cfg.model.action_used])
        mask = torch.zeros(cfg.model.action_dim, dtype=torch.bool)
        mask[list(slots)] = True
        empty, _ = text.embed("")
        h, w = views.grid(cfg)
        grid = (int(cfg.model.latent_channels), int(h), int(w))
        source = "the config (data.normalize=fixed, data.encoder=wan_vae): no dataset read"
        return ServingInputs(config_normalizer(cfg), slots, mask, torch.as_tensor(empty), grid, None, source)
    try:
        data = load_episodes(cfg)
    except DatasetError as exc:
        raise DatasetError(f"{exc} (bin/serve reads the dataset because {why})") from exc
    c, h, w = (int(x) for x in data.latents[0].shape[1:])
    return ServingInputs(
        data.normalizer, data.slots, data.action_mask, data.empty_emb, (c, h, w), data.latent_stats,
        f"the dataset {cfg.data.path} ({why})",
    )  # fmt: skip
