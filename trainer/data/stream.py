"""The training batch stream: FurnitureBench episodes -> cached latents -> deterministic micro-batches.

    stream = build_stream(cfg, rank, world_size)
    batch = stream.micro_batch(step, micro)      # dict of CPU tensors, see BATCH_KEYS

No hidden state: micro-batch (step, micro) on `rank` is a pure function of (seed, step, micro, rank), so
resuming at step N needs only N. Sample order: the global sample counter
    g = ((step * grad_accum + micro) * world_size + rank) * batch_size + b
walks an epoch permutation of all clips (torch.randperm seeded by (seed, epoch)); ranks take
neighbouring counters, so within a step they never share a clip, and epochs follow each other.

The noise, the flow-matching sigmas and the per-step chunk size / window choices are drawn here too,
so the model's forward is deterministic given the batch.
"""

from __future__ import annotations

import fcntl
import functools
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from trainer.data.encoder import encoded_episode, make_encoder
from trainer.data.furniturebench import DatasetError, episode_files
from trainer.data.generate import generate_dataset
from trainer.data.normalize import QuantileNormalizer
from trainer.losses import sample_sigmas
from trainer.masks import SequenceShape, sequence_shape

REPO_ROOT = Path(__file__).resolve().parents[2]
NOISY_HISTORY_SIGMA = (0.0, 0.5)  # range of the noise put on clean history when augmenting
SIGMA_SHIFT = 1.0  # Wan/SD3 time shift for training sigmas (1.0 = uniform)

BATCH_KEYS = {
    "latents": "(B, F, C, S, S) float32 clean video latents, per-channel standardised",
    "actions": "(B, F*apf, action_dim) float32 actions in [-1, 1] (quantile-normalised), zero-padded",
    "action_mask": "(action_dim,) float32, 1 on used channels",
    "latent_noise": "(B, F, C, S, S) float32 N(0, 1)",
    "action_noise": "(B, F*apf, action_dim) float32 N(0, 1)",
    "history_noise": "(B, F, C, S, S) float32 N(0, 1), noise for the clean-history augmentation",
    "latent_sigma": "(B, F) float32 flow-matching level per video frame",
    "action_sigma": "(B, F) float32 flow-matching level per frame's actions",
    "history_sigma": "(B, F) float32 noise on the clean video history (0 unless augmenting)",
    "frames_per_chunk": "() int64 frames per interleaved chunk for this step",
    "window": "() int64 sliding window in blocks for this step",
    "sample_index": "(B,) int64 global clip index (episode-major), for checks and logs",
}


def resolve_data_path(cfg) -> Path:
    path = Path(cfg.data.path).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


@contextmanager
def _dataset_lock(root: Path):
    """Serialise generation and cache building across ranks (and concurrent runs) on one machine."""
    root.parent.mkdir(parents=True, exist_ok=True)
    lock_path = root.parent / f".{root.name}.lock"
    try:
        handle = open(lock_path, "a")
    except OSError:
        yield  # read-only location: nothing will be written there either
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_dataset(cfg) -> list[Path]:
    """Episode files of cfg.data.task under cfg.data.path, generating them first when allowed."""
    root, task = resolve_data_path(cfg), cfg.data.task
    files = episode_files(root, task)
    if files:
        return files
    if not cfg.data.generate_if_missing:
        raise DatasetError(
            f"{root}: {task}/*.pkl: no episodes (data.generate_if_missing is off); generate some with "
            f"`python -m trainer.data.generate {root} --episodes N --task {task}` or fix data.path"
        )
    with _dataset_lock(root):
        files = episode_files(root, task)  # another rank may have generated meanwhile
        if not files:
            if root.exists() and any(root.iterdir()):
                raise DatasetError(
                    f"{root}: {task}/*.pkl: the directory exists but holds no {task} episodes; "
                    f"point data.path elsewhere or set data.task to a furniture it holds"
                )
            generate_dataset(
                root, cfg.data.generated_episodes, cfg.data.generated_length, task, cfg.train.seed
            )
            files = episode_files(root, task)
    return files


