"""A replay policy served through bin/serve's own path: each chunk is a recorded demo's next actions,
normalised with the run's normaliser and placed in the run's slots, so the server's own
denormalisation, slot extraction and chunk layout (trainer/serving/session.py: to_robot_units,
action_layout) and the client's loop (trainer/evaluation/loops.py libero_episode, in the simulator worker)
are what turn them back into env.step's actions. The idea is upstream's replay policy (LingBot-VA
Simple_Remote_Infer/deploy/replay_policy.py: a server answering with a dataset's actions); written here.

    served = replaying(load_served(...), actions, faults=["", "gripper"])  # a Served whose sessions replay
    Serving(served, log, workers=1)                                         # bin/evaluate's in-process server

The encoding mirrors training's (trainer/data/stream.py: `normalizer.normalize(raw, clip)` of the used
channels, written into `data.action_slots`), so a replayed demo reaches env.step unchanged only when
serving's decoding is its inverse. What a chunk holds (F latent frames x N actions, rows in time order):
in an episode's first chunk the client does not execute latent frame 0 (upstream's run_one starts at 1), so
the demo starts at row N there; later chunks are executed whole. The cursor moves when the executed frames
come back (Session.executed -> observe), by the rows the client executed. Past the demo's end: zero
actions (hold still).

Faults (one per session, in the order sessions are reset; the test's broken paths):
    ""          none: the demo as recorded
    "gripper"   the gripper channel's sign flipped
    "slots"     the channels rotated by one (x <- gripper, y <- x, ...)
    "shift"     every chunk one key frame (N // 4 actions) late: the rows one key frame ahead of the cursor
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from trainer.recipe.batch import ACTION_SLOTS
from trainer.sampling.sampler import Chunk
from trainer.serving.session import Served

FAULTS = ("", "gripper", "slots", "shift")


def normalised(served: Served, rows: np.ndarray) -> np.ndarray:
    """Robot-unit rows (T, channels) -> (T, used channels) by the run's normaliser and clip."""
    stats = getattr(served.normalizer, "q01", None)
    width = int(np.asarray(stats if stats is not None else served.normalizer.mean).size)
    raw = np.zeros((rows.shape[0], max(width, rows.shape[1])), np.float32)
    raw[:, : rows.shape[1]] = rows
    return served.normalizer.normalize(raw, clip=training_clip(served))[:, : len(served.slots)]


def training_clip(served: Served) -> float:
    """The clip training applied to the run's actions (recipe.action_clip, trainer/data/stream.py)."""
    return float(served.cfg.recipe.action_clip)


def clipped(served: Served, normed: np.ndarray) -> int:
    """Values the run's clip reached: where the round trip is not the identity."""
    return int((np.abs(normed) >= training_clip(served) - 1e-6).sum())


class ReplaySource:
    """What Session uses of a ChunkSampler (frame, sample, drop_predicted, observe), replaying `actions`."""

    def __init__(self, served: Served, actions: np.ndarray, fault: str = ""):
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r}: one of {FAULTS}")
        self.served, self.fault = served, fault
        self.actions = np.asarray(actions, np.float32)
        self.frame = 0  # latent frames observed (the sampler's position)
        self.cursor = 0  # demo rows executed so far
        self.clipped = 0  # normalised values the run's clip changed (a round trip that is not identity)

    def _rows(self, first: bool) -> np.ndarray:
        """This chunk's robot-unit rows (F * N, channels), the fault applied."""
        spec = self.served.spec
        f, n = spec.frames_per_chunk, spec.actions_per_frame
        skip = n if first else 0  # latent frame 0 of the first chunk is not executed
        start = self.cursor + (n // 4 if self.fault == "shift" else 0)
        take = self.actions[start : start + f * n - skip]
        rows = np.zeros((f * n, self.actions.shape[1]), np.float32)
        rows[skip : skip + len(take)] = take
        if self.fault == "gripper":
            rows[:, 6] = -rows[:, 6]
        elif self.fault == "slots":
            rows = np.roll(rows, 1, axis=1)
        return rows

    def _normalised(self, rows: np.ndarray) -> torch.Tensor:
        """As trainer/data/stream.py encodes a training episode's actions: the run's normaliser, its clip,
        the used channels written into data.action_slots of an action_dim-wide row."""
        s = self.served
        slots = list(s.cfg.data.action_slots or ACTION_SLOTS)[: len(s.slots)]
        normed = normalised(s, rows)
        self.clipped += clipped(s, normed)
        out = torch.zeros(rows.shape[0], s.action_mask.numel())
        out[:, slots] = torch.from_numpy(normed)
        return out

    def sample(self, first_latent=None, generator=None, **_: Any) -> Chunk:
        first = self.frame == 0
        latents = torch.zeros(self.served.spec.frames_per_chunk, *self.served.grid)
        return Chunk(latents, self._normalised(self._rows(first)), self.frame)

    def drop_predicted(self) -> None:
        """A second request for the same chunk: the same rows again (the cursor moves on observe only)."""

    def observe(self, latents: torch.Tensor, actions: torch.Tensor) -> None:
        spec = self.served.spec
        executed = latents.shape[0] * spec.actions_per_frame
        if self.frame == 0:
            executed -= spec.actions_per_frame  # the first chunk's latent frame 0 was the observation
        self.cursor += executed
        self.frame += latents.shape[0]


@dataclasses.dataclass
class ReplayServed(Served):
    """A Served whose sessions replay `actions`, session k with faults[k] (then "")."""

    actions: np.ndarray | None = None
    faults: list[str] = dataclasses.field(default_factory=list)
    sources: list[ReplaySource] = dataclasses.field(default_factory=list)

    def chunk_source(self, prompt_emb: torch.Tensor) -> Any:
        assert self.actions is not None
        fault = self.faults[len(self.sources)] if len(self.sources) < len(self.faults) else ""
        self.sources.append(ReplaySource(self, self.actions, fault))
        return self.sources[-1]


def replaying(served: Served, actions: np.ndarray, faults: list[str]) -> ReplayServed:
    """`served` (load_served's: the run's model, normaliser, slots, encoders, spec) replaying `actions`."""
    fields = {f.name: getattr(served, f.name) for f in dataclasses.fields(served)}
    return ReplayServed(**fields, actions=np.asarray(actions, np.float32), faults=list(faults))
