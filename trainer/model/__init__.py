"""LingBot-VA's transformer for training (network.py, its layers in layers.py), its attention (the LingBot
mask in masks.py, flex/sdpa backends in attention.py), its released-checkpoint I/O (weights.py), its
FSDP2 wrapping (parallel.py: build_model, shard_model) and its parameters as a table (shapes.py).

from trainer.model import WorldModel, export_reference
model = WorldModel(cfg)                       # random init; trainer.model.parallel.build_model loads/shards
out = model(batch)                            # {"loss", "latent_loss", "action_loss"}

The names below are imported on first use (PEP 562), so `trainer.model.shapes` is importable without
torch: the launcher sizes checkpoints from it on a node where it never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.model.network import WorldModel
    from trainer.model.weights import (
        PretrainedError,
        apply_pretrained_config,
        export_reference,
        load_full,
        load_sharded,
    )

_HOME = {
    "WorldModel": "trainer.model.network",
    "PretrainedError": "trainer.model.weights",
    "apply_pretrained_config": "trainer.model.weights",
    "export_reference": "trainer.model.weights",
    "load_full": "trainer.model.weights",
    "load_sharded": "trainer.model.weights",
}

__all__ = [
    "PretrainedError",
    "WorldModel",
    "apply_pretrained_config",
    "export_reference",
    "load_full",
    "load_sharded",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'trainer.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
