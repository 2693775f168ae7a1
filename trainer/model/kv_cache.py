"""The self-attention key/value cache of chunk-by-chunk inference, kept per layer as the reference keeps it.

Each layer holds a fixed pool of `capacity` token slots, [rows, capacity, heads, head_dim] keys and values
(rows = 2 under classifier-free guidance: the prompt row and the empty-prompt row, each with its own
history), and per slot: in use, the id of the write that filled it, and whether that write was a model
prediction. Semantics (LingBot-VA's WanAttention cache, read from upstream 58c2ae5):

  * every self-attention call writes its keys/values (after RoPE) into free slots, in slot order, under a
    new id = 1 + the largest id in use; the queries then attend every slot in use (the history and
    themselves), with no mask;
  * a call that is not kept (`keep="none"`: a denoising pass) releases its slots afterwards; `"pred"` keeps
    them marked predicted (the extra t = 0 pass after each denoising loop), `"real"` keeps them as observed
    (the history pass on real observations);
  * when too few slots are free, the oldest slots in use (smallest id; ties in slot order) are evicted,
    permanently, before writing, even for a call that is not kept;
  * `drop_predicted()` releases every predicted slot (called when real observations arrive).

capacity = (window // 2) x (video + action tokens per chunk), the reference's create_empty_cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

KEEP_MODES = ("none", "pred", "real")


class LayerKVCache:
    """One layer's slot pool. `attend(q, k, v)` is the self-attention of a cached forward."""

    def __init__(self, rows: int, capacity: int, heads: int, head_dim: int, dtype, device):
        self.k = torch.zeros(rows, capacity, heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.ids = torch.full((capacity,), -1, dtype=torch.long, device=device)
        self.used = torch.zeros(capacity, dtype=torch.bool, device=device)
        self.predicted = torch.zeros(capacity, dtype=torch.bool, device=device)
        self.keep = "none"

    @property
    def capacity(self) -> int:
        return self.used.numel()

    def _allocate(self, n: int) -> torch.Tensor:
        if n > self.capacity:
            raise ValueError(f"KV cache: {n} tokens in one call exceed its capacity of {self.capacity} slots")
        free = (~self.used).nonzero().squeeze(-1)
        if free.numel() < n:
            in_use = self.used.nonzero().squeeze(-1)
            oldest = in_use[torch.argsort(self.ids[in_use], stable=True)[: n - free.numel()]]
            self.used[oldest] = False
            self.ids[oldest] = -1
            free = (~self.used).nonzero().squeeze(-1)
        return free[:n]

    def write(self, key: torch.Tensor, value: torch.Tensor, predicted: bool) -> torch.Tensor:
        """key/value [rows, L, heads, head_dim] into free slots; returns the slots."""
        slots = self._allocate(key.shape[1])
        new_id = self.ids[self.used].max() + 1 if self.used.any() else torch.tensor(0)
        self.k[:, slots] = key.to(self.k.dtype)
        self.v[:, slots] = value.to(self.v.dtype)
        self.used[slots] = True
        self.ids[slots] = new_id
        self.predicted[slots] = predicted
        return slots

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v [rows, heads, L, head_dim] (the layer's own projections) -> attention output."""
        slots = self.write(k.transpose(1, 2), v.transpose(1, 2), predicted=self.keep == "pred")
        valid = self.used.nonzero().squeeze(-1)
        keys, values = self.k[:, valid].transpose(1, 2), self.v[:, valid].transpose(1, 2)
        out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype))
        if self.keep == "none":
            self.used[slots] = False
        return out

    def drop_predicted(self) -> None:
        self.used[self.predicted] = False

    def tokens(self) -> int:
        return int(self.used.sum())


@dataclass
class KVCache:
    """One LayerKVCache per transformer block."""

    layers: list[LayerKVCache]

    @classmethod
    def empty(cls, depth: int, rows: int, capacity: int, heads: int, head_dim: int, dtype, device) -> KVCache:
        return cls([LayerKVCache(rows, capacity, heads, head_dim, dtype, device) for _ in range(depth)])

    def set_keep(self, keep: str) -> None:
        if keep not in KEEP_MODES:
            raise ValueError(f"KV cache keep mode {keep!r}: expected one of {', '.join(KEEP_MODES)}")
        for layer in self.layers:
            layer.keep = keep

    def drop_predicted(self) -> None:
        for layer in self.layers:
            layer.drop_predicted()

    def tokens(self) -> int:
        return self.layers[0].tokens() if self.layers else 0


def cache_capacity(window: int, video_tokens_per_chunk: int, action_tokens_per_chunk: int) -> int:
    """Slots per layer: the reference keeps window // 2 chunks of video and action tokens."""
    return (window // 2) * (video_tokens_per_chunk + action_tokens_per_chunk)
