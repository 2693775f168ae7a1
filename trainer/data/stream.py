"""The training batch stream: FurnitureBench episodes -> the latent cache -> deterministic micro-batches.

    stream = build_stream(cfg, rank, world_size)
    batch = stream.micro_batch(step, micro)      # dict of CPU tensors: trainer/recipe/batch.py's MicroBatch
    stream.data_summary                          # DatasetSummary: found/used/skipped, stand-ins

build_stream: generate a dataset if data.path is empty and allowed (ensure_dataset), make sure the latent
cache is complete and current (trainer/data/cache/prepare.py ensure_cache: rank 0 prepares a missing one, the
others wait; a stale one is refused naming what differs), then load it.

Clips follow the encoder's time layout (trainer/data/encoding/encoder.py). Rows are actions (row r leads from
observation r to r+1); video frames are rows 0, a, 2a, ... (a = data.actions_per_video_frame, only those
encoded). Latent frame 0 is row 0 alone; frame k >= 1 covers video frames (k-1)t+1 .. kt (t: the encoder's
temporal factor). Its N = t a = data.actions_per_frame actions lead into it: rows (k-1)N .. kN-1, every row
(upstream's frame_stride * 4); frame 0 gets N zero actions, normalised like the rest (`_action_post_process`).
Clips: data.frames latent frames; views composed by views.py; data.relative_poses applied at load (poses.py).

No hidden state: micro-batch (step, micro) on `rank` is a pure function of (seed, step, micro, rank), so
resuming at step N needs only N. Sample order: g = ((step * grad_accum + micro) * world_size + rank) * B + b
walks an epoch permutation of all clips (torch.randperm seeded by (seed, epoch)); ranks take
neighbouring counters, so within a step they never share a clip, and epochs follow each other. Every
random draw of the recipe is made by one call per micro-batch (recipe/draws.py draw_micro_batch) from a
generator seeded by (seed, step, micro, rank).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np
import torch

from trainer.data.cache.location import resolve_data_path
from trainer.data.cache.manifest import read_entry
from trainer.data.cache.store import cache_dir
from trainer.data.encoding import views
from trainer.data.formats.discovery import SKIP_TOO_SHORT, DatasetSummary, Discovery
from trainer.data.formats.furniturebench import DatasetError
from trainer.data.formats.sources import discover_source, ensure_dataset, missing_episodes
from trainer.data.normalize import QuantileNormalizer, dataset_normalizer
from trainer.data.poses import check_normalize, episode_actions
from trainer.data.short import short_episodes, split_with_short
from trainer.data.split import SplitError
from trainer.model.masks import SequenceShape, sequence_shape
from trainer.recipe.batch import ACTION_SLOTS, CleanBatch
from trainer.recipe.draws import EmptyText, draw_micro_batch

ACTION_CLIP = 1.5  # reference _action_post_process; recipe.action_clip when the recipe config exists

BATCH_KEYS = {
    "latents": "(B, F, C, H, W) float32 clean video latents, the views composed (views.grid: data.layout)",
    "actions": "(B, F*apf, action_dim) float32 quantile-normalised, clipped, robot channels in their slots",
    "action_mask": "(action_dim,) bool, True on used slots",
    "text_emb": "(B, L, text_dim) float32 the task prompt's embedding, zero-padded",
    "text_mask": "(B, L) bool True on real prompt tokens",
    "sample_index": "(B,) int64 global clip index (episode-major), for checks and logs",
    "...": "the recipe's draws: see recipe/batch.py (sigmas, noise, history, chunk/window, text_dropped)",
}


def _seeded(*parts: int) -> torch.Generator:
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class BatchStream:
    def __init__(
        self,
        cfg,
        rank: int,
        world_size: int,
        latents: list[np.ndarray],
        actions: list[np.ndarray],
        text: dict[str, np.ndarray] | None = None,
        normalised: bool = False,
        data_summary: DatasetSummary | None = None,
        names: list[str] | None = None,
        held_out: Sequence[str] = (),
        normalizer=None,
    ):
        """latents[e]: (L_e, C, H, W) per episode (views already composed); actions[e]: (T_e, K).

        names[e]: episode e's stable identifier (its path in the cache manifest); episodes named in
        `held_out` (trainer/data/split.py) give no training clip: they are in `val_episodes` for
        trainer/loop/validate.py. Statistics (latent standardisation, action quantiles) come from the training
        episodes only and are applied to the held-out ones."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world size {world_size}")
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.data_summary = data_summary
        self.shape: SequenceShape = sequence_shape(cfg)
        self.apf = t = cfg.data.actions_per_frame
        self.batch_size, self.grad_accum, self.seed = (
            cfg.train.batch_size,
            cfg.train.grad_accum,
            cfg.train.seed,
        )
        frames = cfg.data.frames

        train = self._split(len(latents), names, held_out)
        # (mean, std) per channel of the stand-in's standardisation, for encoding new frames (bin/serve)
        self.latent_stats: tuple[np.ndarray, np.ndarray] | None = None
        if normalised:  # VAE latents, normalised by the VAE's own statistics (as the reference)
            self.latents = [torch.from_numpy(np.ascontiguousarray(x)) for x in latents]
        else:  # stand-in latents: per-channel standardisation by the training episodes' statistics
            stacked = np.concatenate([latents[e].astype(np.float32) for e in train])
            mean = stacked.mean(axis=(0, 2, 3), keepdims=True)[0]
            std = stacked.std(axis=(0, 2, 3), keepdims=True)[0] + 1e-6
            self.latents = [torch.from_numpy((x.astype(np.float32) - mean) / std) for x in latents]
            self.latent_stats = (mean, std)
        # data.normalize fit: quantiles of the training episodes; else the dataset's own (build_stream)
        self.normalizer = normalizer or QuantileNormalizer.fit(np.concatenate([actions[e] for e in train]))
        adim, used = cfg.model.action_dim, cfg.model.action_used
        if used > actions[0].shape[1]:
            raise DatasetError(
                f"{resolve_data_path(cfg)}: actions: episodes have {actions[0].shape[1]} action channels, "
                f"model.action_used={used} wants more"
            )
        slots = list(cfg.data.action_slots or ACTION_SLOTS)[:used]  # the 30-channel layout's channels
        clip = float(getattr(getattr(cfg, "recipe", None), "action_clip", ACTION_CLIP))
        self.actions = []
        for e, a in enumerate(actions):
            n = self.latents[e].shape[0] * t  # t zero actions lead into latent frame 0
            raw = np.concatenate([np.zeros((t, a.shape[1]), np.float32), a])[:n]
            padded = np.zeros((n, adim), np.float32)
            padded[:, slots] = self.normalizer.normalize(raw, clip=clip)[:, :used]
            self.actions.append(torch.from_numpy(padded))
        self.action_mask = torch.zeros(adim, dtype=torch.bool)
        self.action_mask[slots] = True

        self._set_text(text)

        # every training clip: `frames` consecutive latent frames and their frames * t actions
        self.clips = [(e, s) for e in train for s in range(0, self.latents[e].shape[0] - frames + 1)]
        if not self.clips:
            raise DatasetError(
                f"{resolve_data_path(cfg)}: no episode has {frames} latent frames "
                f"(data.frames={frames}, one latent frame per {t} actions); "
                "use shorter clips or longer episodes"
            )
        self.tokens_per_micro_batch = self.shape.tokens(self.batch_size)
        self.sequence_length = self.shape.padded_tokens(self.batch_size, cfg.model.attn_block)

    def _set_text(self, text: dict[str, np.ndarray] | None) -> None:
        """The prompt embedding (zeros without one), the empty prompt, and the per-episode tasks if any."""
        cfg = self.cfg
        if text is None:
            dim = int(getattr(cfg.model, "text_dim", 4096))
            zeros = np.zeros((cfg.data.text_length, dim), np.float32)
            mask = np.zeros(cfg.data.text_length, bool)
            text = dict(prompt_emb=zeros, prompt_mask=mask, empty_emb=zeros, empty_mask=mask)
        self.text_emb = torch.from_numpy(np.ascontiguousarray(text["prompt_emb"], dtype=np.float32))
        self.text_mask = torch.from_numpy(np.ascontiguousarray(text["prompt_mask"], dtype=bool))
        self.empty_emb = torch.from_numpy(np.ascontiguousarray(text["empty_emb"], dtype=np.float32))
        self.empty_mask = torch.from_numpy(np.ascontiguousarray(text["empty_mask"], dtype=bool))
        self.task_emb = self.task_mask = None  # per-episode prompts (LeRobot tasks): (K, L, D), (K, L)
        if "episode_task" in text:
            self.task_emb = torch.from_numpy(np.ascontiguousarray(text["task_emb"], dtype=np.float32))
            self.task_mask = torch.from_numpy(np.ascontiguousarray(text["task_mask"], dtype=bool))
            self.episode_task = [int(k) for k in text["episode_task"]]

    def _split(self, n: int, names: list[str] | None, held_out: Sequence[str]) -> list[int]:
        """Set self.names and self.held_out (episode indices); return the training episodes' indices."""
        self.names = list(names) if names is not None else [f"episode_{e}" for e in range(n)]
        unknown = sorted(set(held_out) - set(self.names))
        if unknown:
            raise DatasetError(f"held-out episode(s) not in the dataset: {', '.join(unknown[:3])}")
        self.held_out = [e for e, name in enumerate(self.names) if name in set(held_out)]
        train = [e for e in range(n) if e not in set(self.held_out)]
        if not train:
            raise DatasetError(
                f"{resolve_data_path(self.cfg)}: every episode is held out; nothing to train on"
            )
        return train

    @property
    def num_clips(self) -> int:
        return len(self.clips)

    @functools.lru_cache(maxsize=4)  # noqa: B019 - a few epochs' permutations; the stream lives as long as the run
    def _permutation(self, epoch: int) -> torch.Tensor:
        return torch.randperm(len(self.clips), generator=_seeded(self.seed, 0x5EED, epoch))

    def sample_indices(self, step: int, micro: int) -> list[int]:
        first = ((step * self.grad_accum + micro) * self.world_size + self.rank) * self.batch_size
        n = len(self.clips)
        return [int(self._permutation(g // n)[g % n]) for g in range(first, first + self.batch_size)]

    def clean_batch(self, idx: list[int]) -> dict[str, torch.Tensor]:
        frames, t = self.cfg.data.frames, self.apf
        lat, act = [], []
        for i in idx:
            e, s = self.clips[i]
            lat.append(self.latents[e][s : s + frames].float())
            act.append(self.actions[e][s * t : (s + frames) * t])
        emb, mask = self._text([self.clips[i][0] for i in idx])
        return {
            "latents": torch.stack(lat),
            "actions": torch.stack(act),
            "action_mask": self.action_mask.clone(),
            "text_emb": emb,
            "text_mask": mask,
        }

    def _text(self, episodes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L, D) prompt embeddings and (B, L) masks of these episodes (one prompt, or their tasks)."""
        if self.task_emb is None or self.task_mask is None:
            b = len(episodes)
            return self.text_emb.expand(b, -1, -1).clone(), self.text_mask.expand(b, -1).clone()
        k = torch.tensor([self.episode_task[e] for e in episodes], dtype=torch.long)
        return self.task_emb[k].clone(), self.task_mask[k].clone()

    def val_clips(self) -> list[tuple[int, int]]:
        """(episode, first latent frame) of every held-out clip: non-overlapping windows of data.frames
        from frame 0 of each held-out episode (trainer/loop/validate.py scores them), in episode order."""
        frames = self.cfg.data.frames
        return [
            (e, s) for e in self.held_out for s in range(0, self.latents[e].shape[0] - frames + 1, frames)
        ]

    def clip_batch(self, episode: int, start: int) -> dict[str, torch.Tensor]:
        """The clean batch (B = 1) of one clip of any episode, held out or not."""
        frames, t = self.cfg.data.frames, self.apf
        emb, mask = self._text([episode])
        return {
            "latents": self.latents[episode][start : start + frames].float()[None],
            "actions": self.actions[episode][start * t : (start + frames) * t][None],
            "action_mask": self.action_mask.clone(),
            "text_emb": emb,
            "text_mask": mask,
        }

    def micro_batch(self, step: int, micro: int) -> dict[str, torch.Tensor]:
        idx = self.sample_indices(step, micro)
        clean = self.clean_batch(idx)
        g = _seeded(self.seed, step, micro, self.rank)
        # every random draw of the recipe, in its documented order (trainer/recipe/draws.py)
        empty = EmptyText(emb=self.empty_emb, mask=self.empty_mask)
        drawn = draw_micro_batch(self.cfg.recipe, cast(CleanBatch, clean), empty, g)
        batch = cast(dict[str, torch.Tensor], dict(drawn))
        batch["sample_index"] = torch.tensor(idx, dtype=torch.long)
        return batch

    def describe(self) -> str:
        return (
            f"{len(self.latents)} episodes ({len(self.held_out)} held out), {len(self.clips)} training clips "
            f"of {self.cfg.data.frames} latent frames x {self.apf} actions; "
            f"{self.tokens_per_micro_batch} tokens per micro-batch (padded to {self.sequence_length})"
        )


def _log(rank: int):
    return (lambda line: print(line, flush=True)) if rank == 0 else (lambda line: None)


def load_cached(cfg, directory: Path, manifest: dict, found: Discovery, log) -> tuple:
    """(latents, actions, text, summary, names) of the used episodes of a checked cache; names are the
    episodes' manifest paths (the held-out split's identifiers); cameras composed, relative poses applied."""
    check_normalize(cfg, str(directory / "manifest.json"))
    frames, cams = cfg.data.frames, list(cfg.data.cameras)
    names: list[str] = []
    latents: list[np.ndarray] = []
    actions: list[np.ndarray] = []
    skipped: list[tuple[Path, str]] = []
    notes: Counter[str] = Counter()
    tasks: list[int] = []
    for ep in manifest["episodes"]:
        source = found.root / ep["file"]
        if ep["status"] != "used":
            skipped.append((source, ep["reason"]))
            continue
        for note in ep.get("notes", []):
            notes[note] += 1
        if ep["latent_frames"] < frames:
            skipped.append((source, SKIP_TOO_SHORT))
            continue
        z = read_entry(directory / "episodes" / ep["entry"], [f"latents__{c}" for c in cams] + ["actions"])
        latents.append(views.compose([z[f"latents__{c}"] for c in cams], views.layout_of(cfg)))
        actions.append(episode_actions(cfg, z["actions"], str(source)))
        names.append(ep["file"])
        tasks.append(int(ep.get("task_index", 0)))
    text = read_entry(directory / "text.npz", None)
    if "task_emb" in text:  # a LeRobot dataset: the prompt per episode (its task)
        text["episode_task"] = np.array(tasks, np.int64)
    spec, short = manifest["spec"], short_episodes(cfg, manifest, found.root)
    summary = DatasetSummary.of(
        found,
        short=short,
        used=len(latents),
        skipped=skipped,
        notes=dict(notes),
        encoder=spec["encoder"],
        text_encoder=spec["text_encoder"],
        stand_ins=list(manifest.get("stand_ins", [])),
        cameras=cams,
        cache=str(directory),
    )
    log(summary.describe())  # before the split: a split that fails still shows what was found
    split = split_with_short(names, cfg.data.val_episodes, short) if names else None
    summary = dataclasses.replace(summary, split=split)
    if split is not None and split["held_out"]:
        log(
            f"data: {len(split['held_out'])} of {len(names)} episodes held out, never trained on "
            f"(data.val_episodes={cfg.data.val_episodes:g}): {', '.join(split['held_out'])}"
        )
    recorded = manifest.get("split")
    if split is not None and recorded is not None and recorded.get("val_episodes") == cfg.data.val_episodes:
        if recorded.get("held_out") != split["held_out"]:  # the same rule on the same episodes: a bug
            raise DatasetError(
                f"{directory}/manifest.json: records held-out episodes {recorded.get('held_out')}, this run "
                f"computes {split['held_out']} for data.val_episodes={cfg.data.val_episodes:g}"
            )
    for note, n in notes.items():
        log(f"data: {n} episode(s): {note}")
    if summary.stand_ins:
        from trainer.data.cache.prepare import announce

        announce(log, summary.stand_ins)
    return latents, actions, text, summary, names


def build_stream(cfg, rank: int, world_size: int, should_stop=None) -> BatchStream:
    """Dataset and latent cache made sure of (rank 0 prepares; should_stop: see ensure_cache), loaded."""
    from trainer.data.cache.prepare import data_root, ensure_cache
    from trainer.data.formats.multiroot import data_roots

    log = _log(rank)
    if len(data_roots(cfg)) > 1:  # several LeRobot roots: one cache each, one stream
        return _several_roots(cfg, rank, world_size, log, should_stop)
    ensure_dataset(cfg)
    tmp: Path | None = None
    if not cfg.data.latent_cache:
        tmp = Path(tempfile.mkdtemp(prefix="lingbot-latents-"))
        log(f"data: data.latent_cache is off: encoding into a temporary cache {tmp} (removed after loading)")
        cfg = copy.deepcopy(cfg)
        cfg.data.cache_dir = str(tmp)
    try:
        # A temporary cache is private to this rank (its own mkdtemp): the rank encodes it alone, with no
        # collective, instead of waiting on rank 0's copy that it cannot see (a stop: at the first step).
        directory, manifest = (
            ensure_cache(cfg, 0, 1, log) if tmp else ensure_cache(cfg, rank, world_size, log, should_stop)
        )
        found = discover_source(cfg, data_root(cfg))
        try:
            latents, actions, text, summary, names = load_cached(cfg, directory, manifest, found, log)
        except SplitError as exc:
            raise SplitError(f"{found.root}: {exc}") from exc
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if not latents:
        raise DatasetError(f"{summary.root}: no usable episodes: {summary.describe()}")
    return BatchStream(
        cfg,
        rank,
        world_size,
        latents,
        actions,
        text,
        normalised=manifest["spec"]["encoder"] != "patch_mean",
        data_summary=summary,
        names=names,
        held_out=summary.split["held_out"] if summary.split else (),
        normalizer=dataset_normalizer(cfg, manifest, directory),
    )


def _several_roots(cfg, rank: int, world_size: int, log, should_stop) -> BatchStream:
    from trainer.data.cache.prepare import announce, ensure_cache
    from trainer.data.formats.multiroot import combine, data_roots, for_root

    parts = []
    for root in data_roots(cfg):
        one = for_root(cfg, root)
        ensure_dataset(one)
        directory, manifest = ensure_cache(one, rank, world_size, log, should_stop)
        found = discover_source(one, root)
        parts.append((*load_cached(one, directory, manifest, found, lambda line: None), manifest))
    latents, actions, text, summary, names, normalised = combine(cfg, parts, log)
    announce(log, summary.stand_ins)
    held = summary.split["held_out"] if summary.split else ()
    return BatchStream(cfg, rank, world_size, latents, actions, text, normalised, summary, names, held)


__all__ = [
    "BatchStream",
    "build_stream",
    "cache_dir",
    "ensure_dataset",
    "missing_episodes",
    "resolve_data_path",
]
