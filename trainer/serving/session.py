"""What bin/serve serves: the model loaded once (`load_served`), and one `Session` per connection.

`load_served` loads the weights as bin/evaluate does (trainer/sampling/load.py; a RUN_DIR's best
checkpoint, `checkpoints/best`, when it has one, else its newest complete checkpoint; at full scale a
released folder with stand-in encoders is refused, exit 2), applies `--set` (infer.* chooses the sampler),
builds the run's encoders (trainer/data/encoding/encoder.py, text.py: the Wan2.2 VAE and T5 when the run
used them, else the stand-ins, announced), and takes what it needs of the run's data from
trainer/sampling/rundata.py serving_inputs: from the config alone with fixed statistics and the real VAE
(a released folder served with no dataset, as upstream's server; the empty prompt from the text encoder),
else through training's data path as bin/evaluate (the action normaliser, the empty prompt, the stand-in
latents' standardisation).

A Session is upstream's VA_Server state for one client (`_reset`, `_infer`, `_compute_kv_cache`), on a
ChunkSampler of its own (its own KV cache and prompt; another connection never sees it):
    reset(prompt)      a new episode: the prompt embedded by the run's text encoder (none: data.prompt)
    observe(frame)     the next chunk: (C, F, N) robot-unit actions (channels, frames, actions per frame);
                       the first chunk of an episode is conditioned on `frame` (latent frame 0); later
                       chunks ignore it, as upstream does (its clients re-send the first observation)
    executed(frames, state)  the key frames the robot saw while executing the chunk, t per executed latent
                       frame (t = the encoder's temporal factor: t x (F - 1) after the first chunk, whose
                       frame 0 is the observation, else t x F), and the executed actions (C, F, N) in robot
                       units, normalised as training normalised them; they replace the chunk's predicted
                       entries in the cache as real history.

The frames are streamed as upstream streams them (`WanVAEStreamingWrapper`): one LatentStream per camera per
episode (trainer/data/encoding/encoder.py `stream()`, made fresh on reset; a camera whose view is of another
size, the T-shape's wrists, through `resized`), the first observation pushed alone (latent frame 0), then
each compute_kv_cache's key frames in groups of t; so the latents are those `encode` gives the whole video,
the run's training latents. The views are composed as training composes them
(trainer/data/encoding/views.py, data.layout) and standardised as training's stand-in latents. A key-frame
count the stream cannot take is refused before anything is encoded (ProtocolError, field "obs": what was
expected and what came) and the streams stay as they were. The noise of chunk k of the e-th episode of a
session is drawn from sampler.seeded(seed, e, k), as bin/evaluate draws chunk k of its e-th episode: same
inputs, same actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.sampling.sampler import ChunkSampler, seeded, to_robot_units
from trainer.serving.protocol import Frame, ProtocolError, Spec, action_layout, check_state, state_rows

ACTION_CLIP = 1.5  # trainer/data/stream.py's, when the config has no recipe.action_clip


@dataclass
class Served:
    model: Any
    cfg: Any
    what: str
    normalizer: Any
    slots: tuple[int, ...]
    action_mask: torch.Tensor
    empty_emb: torch.Tensor
    grid: tuple[int, int, int]
    latent_stats: tuple | None
    video: Any  # trainer/data/encoding/encoder.py VideoEncoder
    text: Any  # trainer/data/encoding/text.py TextEncoder
    spec: Spec
    seed: int = 0
    stand_ins: tuple[str, ...] = ()

    @property
    def clip(self) -> float:
        return float(getattr(getattr(self.cfg, "recipe", None), "action_clip", ACTION_CLIP))

    @property
    def temporal(self) -> int:
        """Key frames per latent frame after the first (the encoder's temporal factor)."""
        return int(self.video.temporal)

    def encoders(self) -> list[Any]:
        """One encoder per camera, data.cameras order, at its view's latent size (views.view_sizes), as the
        latent cache maps them (trainer/data/encoding/rows.py camera_encoders)."""
        from trainer.data.encoding.rows import camera_encoders
        from trainer.data.encoding.views import view_sizes

        cameras = list(self.cfg.data.cameras)
        return list(camera_encoders(cameras, view_sizes(self.cfg), self.video).values())

    def streams(self) -> list[Any]:
        """A fresh episode: one LatentStream per camera (trainer/data/encoding/encoder.py)."""
        return [enc.stream() for enc in self.encoders()]

    @torch.no_grad()
    def push(self, streams: list[Any], frames: list[Frame]) -> torch.Tensor:
        """Frames through the episode's streams -> latents [L, C, H, W]: each camera's latents, composed
        as training composes them (views.compose, data.layout), standardised as training's stand-in
        latents. The count is the caller's to check (Session); a failed stream keeps its state."""
        from trainer.data.encoding.views import compose, layout_of

        stacks = []
        for cam in self.spec.cameras:  # every check before any stream moves
            images = [frame[cam] for frame in frames]
            sizes = sorted({tuple(img.shape) for img in images})
            if len(sizes) > 1:
                raise ProtocolError(f"obs[...][{cam!r}]", f"expected one image size per request, got {sizes}")
            # a copy: a decoded array is a read-only view of the frame's bytes (torch warns on those)
            stacks.append(np.array(np.stack(images)))
        problems = [p for st, x in zip(streams, stacks, strict=True) if (p := st.expected(x.shape[0]))]
        if problems:
            raise ProtocolError("obs", problems[0])
        per_camera = [st.push(x) for st, x in zip(streams, stacks, strict=True)]
        x = compose(per_camera, layout_of(self.cfg)).astype(np.float32)
        if self.latent_stats is not None:
            mean, std = self.latent_stats
            x = (x - mean) / std
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))

    def chunk_source(self, prompt_emb: torch.Tensor) -> ChunkSampler:
        """An episode's source of chunks: the model's ChunkSampler on this prompt. The one seam between
        what the model samples (normalised actions in the run's slots) and what the server does with it
        (to_robot_units, action_layout); tests/support/replay.py puts a recorded demo's actions here."""
        return ChunkSampler(
            self.model, self.cfg.infer, self.action_mask, prompt_emb, self.empty_emb, video_grid=self.grid
        )

    def normalised_actions(self, state: np.ndarray) -> torch.Tensor:
        """(C, F, N) robot units -> [F*N, action_dim] normalised, clipped, in the run's slots."""
        rows = state_rows(state)
        stats = getattr(self.normalizer, "q01", None)
        width = int(np.asarray(stats if stats is not None else self.normalizer.mean).size)
        raw = np.zeros((rows.shape[0], max(width, rows.shape[1])), np.float32)
        raw[:, : rows.shape[1]] = rows
        out = torch.zeros(rows.shape[0], self.action_mask.numel())
        used = self.normalizer.normalize(raw, clip=self.clip)[:, : len(self.slots)]
        out[:, list(self.slots)] = torch.from_numpy(used)
        return out


