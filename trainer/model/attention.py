"""Attention backends behind one interface: `flex` (FlexAttention + BlockMask) and `sdpa` (dense mask).

    backend = make_backend(name, block_size)
    mask = backend.build_mask(mask_mod, length, device)   # once per micro-batch, shared by all layers
    out = backend.attend(q, k, v, mask)                   # q, k, v: (batch, heads, length, head_dim)

Both take the same mask_mod (trainer/model/masks.py). Rows with no allowed key (padding) give zeros in both,
which is what FlexAttention does; sdpa would give NaN there, so it is told to attend everything on
those rows and the result is zeroed.

All layers share one compiled flex_attention (module level), as LingBot-VA does with its class-level
`torch.compile(flex_attention)`: compiling per layer would recompile per layer. Inside a compiled block
(train.compile) the plain flex_attention is called and compiled as part of the block's graph.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.model.masks import dense_mask


class BackendUnavailable(RuntimeError):
    """The requested attention backend cannot train on this device; the message says what to use."""


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    # dynamic=False: the padded length is fixed per config, and static shapes give the best kernels.
    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def flex_backward_error(device_type: str) -> str | None:
    """None if FlexAttention can backpropagate on this device type, else the error it raises.

    Probed with a tiny eager call: on torch 2.13 CPU that raises before any compilation, so the probe
    needs no compiler and takes milliseconds.
    """
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.zeros(1, 1, 16, 8, device=device_type, requires_grad=True)
    try:
        flex_attention(q, q, q).sum().backward()
    except NotImplementedError as exc:
        return f"NotImplementedError: {exc}"
    return None


def resolve_backend(cfg, device: torch.device | str) -> tuple[str, str]:
    """Pick the attention backend for training on `device`; returns (name, reason).

    auto: flex on CUDA; on CPU flex only if this torch can backpropagate through it, else sdpa.
    An explicit `flex` on a device where it cannot train raises BackendUnavailable.
    """
    device = torch.device(device)
    choice = cfg.model.attention
    if choice == "sdpa":
        return "sdpa", "model.attention=sdpa: the LingBot mask_mod materialised as a dense sdpa mask"
    if device.type == "cuda":
        return "flex", f"model.attention={choice}: compiled FlexAttention (Triton) on {device.type}"
    error = flex_backward_error(device.type)
    if choice == "flex":
        if error:
            raise BackendUnavailable(
                f"model.attention=flex cannot train on {device.type} with torch {torch.__version__} "
                f"({error}); use --set model.attention=sdpa (or auto)"
            )
        return "flex", f"model.attention=flex on {device.type}: compiled FlexAttention (Inductor C++)"
    if error:
        return "sdpa", (
            f"model.attention=auto on {device.type}: FlexAttention has no backward here with torch "
            f"{torch.__version__} ({error}); using sdpa with the same mask_mod as a dense mask"
        )
    return "flex", f"model.attention=auto on {device.type}: FlexAttention supports backward here"


@dataclass
class DenseMask:
    allowed: torch.Tensor  # (L, L) bool, True = attend; rows without any key attend all (then zeroed)
    has_key: torch.Tensor  # (L, 1) float: 0 on rows that attend nothing


class SdpaBackend:
    name = "sdpa"

    def build_mask(self, mask_mod, length: int, device) -> DenseMask:
        allowed = dense_mask(mask_mod, length, device)
        has_key = allowed.any(dim=-1, keepdim=True)
        allowed = allowed | ~has_key
        return DenseMask(allowed=allowed, has_key=has_key.float())

    def attend(self, q, k, v, mask: DenseMask) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.allowed)
        return out * mask.has_key.to(out.dtype)


class FlexBackend:
    name = "flex"

    def __init__(self, block_size: int, compiled: bool = True):
        self.block_size = block_size
        self.compiled = compiled

    def build_mask(self, mask_mod, length: int, device):
        from torch.nn.attention.flex_attention import create_block_mask

        return create_block_mask(
            mask_mod, None, None, length, length, device=device, BLOCK_SIZE=self.block_size
        )

    def attend(self, q, k, v, mask) -> torch.Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        if self.compiled and not torch.compiler.is_compiling():
            return _compiled_flex_attention()(q, k, v, block_mask=mask)
        # Inside a compiled block (train.compile) flex_attention is traced into the block's own graph.
        # Contiguous inputs there: Inductor writes the RoPE kernel's output straight in this layout (no
        # extra pass), and its CPU flex template cannot read a view of a concatenation (torch 2.13).
        if torch.compiler.is_compiling():
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()

        return flex_attention(q, k, v, block_mask=mask)


def make_backend(name: str, block_size: int, compiled: bool = True):
    if name == "sdpa":
        return SdpaBackend()
    if name == "flex":
        return FlexBackend(block_size, compiled=compiled)
    raise ValueError(f"unknown attention backend {name!r}: expected flex or sdpa")


class BoundAttention:
    """A backend with this micro-batch's mask: what each block calls as attn(q, k, v)."""

    def __init__(self, backend, mask):
        self.backend = backend
        self.mask = mask

    def __call__(self, q, k, v) -> torch.Tensor:
        return self.backend.attend(q, k, v, self.mask)
