"""The inference forward of WorldModel: one chunk of video OR action tokens against the KV cache.

Training (network.py) packs noisy video, clean video, noisy actions and clean actions of a clip into one
masked sequence. Inference, as the reference runs it (wan_va/modules/model.py `forward`, not
`forward_train`), feeds one kind of token at a time for the current chunk, for every row of a batch (rows =
the prompt and the empty prompt under classifier-free guidance), and the self-attention of every block
attends the layer's KV cache plus the chunk itself without a mask (trainer/model/kv_cache.py says what is
written and kept). The weights and layers are WorldModel's; nothing here changes training.

    out = stream_forward(model, "video", x, t, frame_start, text, cache, keep="none")
      x     video: [rows, F, C, H, W] latents (the views side by side); action: [rows, F*N, A]
      t     [rows, F] timesteps on the 0..1000 scale, one per frame (0 = a conditioning frame)
      text  [rows, L, text_dim] prompt embeddings (all L positions attended, as the reference)
      keep  none (denoising pass) | pred (the extra t = 0 pass) | real (history from observations)
    -> video: the velocity [rows, F, C, H, W]; action: [rows, F*N, A]

RoPE positions follow training's (network.py): frame f of the chunk is at frame_start + f; the j-th of N
actions of a frame sits at f + (j+1)/(N+1), -1, -1 (recipe.action_rope=reference) or f + j/N, 0, 0.
"""

from __future__ import annotations

import torch

from trainer.model.kv_cache import KVCache
from trainer.model.layers import CrossContext, fp32_layer_norm, rope_tables

KINDS = ("video", "action")


def stream_positions(model, kind: str, frames: int, rows: int, cols: int, frame_start: int) -> torch.Tensor:
    """(L, 3) float32 RoPE positions of one chunk's tokens of `kind` (rows/cols: video patch grid)."""
    f = torch.arange(frame_start, frame_start + frames, dtype=torch.float32)
    if kind == "video":
        ff, hh, ww = torch.meshgrid(f, torch.arange(rows).float(), torch.arange(cols).float(), indexing="ij")
        return torch.stack([ff, hh, ww], dim=-1).reshape(-1, 3)
    n = model.apf
    frame = f.repeat_interleave(n)
    j = torch.arange(n, dtype=torch.float32).repeat(frames)
    if model.cfg.recipe.action_rope == "reference":
        return torch.stack([frame + (j + 1) / (n + 1), -torch.ones_like(j), -torch.ones_like(j)], -1)
    return torch.stack([frame + j / n, torch.zeros_like(j), torch.zeros_like(j)], -1)


def _embed(model, kind: str, x: torch.Tensor, dtype) -> tuple[torch.Tensor, int, int]:
    """Tokens [rows, L, D] of the chunk, and the per-frame token count and patch columns."""
    if kind == "video":
        _, _, _, hh, ww = x.shape
        p = model.patch
        return model.patch_embedding_mlp(model._patchify(x).to(dtype)), (hh // p) * (ww // p), ww // p
    return model.action_embedder(x.to(dtype)), model.apf, 1


@torch.no_grad()
def stream_forward(
    model,
    kind: str,
    x: torch.Tensor,
    timesteps: torch.Tensor,
    frame_start: int,
    text: torch.Tensor,
    cache: KVCache,
    keep: str = "none",
) -> torch.Tensor:
    """One cached forward of the chunk (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"stream_forward: kind {kind!r}, expected video or action")
    rows_b, frames = timesteps.shape
    dtype = model.patch_embedding_mlp.weight.dtype
    h, per_frame, cols = _embed(model, kind, x, dtype)
    embedder = model.condition_embedder if kind == "video" else model.condition_embedder_action
    temb, proj = embedder(timesteps.reshape(-1).float(), h.dtype)  # one per (row, frame)
    temb = temb.reshape(rows_b, frames, 1, -1).expand(-1, -1, per_frame, -1).reshape(rows_b, -1, model.dim)
    proj = proj.float().reshape(rows_b, frames, 1, 6, -1).expand(-1, -1, per_frame, -1, -1)
    modulation = proj.reshape(rows_b, -1, 6, model.dim)

    positions = stream_positions(model, kind, frames, per_frame // cols, cols, frame_start)
    rope_cos, rope_sin = rope_tables(positions.to(x.device), model.head_dim)
    cross = CrossContext(model.condition_embedder.text_embedder(text.to(h.dtype)), None, None)
    cache.set_keep(keep)
    for block, layer in zip(model.blocks, cache.layers, strict=True):
        h = block(h, modulation, rope_cos, rope_sin, layer.attend, cross)
    cache.set_keep("none")

    shift, scale = (model.scale_shift_table[None] + temb[:, :, None]).unbind(dim=2)
    h = (fp32_layer_norm(h, model.eps) * (1 + scale) + shift).type_as(h)
    if kind == "action":
        return model.action_proj_out(h)
    return model._unpatchify(model.proj_out(h), x.shape)