def load_served(
    target: str, config: str, cpu_scale: bool, sets: list[str], device: str, seed: int, say,
    resolved: tuple[str, Path] | None = None,
) -> Served:  # fmt: skip
    """The model and what serving it needs. TARGET is resolved once (`resolved`: as the caller already
    resolved it, the checkpoint its outputs are named after): the weights loaded and the statistics checked
    are that checkpoint's, even if RUN_DIR/checkpoints/best moves meanwhile (a run in training)."""
    from trainer.config import parse_set, resolve_config
    from trainer.data.cache.prepare import stand_ins
    from trainer.data.encoding.encoder import make_encoder
    from trainer.data.encoding.text import make_text_encoder
    from trainer.sampling.load import apply_sets, check_trained_stats, load_model, pick_device, resolve_target
    from trainer.sampling.rundata import serving_inputs

    dev = pick_device(device)  # before the load: a node without the device says so at once
    base, sources = resolve_config(config, cpu_scale, parse_set(list(sets)))
    kind, path = resolved = resolved or resolve_target(target)
    model, cfg, what = load_model(
        target, base, not cpu_scale, lambda line: say(f"serve: {line}"), resolved, sources
    )
    if sets:
        cfg = apply_sets(cfg, list(sets), what, checkpoint=kind == "checkpoint")
    model = model.to(dev) if dev.type == "cpu" else model.to(dev, dtype=torch.bfloat16)
    say(f"serve: {what}")
    video, text = make_encoder(cfg, dev), make_text_encoder(cfg, dev)
    announced = tuple(stand_ins(video, text))
    data = serving_inputs(cfg, text)
    loaded = str(path) if kind == "checkpoint" else target  # the checkpoint loaded, not what best is now
    check_trained_stats(loaded, data.normalizer, data.latent_stats, data.source, lambda x: say(f"serve: {x}"))
    say(f"serve: action statistics, empty prompt and latent grid from {data.source}")
    spec = Spec(tuple(cfg.data.cameras), len(data.slots), cfg.infer.frames_per_chunk, model.apf)
    return Served(
        model, cfg, what, data.normalizer, data.slots, data.action_mask, data.empty_emb, data.grid,
        data.latent_stats, video, text, spec, seed, announced,
    )  # fmt: skip


