"""The layers of LingBot-VA's transformer (the released `WanTransformer3DModel`), with the released
parameter names: fp32 LayerNorms, the time/text condition embedders, attention with RMSNorm'd q/k and
3-axis RoPE, the tanh-GELU MLP and the modulated TransformerBlock. trainer/model/network.py assembles
them into WorldModel (and documents the whole architecture); nothing here knows about batches or losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.attention import BoundAttention

ROPE_THETA = 10000.0


def fp32_layer_norm(x: torch.Tensor, eps: float, weight=None, bias=None) -> torch.Tensor:
    """LayerNorm computed in fp32 (diffusers FP32LayerNorm), result in fp32."""
    w = weight.float() if weight is not None else None
    b = bias.float() if bias is not None else None
    return F.layer_norm(x.float(), x.shape[-1:], w, b, eps)


class AffineFP32LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp32_layer_norm(x, self.eps, self.weight, self.bias)


class TimestepEmbedding(nn.Module):
    def __init__(self, freq_dim: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(freq_dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class TextProjection(nn.Module):
    def __init__(self, text_dim: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(text_dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.gelu(self.linear_1(x), approximate="tanh"))


def timestep_features(timesteps: torch.Tensor, freq_dim: int) -> torch.Tensor:
    """Sinusoidal features [cos | sin] of timesteps (0..1000), as diffusers Timesteps(flip_sin_to_cos)."""
    half = freq_dim // 2
    exponent = -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / half
    angles = timesteps.float()[:, None] * torch.exp(exponent)[None]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class ConditionEmbedder(nn.Module):
    """Timesteps -> (temb [n, D], time projection [n, 6, D]); prompts -> text tokens [.., D]."""

    def __init__(self, dim: int, freq_dim: int, text_dim: int):
        super().__init__()
        self.freq_dim = freq_dim
        self.time_embedder = TimestepEmbedding(freq_dim, dim)
        self.time_proj = nn.Linear(dim, 6 * dim)
        self.text_embedder = TextProjection(text_dim, dim)

    def forward(self, timesteps: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        feats = timestep_features(timesteps, self.freq_dim).to(self.time_embedder.linear_1.weight.dtype)
        temb = self.time_embedder(feats).to(dtype)
        proj = self.time_proj(F.silu(temb))
        return temb, proj.unflatten(-1, (6, -1))


class Attention(nn.Module):
    """Self- (rope given) or cross-attention with RMSNorm'd queries and keys over the whole inner dim."""

    def __init__(self, dim: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])
        self.norm_q = nn.RMSNorm(dim, eps=eps)
        self.norm_k = nn.RMSNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor, context: torch.Tensor, attend, rope=None) -> torch.Tensor:
        q = self.norm_q(self.to_q(x)).unflatten(-1, (self.heads, -1))  # (1, L, H, hd)
        k = self.norm_k(self.to_k(context)).unflatten(-1, (self.heads, -1))
        v = self.to_v(context).unflatten(-1, (self.heads, -1))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (1, H, L, hd)
        return self.to_out[0](out.transpose(1, 2).flatten(-2).type_as(x))


class FeedForward(nn.Module):
    """ffn.net.0.proj -> tanh-GELU -> ffn.net.2 (diffusers FeedForward 'gelu-approximate' key layout)."""

    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        proj = nn.Module()
        proj.proj = nn.Linear(dim, ffn_dim)
        self.net = nn.ModuleList([proj, nn.Identity(), nn.Linear(ffn_dim, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up, down = self.net[0].proj, self.net[2]
        return down(F.gelu(up(x), approximate="tanh"))  # type: ignore[operator]


@dataclass
class CrossContext:
    """This micro-batch's text tokens [1, B*L, D] and how queries may attend them (None = all)."""

    text: torch.Tensor
    allowed: torch.Tensor | None  # [L_q, B*L] bool; rows with no key attend all and are zeroed
    has_key: torch.Tensor | None  # [L_q, 1]

    def __call__(self, q, k, v) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.allowed)
        return out if self.has_key is None else out * self.has_key.to(out.dtype)


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, heads: int, cross_attn_norm: bool, eps: float):
        super().__init__()
        self.eps = eps
        self.attn1 = Attention(dim, heads, eps)
        self.attn2 = Attention(dim, heads, eps)
        self.norm2: nn.Module = AffineFP32LayerNorm(dim, eps) if cross_attn_norm else nn.Identity()
        self.ffn = FeedForward(dim, ffn_dim)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(self, h, modulation, rope_cos, rope_sin, attn: BoundAttention, cross: CrossContext):
        mod = self.scale_shift_table[None].float() + modulation  # (1, L, 6, D) fp32
        shift, scale, gate, c_shift, c_scale, c_gate = mod.unbind(dim=2)
        x = (fp32_layer_norm(h, self.eps) * (1 + scale) + shift).type_as(h)
        h = (h.float() + self.attn1(x, x, attn, (rope_cos, rope_sin)) * gate).type_as(h)
        x = self.norm2(h.float()).type_as(h)
        h = h + self.attn2(x, cross.text, cross)
        x = (fp32_layer_norm(h, self.eps) * (1 + c_scale) + c_shift).type_as(h)
        return (h.float() + self.ffn(x).float() * c_gate).type_as(h)


def rope_dims(head_dim: int) -> tuple[int, int, int]:
    third = head_dim // 3
    return head_dim - 2 * third, third, third


def rope_tables(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (L, 3) (frame, row, col) -> cos, sin (L, head_dim // 2) for consecutive channel pairs."""
    angles = []
    for axis, d in enumerate(rope_dims(head_dim)):
        inv = 1.0 / ROPE_THETA ** (torch.arange(0, d, 2, device=positions.device)[: d // 2].double() / d)
        angles.append(positions[:, axis : axis + 1].double() * inv)
    theta = torch.cat(angles, dim=-1).float()
    return theta.cos(), theta.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (1, L, H, hd): rotate consecutive channel pairs by the token's angles (cos/sin (L, hd/2))."""
    x2 = x.float().unflatten(-1, (-1, 2))
    a, b = x2[..., 0], x2[..., 1]
    c, s = cos[:, None], sin[:, None]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2).type_as(x)
