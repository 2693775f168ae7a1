"""Closed loop without a simulator: replay held-out demonstrations through a served policy (bin/serve).

    client = PolicyClient("ws://127.0.0.1:29056", api_key=None)   # speaks as upstream's clients do
    episodes = replay_episodes(cfg, names)                          # frames and recorded actions from disk
    result = replay_open_loop(client, episodes, normalizer, slots, frames_per_chunk, actions_per_frame)

PolicyClient is upstream's WebsocketClientPolicy's behaviour (websockets' sync client, no compression, no
size limit, no pings, `Authorization: Api-Key <key>` when given a key; the metadata map read on connect; a
text reply raised as ServerError), written here with protocol.py's codec.

The environment is the episode as it was recorded, played at the cadence of upstream's clients
(evaluation/libero/client.py `run_one`, evaluation/robotwin/eval_polict_client_openpi.py `eval_policy`):
`reset` with the prompt, then per chunk the first observation (the clients re-send it with every request;
the server uses it for the first chunk only), the served (C, F, N) actions, and `compute_kv_cache` with the
key frames the robot saw and the actions it executed: here the recorded ones (a replay cannot execute the
policy's actions). Key frames come t per executed latent frame (t = the encoder's temporal factor, the
clients' four: one every N // 4 actions), F - 1 latent frames after the first chunk (its frame 0 is the
observation), F after the others. Video frame j is recorded row j*a (a = data.actions_per_video_frame);
latent frame 0 is video frame 0, latent frame k >= 1 the group of video frames (k-1)t+1 .. kt, the
frames training's cache encodes into it; its N = t*a actions are the recorded ones leading into it (N
zeros before frame 0, as training pads them: trainer/data/stream.py). The served actions are scored
against the recorded ones exactly as bin/evaluate scores its predictions (openloop.py `summarise`, the
same normaliser and clip), over the same chunks, so with the same episode, settings and seed both paths
give the same numbers (tests/test_serve.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainer.evaluation.openloop import FURNITURE_CHANNELS, _Errors, summarise
from trainer.serving.client import PolicyClient
from trainer.serving.protocol import Frame, action_layout, state_rows


@dataclass
class ReplayEpisode:
    name: str
    prompt: str
    video: list[Frame]  # the episode's video frames (row j*a), 1 + (L-1)*t of them: L latent frames
    temporal: int  # t: video frames per latent frame after the first
    actions: np.ndarray  # [L*N, C] robot units, the N actions leading into each latent frame (zeros before 0)
    served: list[np.ndarray] = field(default_factory=list)  # (C, F, N) per chunk, filled by the replay

    @property
    def latent_frames(self) -> int:
        return 1 + (len(self.video) - 1) // self.temporal

    def key_frames(self, first: int, stop: int) -> list[Frame]:
        """The video frames of latent frames first .. stop-1 (first >= 1): t each, in order."""
        t = self.temporal
        return self.video[(first - 1) * t + 1 : (stop - 1) * t + 1]


def replay_episodes(cfg, names: list[str]) -> list[ReplayEpisode]:
    """The named episodes (named as trainer/sampling/rundata.py does), from the run's FurnitureBench data."""
    from trainer.data.cache.prepare import data_root
    from trainer.data.encoding.encoder import temporal_factor
    from trainer.data.formats.furniturebench import DatasetError, read_episode
    from trainer.data.formats.sources import discover_source

    found = discover_source(cfg, data_root(cfg))
    cams = list(cfg.data.cameras)
    t, n = temporal_factor(cfg), int(cfg.data.actions_per_frame)
    a = max(1, int(getattr(cfg.data, "actions_per_video_frame", 1)))
    out = []
    for name in names:
        path = Path(found.root) / name
        if path.suffix != ".pkl":
            raise DatasetError(f"{path}: the replay reads FurnitureBench episodes (*.pkl) only")
        ep = read_episode(path, cams)
        rows = min(ep.images[c].shape[0] for c in cams)
        video_frames = len(range(0, rows, a))
        latent_frames = 1 + (video_frames - 1) // t
        video = [{c: ep.images[c][j * a] for c in cams} for j in range(1 + (latent_frames - 1) * t)]
        used = cfg.model.action_used
        acts = np.concatenate([np.zeros((n, ep.actions.shape[1]), np.float32), ep.actions])[
            : latent_frames * n
        ]
        out.append(ReplayEpisode(name, cfg.data.prompt, video, t, np.ascontiguousarray(acts[:, :used])))
    return out


def replay_episode(client: PolicyClient, ep: ReplayEpisode, frames_per_chunk: int, per_frame: int) -> None:
    """One episode through the server; its served chunks land in ep.served."""
    f, n = frames_per_chunk, per_frame
    client.reset(ep.prompt)
    ep.served = []
    first_obs = ep.video[0]
    chunks = ep.latent_frames // f
    for k in range(chunks):
        reply = client.infer({"obs": first_obs, "prompt": ep.prompt})
        ep.served.append(np.asarray(reply["action"]))
        if k + 1 < chunks:
            start = 1 if k == 0 else 0
            executed = action_layout(ep.actions[k * f * n : (k + 1) * f * n], f, n)
            client.infer(
                {
                    "obs": ep.key_frames(k * f + start, (k + 1) * f),
                    "compute_kv_cache": True,
                    "imagine": False,
                    "state": executed,
                }
            )


def score(
    episodes: list[ReplayEpisode], normalizer, frames_per_chunk: int, per_frame: int, clip: float
) -> dict:
    """bin/evaluate's action scores (openloop.py) of the served chunks against the recorded actions."""
    f, n = frames_per_chunk, per_frame
    channels = episodes[0].actions.shape[1]
    names = (
        FURNITURE_CHANNELS
        if channels == len(FURNITURE_CHANNELS)
        else tuple(f"ch{i}" for i in range(channels))
    )
    total = _Errors.zeros(channels)
    per_episode = {}
    for ep in episodes:
        err = _Errors.zeros(channels)
        for k, action in enumerate(ep.served):
            start = 1 if k == 0 else 0
            served = state_rows(action)[start * n :].astype(np.float64)
            real = normalizer.normalize(ep.actions[k * f * n : (k + 1) * f * n][start * n :], clip=clip)
            pred = normalizer.normalize(served, clip=np.inf).astype(np.float64)
            real = real.astype(np.float64)
            err.norm_abs += np.abs(pred - real).sum(0)
            err.norm_sq += ((pred - real) ** 2).sum(0)
            err.robot_abs += np.abs(served - normalizer.denormalize(real)).sum(0)
            err.actions += pred.shape[0]
            err.chunks += 1
            err.frames += f - start
        err.frames_skipped = ep.latent_frames - len(ep.served) * f
        per_episode[ep.name] = summarise(err, names)
        for name in ("norm_abs", "robot_abs", "norm_sq", "actions", "chunks", "frames", "frames_skipped"):
            setattr(total, name, getattr(total, name) + getattr(err, name))
    overall = summarise(total, names)
    for key in ("latent_mae", "latent_mse"):  # the server does not send its generated video
        overall.pop(key, None)
        for v in per_episode.values():
            v.pop(key, None)
    return {"episodes": len(episodes), "overall": overall, "per_episode": per_episode}


def replay_open_loop(
    client: PolicyClient, episodes: list[ReplayEpisode], normalizer, frames_per_chunk: int, per_frame: int,
    clip: float,
) -> dict:  # fmt: skip
    for ep in episodes:
        replay_episode(client, ep, frames_per_chunk, per_frame)
    return score(episodes, normalizer, frames_per_chunk, per_frame, clip)
