"""Action inference time per chunk, with and without the KV cache (trainer/sampling/sampler.py).

Measured: the cpu_scale model of furniture_train (random weights: time does not depend on them), fp32,
the reference's sampler settings (config `infer`: 5 video + 10 action steps, each loop + its t = 0 pass,
guidance 5 -> two rows), one session of chunks: chunk 0, then observe + sample per chunk. The two
variants alternate chunk by chunk (cache, no cache, cache, ...); "no cache" recomputes the kept history
(every observation so far, and this chunk's predicted video for the action loop) before every pass, which
is what the same numbers cost without a cache. On paper: the same count at the cluster config, in FLOPs.

    .venv/bin/python bench/bench_inference.py [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Table, median  # noqa: E402


def _session(cfg, kv_cache: bool):
    import torch

    from trainer.model import WorldModel
    from trainer.recipe.batch import ACTION_SLOTS, action_slot_mask
    from trainer.sampling.sampler import ChunkSampler

    torch.manual_seed(0)
    model = WorldModel(cfg).eval()
    m, views = cfg.model, len(cfg.data.cameras)
    grid = (m.latent_channels, m.latent_size, m.latent_size * views)
    icfg = type(cfg.infer)(**{**cfg.infer.__dict__, "kv_cache": kv_cache})
    text = torch.randn(2, 16, m.text_dim)
    mask = action_slot_mask(m.action_dim, len(ACTION_SLOTS))
    return ChunkSampler(model, icfg, mask, text[0], text[1], video_grid=grid), grid


def _chunk_times(cfg, chunks: int) -> dict[bool, list[float]]:
    import torch

    samplers = {flag: _session(cfg, flag) for flag in (True, False)}
    g = torch.Generator().manual_seed(1)
    f, n = cfg.infer.frames_per_chunk, cfg.data.actions_per_frame
    times: dict[bool, list[float]] = {True: [], False: []}
    for k in range(chunks):
        for flag, (sampler, grid) in samplers.items():  # alternate: cache, no cache, per chunk
            real = torch.randn(f, *grid, generator=g)
            if k:
                sampler.observe(real, torch.zeros(f * n, cfg.model.action_dim))
            start = time.perf_counter()
            sampler.sample(first_latent=real[0] if k == 0 else None, generator=g)
            times[flag].append(time.perf_counter() - start)
    return times


def paper(cfg, history_chunks: int) -> tuple[float, float]:
    """Forward FLOPs of one chunk (video + action loops, both rows) with / without the cache."""
    m, i = cfg.model, cfg.infer
    views = len(cfg.data.cameras)
    video = i.frames_per_chunk * (m.latent_size // m.patch) ** 2 * views
    action = i.frames_per_chunk * cfg.data.actions_per_frame
    rows = 2 if i.guidance > 1 or i.action_guidance > 1 else 1
    # per token: self-attn q/k/v/o + cross q/o, the MLP, cross-attention over 512 prompt tokens
    per_token = 2 * m.depth * (6 * m.dim * m.dim + 2 * m.dim * m.ffn_dim) + 4 * m.depth * m.dim * 512
    text_kv = 2 * m.depth * 2 * m.dim * m.dim * 512  # the prompt's keys and values, once per pass

    def passes(tokens: int, count: int, keys: int) -> float:
        return count * rows * (tokens * per_token + text_kv + 4 * m.depth * m.dim * tokens * keys)

    history = history_chunks * (video + action)
    v_passes, a_passes = i.video_steps + 1, i.action_steps + 1
    cached = passes(video, v_passes, history + video) + passes(action, a_passes, history + video + action)
    # without a cache every pass first recomputes the history (each chunk attending its own past)
    replay = sum(passes(video + action, 1, (c + 1) * (video + action)) for c in range(history_chunks))
    uncached = cached + v_passes * replay + a_passes * (replay + passes(video, 1, history + video))
    return cached, uncached


def run(quick: bool = False) -> list[Table]:
    import os

    import torch

    from trainer.config import load_config

    torch.set_num_threads(int(os.environ.get("LINGBOT_BENCH_THREADS", "2")))
    cfg = load_config("furniture_train", True)
    chunks = 4 if quick else 6
    times = _chunk_times(cfg, chunks)
    rows = [[k, times[True][k], times[False][k], times[False][k] / times[True][k]] for k in range(chunks)]
    later = [r[3] for r in rows[1:]]
    load = os.getloadavg()[0]
    measured = Table(
        "Inference time per chunk, cpu_scale (dim 128, 4 layers, 2 views 12x24 latents), fp32, CPU",
        ["chunk", "with KV cache (s)", "without (s)", "without / with"],
        rows,
        ratio=f"the cache wins from chunk 1 on: median {median(later):.2f}x, growing with the history",
        notes=[
            f"infer: {cfg.infer.video_steps} video + {cfg.infer.action_steps} action steps, guidance "
            f"{cfg.infer.guidance} (2 rows), {cfg.infer.frames_per_chunk} frames per chunk; "
            f"load avg {load:.1f}",
            "chunk 0 has no observed history, but without the cache the action loop still recomputes this "
            "chunk's predicted video before each of its passes",
        ],
    )
    full = load_config("furniture_train", False)
    prow = []
    for h in (1, 4, full.infer.window // 2):
        c, u = paper(full, h)
        prow.append([h, c / 1e12, u / 1e12, u / c])
    title = "On paper, cluster config (dim 3072, 30 layers, 2 views 16x32 latents, chunk 4 x 528 tokens)"
    saves = f"at a full window ({full.infer.window // 2} chunks) the cache saves {prow[-1][3]:.0f}x the FLOPs"
    on_paper = Table(
        title + ", per chunk",
        ["history chunks", "with KV cache (TFLOP)", "without (TFLOP)", "without / with"],
        prow,
        ratio=saves,
        notes=["forward FLOPs: block matmuls (2 x weights per token), text keys/values, attention 4 x dim "
               "per (query, key) pair; both CFG rows; divide by the GPU's sustained bf16 FLOP/s for seconds"],
    )  # fmt: skip
    return [measured, on_paper]


if __name__ == "__main__":
    for table in run("--quick" in sys.argv):
        print(table.markdown())
