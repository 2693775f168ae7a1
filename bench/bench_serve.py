"""bin/serve's latency per chunk on the CPU at upstream's two client geometries: through the real server vs
the sampler alone.

Geometries (the `libero` and `robotwin` presets' cpu_scale models, random weights: time does not depend on
them; fp32; the stand-in encoders at their temporal factor 4; images at the clients' sizes):
    libero    2 cameras of 128 x 128 side by side, 7 channels, F = 4 frames per chunk, N = 4 actions per frame
    robotwin  3 cameras of 240 x 320 (RoboTwin's D435 size, assumed: trainer/evaluation/loops.py) in
              the T-shape, 16 channels, F = 2, N = 16
Infer settings: 5 video + 10 action steps, guidance 5 (two rows): this benchmark's earlier settings (the
presets' own, 20-25 + 50 steps, scale each chunk's time by about the step count). The server is
trainer/serving/server.py's PolicyServer (websockets, the msgpack-numpy codec, a Session per connection,
the one model worker thread) on 127.0.0.1, in a thread of this process; the client is
trainer/evaluation/replay.py's PolicyClient. One episode at the clients' cadence: chunk 0 (reset,
observation), then per chunk compute_kv_cache (4 key frames per executed latent frame, streamed through the
encoder, and the executed actions) and the next observation (the first one re-sent, as the clients do).
Per chunk: the client's round trip of the observation (what a robot waits for an action chunk), the
server's `server_timing.infer_ms`, the compute_kv_cache round trip, and the same chunk sampled directly by a
Session with the same inputs (alternating, chunk by chunk). The ratio served / direct is the protocol's
cost (msgpack, websockets, the worker hand-off).

    .venv/bin/python bench/bench_serve.py [--quick]
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Table, median  # noqa: E402

GEOMETRIES = {"libero": (128, 128), "robotwin": (240, 320)}  # preset -> the client's image H x W
INFER = {"video_steps": 5, "action_steps": 10, "guidance": 5.0}


def _config(preset: str):
    from trainer.config import load_config

    cfg = load_config(preset, True)
    for k, v in INFER.items():
        setattr(cfg.infer, k, v)
    return cfg


def _served(cfg):
    import numpy as np
    import torch

    from trainer.data.encoding.encoder import make_encoder
    from trainer.data.encoding.text import StandInText
    from trainer.data.encoding.views import grid
    from trainer.data.normalize import QuantileNormalizer
    from trainer.model import WorldModel
    from trainer.serving.protocol import Spec
    from trainer.serving.session import Served

    torch.manual_seed(0)
    model = WorldModel(cfg).eval()
    m, cams, slots = cfg.model, tuple(cfg.data.cameras), tuple(cfg.data.action_slots)
    text = StandInText(m.text_dim, cfg.data.text_length)
    empty, _ = text.embed("")
    c = len(slots)
    norm = QuantileNormalizer(np.full(c, -1, np.float32), np.full(c, 1, np.float32))
    spec = Spec(cams, c, cfg.infer.frames_per_chunk, cfg.data.actions_per_frame)
    mask = torch.zeros(m.action_dim, dtype=torch.bool)
    mask[list(slots)] = True
    h, w = grid(cfg)
    return Served(
        model, cfg, "random cpu_scale weights", norm, slots, mask, torch.as_tensor(empty),
        (m.latent_channels, h, w), None, make_encoder(cfg), text, spec,
    )  # fmt: skip


def _frames(cams, size, count: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [{c: rng.integers(0, 256, (*size, 3), dtype=np.uint8) for c in cams} for _ in range(count)]


def measure(preset: str, chunks: int) -> dict[str, list[float]]:
    import numpy as np
    import torch

    from trainer.serving.client import PolicyClient
    from trainer.serving.server import Limits, PolicyServer
    from trainer.serving.session import Session

    cfg = _config(preset)
    served = _served(cfg)
    server = PolicyServer(served, Limits(), lambda line: None)
    bound = threading.Event()
    thread = threading.Thread(
        target=lambda: asyncio.run(server.run("127.0.0.1", 0, lambda p: bound.set(), signals=False)),
        daemon=True,
    )
    thread.start()
    assert bound.wait(120), "the server did not start"
    client = PolicyClient(f"ws://127.0.0.1:{server.port}")
    direct = Session(served)  # the same work without the protocol: streams + ChunkSampler, in this thread
    spec, t = served.spec, served.temporal
    f, n, c = spec.frames_per_chunk, spec.actions_per_frame, spec.channels
    video = _frames(spec.cameras, GEOMETRIES[preset], 1 + t * (chunks * f - 1), 0)
    first = video[0]
    out: dict[str, list[float]] = {"served": [], "infer": [], "kv": [], "direct": []}
    client.reset(cfg.data.prompt)
    direct.reset(cfg.data.prompt)
    pushed = 1
    with torch.no_grad():
        for k in range(chunks):
            if k:
                count = t * (f - 1 if k == 1 else f)
                obs, state = video[pushed : pushed + count], np.zeros((c, f, n), np.float32)
                pushed += count
                start = time.perf_counter()
                client.infer({"obs": obs, "compute_kv_cache": True, "imagine": False, "state": state})
                out["kv"].append(time.perf_counter() - start)
                direct.executed(obs, state)
            start = time.perf_counter()
            reply = client.infer({"obs": first})
            out["served"].append(time.perf_counter() - start)
            out["infer"].append(reply["server_timing"]["infer_ms"] / 1000)
            start = time.perf_counter()
            want = direct.observe(first)
            out["direct"].append(time.perf_counter() - start)
            assert reply["action"].shape == (c, f, n)
            assert np.allclose(reply["action"], want, atol=1e-5), f"{preset} chunk {k}: served != direct"
    client.close()
    server.stop()
    thread.join(60)
    return out


def main(quick: bool = False) -> list[Table]:
    import torch

    chunks = 4 if quick else 6
    torch.set_num_threads(int(os.environ.get("LINGBOT_BENCH_THREADS", "2")))
    tables = []
    for preset in GEOMETRIES:
        cfg = _config(preset)
        f, n = cfg.infer.frames_per_chunk, cfg.data.actions_per_frame
        h, w = GEOMETRIES[preset]
        out = measure(preset, chunks)
        table = Table(
            f"{preset}: {len(cfg.data.cameras)} cameras {h} x {w} ({cfg.data.layout}), F={f}, N={n}, "
            f"cpu_scale, fp32, {torch.get_num_threads()} thread(s); seconds (chunk 0 has no history)",
            [
                "chunk",
                "served round trip",
                "server infer",
                "compute_kv_cache round trip (key frames)",
                "direct",
                "served/direct",
            ],
            [],
        )
        for k in range(chunks):
            frames = 4 * (f - 1 if k == 1 else f)
            kv = f"{out['kv'][k - 1]:.3f} ({frames})" if k else "-"
            ratio = out["served"][k] / out["direct"][k]
            table.rows.append([str(k), f"{out['served'][k]:.3f}", f"{out['infer'][k]:.3f}", kv,
                               f"{out['direct'][k]:.3f}", f"{ratio:.2f}x"])  # fmt: skip
        later = [out["served"][k] / out["direct"][k] for k in range(1, chunks)]
        table.ratio = (
            f"{preset}: chunk 0 served {out['served'][0]:.3f} s; later chunks served median "
            f"{median(out['served'][1:]):.3f} s, compute_kv_cache median {median(out['kv']):.3f} s; "
            f"served/direct median {median(later):.2f}x"
        )
        tables.append(table)
    return tables


if __name__ == "__main__":
    print("\n\n".join(t.markdown() for t in main("--quick" in sys.argv)))
