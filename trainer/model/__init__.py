"""LingBot-VA's transformer for training (network.py, its layers in layers.py), its attention (the LingBot
mask in masks.py, flex/sdpa backends in attention.py), its released-checkpoint I/O (weights.py) and its
FSDP2 wrapping (parallel.py: build_model, shard_model).

from trainer.model import WorldModel, export_reference
model = WorldModel(cfg)                       # random init; trainer.model.parallel.build_model loads/shards
out = model(batch)                            # {"loss", "latent_loss", "action_loss"}
"""

from trainer.model.network import WorldModel
from trainer.model.weights import (
    PretrainedError,
    apply_pretrained_config,
    export_reference,
    load_full,
    load_sharded,
)

__all__ = [
    "PretrainedError",
    "WorldModel",
    "apply_pretrained_config",
    "export_reference",
    "load_full",
    "load_sharded",
]
