"""Chunk-by-chunk action inference with a KV cache of the history, as LingBot-VA's server does it.

    sampler = ChunkSampler(model, cfg.infer, action_mask, prompt_emb, empty_emb)
    chunk = sampler.sample(first_latent=obs_latent0)      # chunk 0: frame 0 is the observed one
    sampler.observe(real_latents, executed_actions)       # history: F real frames and their actions
    sampler.set_prompt(task_emb); sampler.reset()         # another episode, with its own prompt
    chunk = sampler.sample()                              # the next chunk, through the cache
    robot = to_robot_units(chunk.actions, normalizer, slots)

One session follows the reference's VA_Server (`_reset`, `_infer`, `_compute_kv_cache`, upstream 58c2ae5):
  * rows: 1, or 2 under classifier-free guidance (guidance > 1 OR action_guidance > 1): the prompt and the
    empty prompt, each with its own cached history. (The reference makes the empty prompt's embedding only
    for video guidance and fails with guidance 1 and action guidance > 1; here both work.)
  * `sample`: the video loop (FlowSchedule(video_steps, video_shift) then a t = 0 pass that writes the
    final latents into the cache as predicted), guided as uncond + g (cond - uncond); then the action loop
    the same way (its t = 0 pass writes the actions as predicted). In the first chunk only, frame 0 is a
    conditioning frame: timestep 0, the observed latent / zero actions, re-imposed after every step. The
    unused action channels are zeroed before every action pass and at the end.
  * `observe`: drops the predicted entries, then runs the real latents and executed (normalised) actions
    at t = 0 as history (kept as real), and moves the frame position on by their frame count.
Noise is drawn from `generator` unless given explicitly (tests, parity). With infer.kv_cache off, every
pass rebuilds the cache from the recorded history inputs first (same numbers while nothing is evicted,
for timing the cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trainer.model.kv_cache import KVCache, cache_capacity
from trainer.model.streaming import stream_forward
from trainer.sampling.scheduler import FlowSchedule


@dataclass
class Chunk:
    latents: torch.Tensor  # [F, C, H, W] generated latents (frame 0 = the observation in the first chunk)
    actions: torch.Tensor  # [F*N, A] normalised actions, unused channels zero
    frame_start: int  # the chunk's first frame position


@dataclass
class _Write:
    kind: str
    x: torch.Tensor
    timesteps: torch.Tensor
    frame_start: int
    keep: str


class ChunkSampler:
    def __init__(self, model, icfg, action_mask, prompt_emb, empty_emb=None, video_grid=None):
        """action_mask (A,) bool; prompt_emb/empty_emb (L, text_dim); video_grid (C, H, W) of one frame."""
        self.model, self.icfg = model, icfg
        self.mask = torch.as_tensor(action_mask, dtype=torch.bool).reshape(-1)
        self.rows = 2 if icfg.guidance > 1 or icfg.action_guidance > 1 else 1
        if self.rows == 2 and empty_emb is None:
            raise ValueError(
                "classifier-free guidance (infer.guidance or action_guidance > 1) needs empty_emb"
            )
        texts = [prompt_emb] + ([empty_emb] if self.rows == 2 else [])
        self.device = model.patch_embedding_mlp.weight.device
        self.text = torch.stack([torch.as_tensor(t, dtype=torch.float32) for t in texts]).to(self.device)
        m = model.cfg.model
        from trainer.data.encoding.views import (
            grid,  # the composed views (data.layout), as the stream makes them
        )

        c, hh, ww = video_grid or (m.latent_channels, *grid(model.cfg))
        self.grid = (c, hh, ww)
        self.video_tokens = icfg.frames_per_chunk * (hh // m.patch) * (ww // m.patch)
        self.action_tokens = icfg.frames_per_chunk * model.apf
        self.video_schedule = FlowSchedule.make(icfg.video_steps, icfg.video_shift)
        self.action_schedule = FlowSchedule.make(icfg.action_steps, icfg.action_shift)
        self.reset()

    def set_prompt(self, prompt_emb) -> None:
        """The conditional row's prompt from now on (the empty prompt row stays); reset() before use."""
        self.text[0] = torch.as_tensor(prompt_emb, dtype=torch.float32).to(self.device)

    def reset(self) -> None:
        self.frame = 0
        self.cache = self._empty_cache()
        self.history: list[_Write] = []

    def _empty_cache(self) -> KVCache:
        m = self.model
        capacity = cache_capacity(self.icfg.window, self.video_tokens, self.action_tokens)
        dtype = m.patch_embedding_mlp.weight.dtype
        return KVCache.empty(len(m.blocks), self.rows, capacity, m.heads, m.head_dim, dtype, self.device)

    # -- the model, through the cache ----------------------------------------------------------------
    def _pass(self, kind: str, x: torch.Tensor, timesteps: torch.Tensor, keep: str) -> torch.Tensor:
        rows = (self.rows,) + (-1,) * (x.dim() - 1)
        write = _Write(kind, x.expand(rows).clone(), timesteps[None].expand(self.rows, -1), self.frame, keep)
        if not self.icfg.kv_cache:
            self.cache = self._empty_cache()
            for old in self.history:
                self._forward(old)
        out = self._forward(write)
        if keep != "none":
            self.history.append(write)
        return out

    def _forward(self, w: _Write) -> torch.Tensor:
        return stream_forward(
            self.model, w.kind, w.x, w.timesteps, w.frame_start, self.text, self.cache, w.keep
        )

    @staticmethod
    def _guided(velocity: torch.Tensor, scale: float) -> torch.Tensor:
        if scale > 1:
            return velocity[1:] + scale * (velocity[:1] - velocity[1:])
        return velocity[:1]

    # -- one chunk ---------------------------------------------------------------------------------
    def sample(
        self,
        first_latent: torch.Tensor | None = None,
        latent_noise: torch.Tensor | None = None,
        action_noise: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Chunk:
        """The next chunk. first_latent [C, H, W] (the observation) is required for the first chunk."""
        f, n, a = self.icfg.frames_per_chunk, self.model.apf, self.mask.numel()
        first = self.frame == 0
        if first and first_latent is None:
            raise ValueError("the first chunk is conditioned on an observation: pass first_latent [C, H, W]")
        if latent_noise is None:
            latent_noise = torch.randn(f, *self.grid, generator=generator)
        if action_noise is None:
            action_noise = torch.randn(f * n, a, generator=generator)
        cond = first_latent.to(self.device, torch.float32) if first_latent is not None and first else None
        latents = self._video_loop(latent_noise.to(self.device, torch.float32)[None].clone(), cond)
        actions = self._action_loop(action_noise.to(self.device, torch.float32)[None].clone(), first)
        return Chunk(latents[0], actions[0], self.frame)

    def _timesteps(self, t: float, first: bool) -> torch.Tensor:
        ts = torch.full((self.icfg.frames_per_chunk,), t, dtype=torch.float32, device=self.device)
        if first:
            ts[0] = 0.0
        return ts

    def _video_loop(self, x: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
        sched, exec_steps = self.video_schedule, self.icfg.video_exec_step
        loop = sched.loop_timesteps(exec_steps)
        for i, t in enumerate(loop):
            last = i == len(loop) - 1
            if cond is not None:
                x[:, 0] = cond
            v = self._pass("video", x, self._timesteps(t, cond is not None), "pred" if last else "none")
            if not last or exec_steps != -1:
                x = sched.step(self._guided(v, self.icfg.guidance), min(i, len(sched.sigmas) - 1), x)
            if cond is not None:
                x[:, 0] = cond
        return x

    def _action_loop(self, x: torch.Tensor, first: bool) -> torch.Tensor:
        sched, n = self.action_schedule, self.model.apf
        loop = sched.loop_timesteps()
        for i, t in enumerate(loop):
            last = i == len(loop) - 1
            if first:
                x[:, :n] = 0.0
            x[..., ~self.mask] = 0.0
            v = self._pass("action", x, self._timesteps(t, first), "pred" if last else "none")
            if not last:
                x = sched.step(self._guided(v, self.icfg.action_guidance), i, x)
            if first:
                x[:, :n] = 0.0
        x[..., ~self.mask] = 0.0
        return x

    # -- history -----------------------------------------------------------------------------------
    def drop_predicted(self) -> None:
        """Forget the last chunk's predicted entries (before its real frames arrive, or a re-sample)."""
        self.cache.drop_predicted()
        self.history = [w for w in self.history if w.keep != "pred"]

    def observe(self, latents: torch.Tensor, actions: torch.Tensor) -> None:
        """Real latents [F', C, H, W] and the executed normalised actions [F'*N, A] of those frames."""
        frames = latents.shape[0]
        if actions.shape[0] != frames * self.model.apf:
            raise ValueError(
                f"observe: {frames} latent frames need {frames * self.model.apf} actions, "
                f"got {actions.shape[0]}"
            )
        self.drop_predicted()
        zeros = torch.zeros(frames, dtype=torch.float32, device=self.device)
        self._pass("video", latents.to(self.device, torch.float32)[None], zeros, "real")
        acts = actions.to(self.device, torch.float32)[None].clone()
        acts[..., ~self.mask] = 0.0
        self._pass("action", acts, zeros, "real")
        self.frame += frames


def to_robot_units(actions: torch.Tensor, normalizer, slots) -> np.ndarray:
    """Normalised [.., A] model actions -> [.., len(slots)] robot units (the normaliser's inverse)."""
    used = actions[..., list(slots)].detach().cpu().numpy()
    return normalizer.denormalize(used)


def seeded(*parts: int) -> torch.Generator:
    """A torch generator seeded by a tuple of ints (e.g. seed, episode, chunk): reproducible draws that do
    not depend on the order the calls come in."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
