"""A LingBot-VA-style video-action world model: one transformer over a packed, interleaved sequence.

Per micro-batch (see trainer/masks.py for the token order and the mask):
    noisy video latents | clean video latents | noisy actions | clean actions | padding
with separate input embedders, timestep embedders (adaLN modulation per token, from per-frame flow
levels) and output heads for video and action, 3-axis RoPE (time, row, column), and one attention
mask built once per forward and shared by every block. Flow-matching losses on the noisy streams.

Left out on purpose: the text cross-attention (FurnitureBench one_leg is a single task without
language), KV caches and inference. The structure that decides cost (the packed sequence, the mask,
per-token modulation, FSDP units per block) is LingBot-VA's.

    model = WorldModel(cfg)
    out = model(batch)                  # batch from trainer.data.build_stream(...).micro_batch(step, micro)
    out["loss"].backward()              # out: loss = latent_loss + action_loss (not divided by grad_accum)
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from trainer.attention import BoundAttention, make_backend, resolve_backend
from trainer.losses import action_loss, add_noise, latent_loss, velocity_target
from trainer.masks import lingbot_mask_mod, mask_density, sequence_shape, token_layout

FREQ_DIM = 256  # sinusoidal timestep features, as Wan
ROPE_THETA = 10000.0


def _layer_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # in fp32 whatever the compute dtype, as LingBot-VA's FP32LayerNorm
    return F.layer_norm(x.float(), x.shape[-1:], eps=eps).type_as(x)


class TimestepEmbedder(nn.Module):
    """Flow level sigma in [0, 1] -> (temb, 6 modulation vectors); one per stream (video, action)."""

    def __init__(self, dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FREQ_DIM, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.to_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        half = FREQ_DIM // 2
        freqs = torch.exp(
            -math.log(10000.0) * torch.arange(half, device=sigma.device, dtype=torch.float32) / half
        )
        angles = (sigma.float() * 1000.0)[..., None] * freqs
        features = torch.cat([angles.cos(), angles.sin()], dim=-1)
        dtype = self.mlp[0].weight.dtype
        temb = self.mlp(features.to(dtype))
        return temb, self.to_modulation(temb).unflatten(-1, (6, -1))


def rope_tables(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (L, 3) float (time, row, col) -> cos, sin of shape (L, head_dim // 2)."""
    axis = 2 * (head_dim // 6)  # row and column get `axis` dims each, time the rest (all even)
    dims = (head_dim - 2 * axis, axis, axis)
    angles = []
    for i, d in enumerate(dims):
        inv = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d))
        angles.append(positions[:, i : i + 1].float() * inv)
    angles = torch.cat(angles, dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, D): rotate consecutive pairs of channels."""
    x2 = x.float().unflatten(-1, (-1, 2))
    a, b = x2[..., 0], x2[..., 1]
    out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)
    return out.flatten(-2).type_as(x)


class WorldBlock(nn.Module):
    """Self-attention + MLP, both modulated per token (shift, scale, gate) by the timestep embedding."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.norm_q = nn.RMSNorm(dim, eps=1e-6)
        self.norm_k = nn.RMSNorm(dim, eps=1e-6)
        self.proj = nn.Linear(dim, dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim))
        self.modulation = nn.Parameter(torch.randn(1, 1, 6, dim) / dim**0.5)

    def forward(self, x, modulation, rope_cos, rope_sin, attn: BoundAttention) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation + modulation).unbind(dim=2)
        h = _layer_norm(x) * (1 + scale1) + shift1
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        q, k = self.norm_q(q), self.norm_k(k)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))  # (B, H, L, D)
        q, k = apply_rope(q, rope_cos, rope_sin), apply_rope(k, rope_cos, rope_sin)
        o = attn(q, k, v).transpose(1, 2).flatten(-2)
        x = x + self.proj(o) * gate1
        h = _layer_norm(x) * (1 + scale2) + shift2
        return x + self.mlp(h) * gate2


class WorldModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        m = cfg.model
        self.cfg = cfg
        self.shape = sequence_shape(cfg)
        self.patch, self.dim = m.patch, m.dim
        patch_dim = m.latent_channels * m.patch * m.patch
        self.patch_embed = nn.Linear(patch_dim, m.dim)
        self.action_embed = nn.Linear(m.action_dim, m.dim)
        self.video_time = TimestepEmbedder(m.dim)
        self.action_time = TimestepEmbedder(m.dim)
        self.blocks = nn.ModuleList(WorldBlock(m.dim, m.heads, m.mlp_ratio) for _ in range(m.depth))
        self.head_modulation = nn.Parameter(torch.randn(1, 1, 2, m.dim) / m.dim**0.5)
        self.video_out = nn.Linear(m.dim, patch_dim)
        self.action_out = nn.Linear(m.dim, m.action_dim)
        self.apply(self._init_weights)
        self._backend = None
        self._backend_device: str | None = None
        self.attention_name: str | None = None
        self.attention_reason: str | None = None

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)

    # -- attention backend -------------------------------------------------------------------------
    def set_attention_backend(self, name: str, compiled: bool = True, reason: str = "set explicitly") -> None:
        """Override resolve_backend's choice (tests, benchmarks)."""
        self._backend = make_backend(name, self.cfg.model.attn_block, compiled=compiled)
        self._backend_device = "any"
        self.attention_name, self.attention_reason = name, reason

    def _backend_for(self, device: torch.device):
        if self._backend is None or self._backend_device not in ("any", device.type):
            name, reason = resolve_backend(self.cfg, device)
            self._backend = make_backend(name, self.cfg.model.attn_block)
            self._backend_device = device.type
            self.attention_name, self.attention_reason = name, reason
        return self._backend

    # -- sequence pieces ---------------------------------------------------------------------------
    def _patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, F, C, S, S) -> (B, F * (S/p)^2, C * p * p), frame-major, rows then columns."""
        b, f, c, s, _ = x.shape
        p, n = self.patch, s // self.patch
        x = x.reshape(b, f, c, n, p, n, p).permute(0, 1, 3, 5, 2, 4, 6)
        return x.reshape(b, f * n * n, c * p * p)

    def _unpatchify(self, tokens: torch.Tensor, b: int, f: int, c: int, s: int) -> torch.Tensor:
        p, n = self.patch, s // self.patch
        x = tokens.reshape(b, f, n, n, c, p, p).permute(0, 1, 4, 2, 5, 3, 6)
        return x.reshape(b, f, c, s, s)

    @functools.cache  # noqa: B019 - a handful of (batch, pad, device) keys per run
    def _positions(self, batch_size: int, pad: int, device: torch.device) -> torch.Tensor:
        """(L, 3) RoPE positions: video (frame, row, col); actions (frame + step/apf, 0, 0); pad 0."""
        s = self.shape
        side = int(math.isqrt(s.tokens_per_frame))
        frame = torch.arange(s.frames, device=device, dtype=torch.float32)
        cell = torch.arange(s.tokens_per_frame, device=device)
        video = torch.stack(
            [
                frame.repeat_interleave(s.tokens_per_frame),
                (cell // side).float().repeat(s.frames),
                (cell % side).float().repeat(s.frames),
            ],
            dim=-1,
        ).repeat(batch_size, 1)
        steps = torch.arange(s.action_tokens, device=device, dtype=torch.float32) / s.actions_per_frame
        action = torch.stack([steps, torch.zeros_like(steps), torch.zeros_like(steps)], dim=-1).repeat(
            batch_size, 1
        )
        return torch.cat([video, video, action, action, torch.zeros(pad, 3, device=device)])

    @staticmethod
    def _pack(parts: list[torch.Tensor], pad: int) -> torch.Tensor:
        """(B, n_i, ...) pieces -> one (1, sum B*n_i + pad, ...) sequence, samples after each other."""
        flat = [p.reshape(1, -1, *p.shape[2:]) for p in parts]
        if pad:
            flat.append(flat[0].new_zeros(1, pad, *flat[0].shape[2:]))
        return torch.cat(flat, dim=1)

    # -- forward -----------------------------------------------------------------------------------
    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        x, a, amask = batch["latents"], batch["actions"], batch["action_mask"]
        b, f, c, s, _ = x.shape
        apf = self.shape.actions_per_frame
        if f != self.shape.frames or a.shape[1] != f * apf:
            raise ValueError(
                f"batch has {f} frames / {a.shape[1]} actions; the model was built for "
                f"{self.shape.frames} frames x {apf} actions per frame"
            )

        # flow matching inputs and targets (noise and levels come with the batch: forward is deterministic)
        noisy_v = add_noise(x, batch["latent_noise"], batch["latent_sigma"])
        clean_v = add_noise(x, batch["history_noise"], batch["history_sigma"])
        action_sigma_steps = batch["action_sigma"].repeat_interleave(apf, dim=1)
        noisy_a = add_noise(a, batch["action_noise"], action_sigma_steps) * amask
        target_v = velocity_target(x, batch["latent_noise"])
        target_a = velocity_target(a, batch["action_noise"]) * amask

        layout = token_layout(self.shape, b, batch["frames_per_chunk"], self.cfg.model.attn_block, x.device)
        pad = layout.sections[-1]
        tokens = self._pack(
            [
                self.patch_embed(self._patchify(noisy_v)),
                self.patch_embed(self._patchify(clean_v)),
                self.action_embed(noisy_a),
                self.action_embed(a),
            ],
            pad,
        )

        # per-frame flow levels -> per-token embeddings (clean actions are at level 0)
        temb_v, mod_v = self.video_time(torch.cat([batch["latent_sigma"], batch["history_sigma"]], dim=1))
        temb_a, mod_a = self.action_time(
            torch.cat([batch["action_sigma"], torch.zeros_like(batch["action_sigma"])], dim=1)
        )
        tpf = self.shape.tokens_per_frame

        def per_token(emb, per_frame):
            noisy, clean = (
                emb[:, :f].repeat_interleave(per_frame, 1),
                emb[:, f:].repeat_interleave(per_frame, 1),
            )
            return noisy, clean

        temb = self._pack([*per_token(temb_v, tpf), *per_token(temb_a, apf)], pad)
        modulation = self._pack([*per_token(mod_v, tpf), *per_token(mod_a, apf)], pad)

        head_dim = self.dim // self.cfg.model.heads
        rope_cos, rope_sin = rope_tables(self._positions(b, pad, x.device), head_dim)

        # one mask per micro-batch, shared by every block
        backend = self._backend_for(x.device)
        mask = backend.build_mask(lingbot_mask_mod(layout, batch["window"]), layout.length, x.device)
        attn = BoundAttention(backend, mask)

        h = tokens
        for block in self.blocks:
            h = block(h, modulation, rope_cos, rope_sin, attn)

        shift, scale = (self.head_modulation + temb[:, :, None]).unbind(dim=2)
        h = _layer_norm(h) * (1 + scale) + shift
        n_video, _, n_action, _, _ = layout.sections
        pred_v = self._unpatchify(self.video_out(h[:, :n_video]), b, f, c, s)
        start_a = 2 * n_video
        pred_a = self.action_out(h[:, start_a : start_a + n_action]).reshape(b, f * apf, -1)

        lv = latent_loss(pred_v, target_v)
        la = action_loss(pred_a, target_a, amask, apf)
        return {"loss": lv + la, "latent_loss": lv.detach(), "action_loss": la.detach()}

    # -- accounting --------------------------------------------------------------------------------
    def flops_per_token(self) -> float:
        """Training (forward + backward = 3x forward) model FLOPs per real token.

        Matmuls: 2 x weights seen per token. Attention: 4 x dim per allowed (query, key) pair per layer,
        counted on the LingBot mask at the config's chunk size and window, i.e. the work a sparse
        kernel (flex) must do; the dense sdpa backend does more than this.
        """
        m, s = self.cfg.model, self.shape
        block = sum(
            mod.weight.numel() for blk in self.blocks for mod in blk.modules() if isinstance(mod, nn.Linear)
        )
        video_share = s.video_tokens / (s.video_tokens + s.action_tokens)
        embed = (
            video_share * self.patch_embed.weight.numel()
            + (1 - video_share) * self.action_embed.weight.numel()
        )
        heads = 0.5 * (
            video_share * self.video_out.weight.numel() + (1 - video_share) * self.action_out.weight.numel()
        )
        keys = mask_density(
            s, self.cfg.train.batch_size, self.cfg.data.frames_per_chunk, self.cfg.data.window
        )
        forward = 2 * (block + embed + heads) + 4 * m.dim * keys * m.depth
        return float(3 * forward)