def _seeded(*parts: int) -> torch.Generator:
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class BatchStream:
    def __init__(self, cfg, rank: int, world_size: int, latents: list[np.ndarray], actions: list[np.ndarray]):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world size {world_size}")
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.shape: SequenceShape = sequence_shape(cfg)
        self.apf = cfg.data.actions_per_frame
        self.batch_size, self.grad_accum, self.seed = (
            cfg.train.batch_size,
            cfg.train.grad_accum,
            cfg.train.seed,
        )
        frames, span = cfg.data.frames, cfg.data.frames * self.apf

        # per-channel standardisation of the latents (LingBot-VA scales VAE latents by their mean/std)
        stacked = np.concatenate(latents)
        self.latent_mean = stacked.mean(axis=(0, 2, 3), keepdims=True)[0]
        self.latent_std = stacked.std(axis=(0, 2, 3), keepdims=True)[0] + 1e-6
        self.normalizer = QuantileNormalizer.fit(np.concatenate(actions))
        self.latents = [torch.from_numpy((x - self.latent_mean) / self.latent_std).float() for x in latents]
        adim, used = cfg.model.action_dim, cfg.model.action_used
        if used > actions[0].shape[1]:
            raise DatasetError(
                f"{resolve_data_path(cfg)}: actions: episodes have {actions[0].shape[1]} action channels, "
                f"model.action_used={used} wants more"
            )
        self.actions = []
        for a in actions:  # the first `used` channels, normalised, zero-padded to the model's action_dim
            padded = np.zeros((a.shape[0], adim), np.float32)
            padded[:, :used] = self.normalizer.normalize(a)[:, :used]
            self.actions.append(torch.from_numpy(padded))
        self.action_mask = torch.zeros(adim)
        self.action_mask[:used] = 1.0

        # every clip: `frames` video frames every `apf` steps starting at `start`, and the span actions
        self.clips = [
            (e, start)
            for e, a in enumerate(actions)
            for start in range(0, a.shape[0] - span + 1)
            if start + (frames - 1) * self.apf < latents[e].shape[0]
        ]
        if not self.clips:
            raise DatasetError(
                f"{resolve_data_path(cfg)}: actions: no episode has {span} actions "
                f"(data.frames={frames} x {self.apf} actions per frame); use shorter clips or longer episodes"
            )
        self.tokens_per_micro_batch = self.shape.tokens(self.batch_size)
        self.sequence_length = self.shape.padded_tokens(self.batch_size, cfg.model.attn_block)

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

    def mask_choices(self, step: int) -> tuple[int, int]:
        """(frames_per_chunk, window) for a step; the same on every rank and micro-step of that step."""
        d = self.cfg.data
        g = _seeded(self.seed, 0xC4C, step)
        chunk = (
            d.chunk_choices[int(torch.randint(len(d.chunk_choices), (), generator=g))]
            if d.chunk_choices
            else d.frames_per_chunk
        )
        window = (
            d.window_choices[int(torch.randint(len(d.window_choices), (), generator=g))]
            if d.window_choices
            else d.window
        )
        return int(chunk), int(window)

    def micro_batch(self, step: int, micro: int) -> dict[str, torch.Tensor]:
        idx = self.sample_indices(step, micro)
        frames = self.cfg.data.frames
        lat, act = [], []
        for i in idx:
            e, start = self.clips[i]
            lat.append(self.latents[e][start : start + frames * self.apf : self.apf])
            act.append(self.actions[e][start : start + frames * self.apf])
        latents, actions = torch.stack(lat), torch.stack(act)
        g = _seeded(self.seed, step, micro, self.rank)
        b = len(idx)
        history = torch.zeros(b, frames)
        augment = torch.rand(b, generator=g) < self.cfg.data.noisy_history_prob
        lo, hi = NOISY_HISTORY_SIGMA
        history_draw = lo + (hi - lo) * torch.rand(b, frames, generator=g)
        history = torch.where(augment[:, None], history_draw, history)
        chunk, window = self.mask_choices(step)
        return {
            "latents": latents,
            "actions": actions,
            "action_mask": self.action_mask.clone(),
            "latent_noise": torch.randn(latents.shape, generator=g),
            "action_noise": torch.randn(actions.shape, generator=g),
            "history_noise": torch.randn(latents.shape, generator=g),
            "latent_sigma": sample_sigmas((b, frames), g, SIGMA_SHIFT),
            "action_sigma": sample_sigmas((b, frames), g, SIGMA_SHIFT),
            "history_sigma": history,
            "frames_per_chunk": torch.tensor(chunk, dtype=torch.long),
            "window": torch.tensor(window, dtype=torch.long),
            "sample_index": torch.tensor(idx, dtype=torch.long),
        }

    def describe(self) -> str:
        return (
            f"{len(self.latents)} episodes, {len(self.clips)} clips of {self.cfg.data.frames} frames x "
            f"{self.apf} actions; {self.tokens_per_micro_batch} tokens per micro-batch "
            f"(padded to {self.sequence_length})"
        )


def build_stream(cfg, rank: int, world_size: int) -> BatchStream:
    """Make sure the dataset exists (generating it if allowed), encode/cache latents, build the stream."""
    files = ensure_dataset(cfg)
    root = resolve_data_path(cfg)
    encoder = make_encoder(cfg.data.encoder, cfg.model.latent_channels, cfg.model.latent_size)
    cache_root = root / ".latents" if cfg.data.latent_cache else None
    with _dataset_lock(root) if cache_root is not None else _no_lock():
        pairs = [encoded_episode(f, encoder, cfg.data.camera, cache_root) for f in files]
    return BatchStream(cfg, rank, world_size, [p[0] for p in pairs], [p[1] for p in pairs])


@contextmanager
def _no_lock():
    yield
