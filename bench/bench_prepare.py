"""Latent-cache preparation throughput: frames/s through `trainer.data.cache.prepare` on this machine, and the
Wan2.2 VAE's encoder FLOPs per frame (released architecture, random weights) for the cluster estimate.

    .venv/bin/python bench/bench_prepare.py [--quick]

1. The whole preparation path (read the collector's .pkl, checksum, encode, write the entry, manifest) on
   a generated collection, once with the patch_mean stand-in and once with a tiny randomly initialised
   AutoencoderKLWan (the tests' size) loaded through the real wan_vae code: frames/s, CPU.
2. FLOPs of the released Wan2.2 VAE encoder architecture (diffusers AutoencoderKLWan with the released
   vae/config.json sizes: base_dim 160, z_dim 48, dim_mult 1,2,4,4, 2 res blocks, patch 2), counted by
   torch.utils.flop_counter on 1 + 4 frames at 128 x 128 on CPU; scaled by pixels to 256 x 256.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Table  # noqa: E402

RELEASED_VAE = dict(  # Wan2.2 TI2V-5B vae/config.json (diffusers), the VAE LingBot-VA encodes with
    base_dim=160,
    decoder_base_dim=256,
    z_dim=48,
    dim_mult=[1, 2, 4, 4],
    num_res_blocks=2,
    temperal_downsample=[False, True, True],
    is_residual=True,
    in_channels=12,
    out_channels=12,
    patch_size=2,
    scale_factor_temporal=4,
    scale_factor_spatial=16,
    latents_mean=[0.0] * 48,
    latents_std=[1.0] * 48,
)
TINY_VAE = dict(
    RELEASED_VAE, base_dim=8, decoder_base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1
)
TINY_VAE.update(latents_mean=[0.0] * 4, latents_std=[1.0] * 4)


def _cfg(root: Path, episodes: int, length: int, **extra):
    from trainer.config import RunConfig, apply_overrides

    cfg = RunConfig()
    apply_overrides(
        cfg,
        {
            "data.path": str(root),
            "data.generated_episodes": episodes,
            "data.generated_length": length,
            "data.cameras": "color_image2,color_image1",
            "data.include_failed": "true",
            "data.text_length": 16,
            **extra,
        },
        "bench",
    )
    return cfg


def prepare_rate(encoder: str, episodes: int, length: int) -> tuple[float, int, float]:
    """(frames/s, frames, seconds) of a full preparation of a fresh generated collection."""
    import torch
    from diffusers import AutoencoderKLWan

    from trainer.data.cache.prepare import prepare
    from trainer.data.stream import ensure_dataset

    with tempfile.TemporaryDirectory() as tmp:
        extra: dict = {"model.latent_channels": 4, "model.latent_size": 8}
        if encoder == "wan_vae":
            torch.manual_seed(0)
            AutoencoderKLWan(**TINY_VAE).save_pretrained(Path(tmp) / "vae")  # type: ignore[attr-defined]
            extra.update({"data.encoder": "wan_vae", "data.vae_path": str(Path(tmp) / "vae")})
            extra["data.actions_per_frame"] = 4
        cfg = _cfg(Path(tmp) / "ds", episodes, length, **extra)
        ensure_dataset(cfg)
        t0 = time.perf_counter()
        done = prepare(cfg, log=lambda line: None)
        seconds = time.perf_counter() - t0
        return done.frames / seconds, done.frames, seconds


def released_vae_flops_per_frame(side: int = 128) -> float:
    import torch
    from diffusers import AutoencoderKLWan
    from torch.utils.flop_counter import FlopCounterMode

    vae = AutoencoderKLWan(**RELEASED_VAE).eval()  # type: ignore[attr-defined]
    x = torch.zeros(1, 3, 5, side, side)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        vae.encode(x)
    return counter.get_total_flops() / 5


def run(quick: bool) -> list[Table]:
    episodes, length = (4, 40) if quick else (8, 80)
    rows: list[list] = []
    rates: list[float] = []
    for name in ("patch_mean", "wan_vae"):
        rate, frames, seconds = prepare_rate(name, episodes, length)
        rates.append(rate)
        rows.append(
            [
                name if name == "patch_mean" else "wan_vae (tiny random AutoencoderKLWan)",
                frames,
                seconds,
                rate,
            ]
        )
    prep = Table(
        "latent-cache preparation on CPU (trainer.data.cache.prepare path, 2 cameras, 224x224 frames)",
        ["encoder", "frames", "seconds", "frames/s"],
        rows,
        ratio=f"tiny wan_vae / patch_mean frames/s: {rates[1] / rates[0]:.3f}x",
        notes=[
            f"{episodes} generated episodes x {length} steps x 2 cameras, include_failed; tiny VAE at 128 px"
        ],
    )
    flops_128 = released_vae_flops_per_frame(128)
    flops_256 = flops_128 * 4
    vae = Table(
        "released Wan2.2 VAE encoder (random weights, diffusers AutoencoderKLWan), FLOPs per frame",
        ["frame side", "GFLOP per frame"],
        [[128, flops_128 / 1e9], [256, flops_256 / 1e9]],
        notes=[
            "counted by torch.utils.flop_counter on 1 + 4 frames; 256 px scaled from 128 px by pixel count"
        ],
    )
    return [prep, vae]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for table in run(args.quick):
        print(table.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
