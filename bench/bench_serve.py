"""bin/serve's latency per chunk on the CPU: through the real server vs the sampler alone.

Measured: the cpu_scale model of furniture_train (random weights: time does not depend on them), fp32,
the run config's `infer` settings (the reference's: 5 video + 10 action steps, guidance 5 -> two rows,
4 frames per chunk), the stand-in encoders, two cameras of 224 x 224 images. The server is
trainer/inference/server.py's PolicyServer (websockets, the msgpack-numpy codec, a Session per
connection, the one model worker thread) on 127.0.0.1, in a thread of this process; the client is
trainer/inference/replay.py's PolicyClient, a second thread. One episode: chunk 0 (reset, observation),
then per chunk compute_kv_cache (the executed frames and actions) and the next observation. Per chunk:
the client's round trip of the observation (what a robot waits for an action chunk), the server's
`server_timing.infer_ms`, the compute_kv_cache round trip, and the same chunk sampled directly by a
ChunkSampler with the same inputs (alternating, chunk by chunk). The ratio served / direct is the
protocol's cost (encoding images, msgpack, websockets, the worker hand-off).

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


def _served(cfg):
    import numpy as np
    import torch

    from trainer.data.encoder import PatchMeanEncoder
    from trainer.data.normalize import QuantileNormalizer
    from trainer.data.text import StandInText
    from trainer.inference.protocol import Spec
    from trainer.inference.session import Served
    from trainer.model import WorldModel
    from trainer.recipe.batch import ACTION_SLOTS, action_slot_mask

    torch.manual_seed(0)
    model = WorldModel(cfg).eval()
    m, cams = cfg.model, tuple(cfg.data.cameras)
    text = StandInText(m.text_dim, cfg.data.text_length)
    empty, _ = text.embed("")
    norm = QuantileNormalizer(np.full(8, -1, np.float32), np.full(8, 1, np.float32))
    spec = Spec(cams, 8, cfg.infer.frames_per_chunk, cfg.data.actions_per_frame)
    grid = (m.latent_channels, m.latent_size, m.latent_size * len(cams))
    return Served(
        model, cfg, "random cpu_scale weights", norm, tuple(ACTION_SLOTS), action_slot_mask(m.action_dim, 8),
        torch.as_tensor(empty), grid, None, PatchMeanEncoder(m.latent_channels, m.latent_size, 1), text, spec,
    )  # fmt: skip


def _frames(cams, count: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [{c: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for c in cams} for _ in range(count)]


def measure(chunks: int) -> dict[str, list[float]]:
    import numpy as np
    import torch

    from trainer.config import load_config
    from trainer.inference.replay import PolicyClient
    from trainer.inference.server import Limits, PolicyServer
    from trainer.inference.session import Session

    cfg = load_config("furniture_train", True)
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
    direct = Session(served)  # the same work without the protocol: encode + ChunkSampler, in this thread
    f, n, cams = cfg.infer.frames_per_chunk, cfg.data.actions_per_frame, served.spec.cameras
    frames = _frames(cams, chunks * f, 0)
    out: dict[str, list[float]] = {"served": [], "infer": [], "kv": [], "direct": []}
    client.reset(cfg.data.prompt)
    direct.reset(cfg.data.prompt)
    with torch.no_grad():
        for k in range(chunks):
            if k:
                start = 1 if k == 1 else 0
                obs, state = frames[(k - 1) * f + start : k * f], np.zeros((8, f, n), np.float32)
                t = time.perf_counter()
                client.infer({"obs": obs, "compute_kv_cache": True, "state": state})
                out["kv"].append(time.perf_counter() - t)
                direct.executed(obs, state)
            t = time.perf_counter()
            reply = client.infer({"obs": frames[k * f]})
            out["served"].append(time.perf_counter() - t)
            out["infer"].append(reply["server_timing"]["infer_ms"] / 1000)
            t = time.perf_counter()
            want = direct.observe(frames[k * f])
            out["direct"].append(time.perf_counter() - t)
            assert np.allclose(reply["action"], want, atol=1e-5), f"chunk {k}: served != direct"
    client.close()
    server.stop()
    thread.join(60)
    return out


def main(quick: bool = False) -> Table:
    import torch

    chunks = 4 if quick else 6
    torch.set_num_threads(int(os.environ.get("LINGBOT_BENCH_THREADS", "2")))
    out = measure(chunks)
    table = Table(
        "bin/serve latency per chunk, cpu_scale, fp32, "
        f"{torch.get_num_threads()} thread(s); seconds (chunk 0 has no history; later chunks use the cache)",
        [
            "chunk",
            "served round trip",
            "server infer",
            "compute_kv_cache round trip",
            "direct",
            "served/direct",
        ],
        [],
    )
    for k in range(chunks):
        kv = f"{out['kv'][k - 1]:.3f}" if k else "-"
        ratio = out["served"][k] / out["direct"][k]
        table.rows.append([str(k), f"{out['served'][k]:.3f}", f"{out['infer'][k]:.3f}", kv,
                           f"{out['direct'][k]:.3f}", f"{ratio:.2f}x"])  # fmt: skip
    later = [out["served"][k] / out["direct"][k] for k in range(1, chunks)]
    table.ratio = (
        f"chunk 0 served {out['served'][0]:.3f} s; later chunks served median "
        f"{median(out['served'][1:]):.3f} s, "
        f"compute_kv_cache median {median(out['kv']):.3f} s; served/direct median {median(later):.2f}x"
    )
    return table


if __name__ == "__main__":
    print(main("--quick" in sys.argv).markdown())
