"""How big one checkpoint is, before any is written: what the preflight's disk-space check compares.

A checkpoint (checkpointer.py) holds fp32 weights of every parameter and AdamW's two fp32 moments
of every trained one (FSDP2 keeps sharded parameters in fp32 under bf16 mixed precision; the bf16 copies
are compute-only; frozen tensors, such as the released-but-never-called action text embedder, have no
optimizer state), one step counter per trained tensor, DCP's .metadata (one entry per tensor chunk and
rank), one RNG file per rank, train_state.json (the config), optionally model.safetensors (fp32 weights
again), and COMPLETE.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from trainer.config import RunConfig

WEIGHT_BYTES = 4  # fp32 master weights
ADAM_BYTES = 8  # exp_avg + exp_avg_sq, fp32
STEP_BYTES = 8  # AdamW's per-tensor step counter
RNG_BYTES_PER_RANK = 14_500  # torch.save of torch/numpy/python RNG states (CPU; CUDA adds ~16 B per GPU)
# Per tensor chunk (weight, exp_avg, exp_avg_sq of each parameter tensor, on each rank): the framing DCP's
# writer puts around each chunk in the .distcp files, and its entry in the pickled .metadata. Measured
# with torch 2.13 at cpu_scale (1.1 M params, 65 tensors, 2 ranks: 390 chunks).
DISTCP_BYTES_PER_ENTRY = 1_900
METADATA_BYTES_PER_ENTRY = 310
COMPLETE_BYTES_PER_FILE = 110  # COMPLETE: name, size and sha256 of each file


@dataclass(frozen=True)
class ModelSize:
    parameters: int
    tensors: int
    trained_parameters: int | None = None  # None: every parameter trains (has optimizer state)
    trained_tensors: int | None = None

    @classmethod
    def of(cls, params: list) -> ModelSize:
        trained = [p for p in params if p.requires_grad]
        return cls(sum(p.numel() for p in params), len(params), sum(p.numel() for p in trained), len(trained))


def model_size(cfg: RunConfig) -> ModelSize:
    """Parameter and tensor counts of the model this config trains, from its parameter table
    (trainer/model/shapes.py: no torch, no model built)."""
    from trainer.model.shapes import parameter_table

    table = parameter_table(cfg.model)
    trained = [p for p in table if p.trained]
    return ModelSize(sum(p.numel for p in table), len(table), sum(p.numel for p in trained), len(trained))


def estimate_bytes(cfg: RunConfig, size: ModelSize, world_size: int) -> int:
    """Bytes of one checkpoint of this config at this world size."""
    trained = size.parameters if size.trained_parameters is None else size.trained_parameters
    trained_tensors = size.tensors if size.trained_tensors is None else size.trained_tensors
    # weight chunks of every tensor, exp_avg + exp_avg_sq chunks of every trained one, per rank; lr schedule
    entries = (size.tensors + 2 * trained_tensors) * world_size + 1
    tensors = size.parameters * WEIGHT_BYTES + trained * ADAM_BYTES + trained_tensors * STEP_BYTES
    tensors += entries * DISTCP_BYTES_PER_ENTRY
    metadata = entries * METADATA_BYTES_PER_ENTRY
    train_state = len(json.dumps({"config": cfg.to_dict()}, indent=2)) + 200
    safetensors = (
        size.parameters * WEIGHT_BYTES + size.tensors * 120 if cfg.checkpoint.export_safetensors else 0
    )
    files = world_size * 2 + 3 + (1 if safetensors else 0)
    complete = files * COMPLETE_BYTES_PER_FILE
    return tensors + metadata + RNG_BYTES_PER_RANK * world_size + train_state + safetensors + complete
