"""A tiny random-weight Wan2.2 VAE (diffusers' AutoencoderKLWan with the released model's structure: residual
blocks, temporal downsampling x4, patch 2, spatial x16, 4 latent channels instead of 48), saved as a folder
like the released model's vae/. Shared by the data and streaming tests."""

from __future__ import annotations

import torch


def make_tiny_vae(folder):
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=8,
        decoder_base_dim=8,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        is_residual=True,
        in_channels=12,
        out_channels=12,
        patch_size=2,
        scale_factor_temporal=4,
        scale_factor_spatial=16,
        latents_mean=[0.1, -0.2, 0.3, 0.0],
        latents_std=[2.0, 1.5, 1.0, 0.5],
    )
    vae.save_pretrained(folder)  # type: ignore[attr-defined]
    return vae