class Session:
    """One client's episode state (see the module docstring)."""

    def __init__(self, served: Served):
        self.served = served
        self.sampler: ChunkSampler | None = None
        self.episode = -1  # the current episode's noise index (the connection's count, or the client's seed)
        self.count = -1  # episodes reset on this connection
        self.chunk = 0  # chunks sampled in this episode
        self.first_latent: torch.Tensor | None = None
        self.streams: list[Any] = []  # one LatentStream per camera, this episode's
        self.pending = False  # a chunk was sampled and its real frames have not arrived yet

    def reset(self, prompt: str | None, episode_seed: int | None = None) -> None:
        """A new episode; its chunks' noise is seeded by (seed, e, k): e the connection's own episode count,
        or `episode_seed` when the client sends one (protocol.py: one connection per episode)."""
        s = self.served
        emb, _ = s.text.embed(prompt if prompt is not None else s.cfg.data.prompt)
        self.sampler = s.chunk_source(torch.as_tensor(emb))
        self.count += 1
        self.episode = self.count if episode_seed is None else episode_seed
        self.chunk, self.first_latent, self.pending = 0, None, False
        self.streams = s.streams()

    def _sampler(self) -> ChunkSampler:
        if self.sampler is None:
            raise ProtocolError("reset", "no episode yet: send {'reset': True, 'prompt': ...} first")
        return self.sampler

    @torch.no_grad()
    def observe(self, frame: Frame | None) -> np.ndarray:
        sampler, s = self._sampler(), self.served
        first = sampler.frame == 0
        if first and frame is None:
            raise ProtocolError(
                "obs", f"the first chunk needs an observation: a map of {list(s.spec.client_cameras)}"
            )
        if self.pending:  # a second request for the same chunk: forget the first answer's predictions
            sampler.drop_predicted()
        if first:  # latent frame 0; again on a second plain request (nothing else was pushed yet)
            assert frame is not None
            streams = s.streams()
            self.first_latent = s.push(streams, [frame])[0]
            self.streams = streams
        chunk = sampler.sample(
            first_latent=self.first_latent if first else None,
            generator=seeded(s.seed, self.episode, self.chunk),
        )
        robot = to_robot_units(chunk.actions, s.normalizer, s.slots)
        if not np.isfinite(robot).all():  # never sent to a robot: a server error reply (the client raises)
            sampler.drop_predicted()
            raise FloatingPointError(
                f"chunk {self.chunk} of episode {self.episode}: the sampled actions are not finite (NaN or "
                "inf); the checkpoint or its inputs are broken, nothing was sent"
            )
        self.pending = True
        return action_layout(robot, s.spec.frames_per_chunk, s.spec.actions_per_frame)

    def expected_key_frames(self) -> tuple[int, int]:
        """(key frames, executed latent frames) the next compute_kv_cache must carry."""
        f = self.served.spec.frames_per_chunk
        latent_frames = f - 1 if self._sampler().frame == 0 else f
        return self.served.temporal * latent_frames, latent_frames

    @torch.no_grad()
    def executed(self, frames: list[Frame], state: np.ndarray) -> None:
        sampler, s = self._sampler(), self.served
        if not self.pending:
            raise ProtocolError("compute_kv_cache", "no chunk to update: send an observation first")
        first = sampler.frame == 0
        want, latent_frames = self.expected_key_frames()
        if len(frames) != want:  # before anything is encoded: the streams stay as they were
            raise ProtocolError(
                "obs",
                f"expected {want} key frames ({s.temporal} per executed latent frame x {latent_frames} "
                f"latent frames), got {len(frames)}",
            )
        state = check_state(state, s.spec, s.spec.frames_per_chunk)
        try:
            latents = s.push(self.streams, frames) if frames else None
        except ProtocolError:
            raise  # refused before any stream moved
        except Exception:
            # a camera's stream failed after another's moved on: the episode's history is lost
            self.sampler = None
            raise
        if first:
            assert self.first_latent is not None
            head = self.first_latent[None]
            latents = head if latents is None else torch.cat([head, latents])
        assert latents is not None
        sampler.observe(latents, s.normalised_actions(state))
        self.pending = False
        self.chunk += 1
