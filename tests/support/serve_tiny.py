"""bin/serve's server on a tiny random model, in this process or as a program of its own (for tests that
read the server's real stderr, as a terminal shows it, without training a checkpoint first).

    served = tiny_served()                          # a Served: 2 cameras (front, wrist), 8 channels, F = 2
    python -m tests.support.serve_tiny [--max-connections N] [--idle-timeout S] [--api-key K]

The program serves on 127.0.0.1, any free port, with bin/serve's own line writer (stderr) and signal
handling: `serve: listening on ws://127.0.0.1:PORT` when ready, exit 0 on SIGTERM / SIGINT. Nothing of a
run (no checkpoint, no data): the model is WorldModel(tiny_cfg()) seeded 0, the stand-in encoders.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses

import numpy as np
import torch

from tests.support.lingbot_tiny import tiny_cfg
from trainer.data.encoding.encoder import PatchMeanEncoder
from trainer.data.encoding.text import StandInText
from trainer.data.normalize import QuantileNormalizer
from trainer.model import WorldModel
from trainer.recipe.batch import ACTION_SLOTS, action_slot_mask
from trainer.serving.protocol import Spec
from trainer.serving.session import Served

F, CAMS, CHANNELS = 2, ("front", "wrist"), 8


def tiny_served(temporal: int = 1, **sets) -> Served:
    """temporal: the encoder's key frames per latent frame; sets: tiny_cfg overrides (LIBERO's client loop:
    data.actions_per_frame 4 and temporal 4, four key frames per latent frame)."""
    cfg = tiny_cfg(**{"infer.frames_per_chunk": F, "infer.video_steps": 2, "infer.action_steps": 2, **sets})
    cfg.data.cameras = list(CAMS)
    torch.manual_seed(0)
    model = WorldModel(cfg).eval()
    m = cfg.model
    text = StandInText(m.text_dim, 8)
    empty, _ = text.embed("")
    low, high = np.linspace(-1, 0, CHANNELS), np.linspace(1, 2, CHANNELS)
    norm = QuantileNormalizer(low.astype(np.float32), high.astype(np.float32))
    spec = Spec(CAMS, CHANNELS, F, cfg.data.actions_per_frame)
    grid = (m.latent_channels, m.latent_size, m.latent_size * len(CAMS))
    video = PatchMeanEncoder(m.latent_channels, m.latent_size, temporal)
    return Served(
        model, cfg, "tiny", norm, tuple(ACTION_SLOTS), action_slot_mask(m.action_dim, CHANNELS),
        torch.as_tensor(empty), grid, None, video, text, spec,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from trainer.serving.cli import _say
    from trainer.serving.server import Limits, PolicyServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-connections", type=int, default=4)
    parser.add_argument("--idle-timeout", type=float, default=None, help="default: Limits' own")
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args(argv)
    limits = Limits(args.api_key, args.max_connections, 64 * 1024)
    if args.idle_timeout is not None:
        limits = dataclasses.replace(limits, idle_timeout=args.idle_timeout)
    server = PolicyServer(tiny_served(), limits, _say)
    ready = lambda port: _say(f"serve: listening on ws://127.0.0.1:{port}")  # noqa: E731
    return asyncio.run(server.run("127.0.0.1", 0, ready))


if __name__ == "__main__":
    raise SystemExit(main())
