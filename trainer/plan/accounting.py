"""Parameter counts and FSDP2 communication bytes of a config (trainer/plan/estimate.py's accounting,
shared with the step-time prediction, trainer/plan/steptime.py).

    counts = _param_counts(cfg)          # (all, trained, in blocks, trained in blocks, flops per token)
    gathered, reduced, wire = comm_bytes(cfg, counts, world_size, param_bytes)
"""

from __future__ import annotations


def _param_counts(cfg) -> tuple[int, int, int, int, float]:
    """(all parameters, trained, in blocks, trained in blocks, flops per token) of cfg's model (meta)."""
    import torch

    from trainer.model import WorldModel

    with torch.device("meta"):
        model = WorldModel(cfg)
    params = list(model.parameters())
    blocks = list(model.blocks.parameters())
    return (
        sum(p.numel() for p in params),
        sum(p.numel() for p in params if p.requires_grad),
        sum(p.numel() for p in blocks),
        sum(p.numel() for p in blocks if p.requires_grad),
        model.flops_per_token(),
    )


def comm_bytes(cfg, counts, world_size: int, param_bytes: int) -> tuple[int, int, float]:
    """(all-gathered bytes, reduce-scattered bytes, wire bytes per rank) of one step (module docstring)."""
    total, trained, in_blocks, _, _ = counts
    t, ga = cfg.train, cfg.train.grad_accum
    root = total - in_blocks
    block_passes = 1 if t.keep_params_gathered else 2 * ga
    root_passes = 1 if t.keep_params_gathered else ga
    gathered = param_bytes * (in_blocks * block_passes + root * root_passes)
    reduced = 4 * trained * (1 if t.grad_sync == "last" else ga)
    if world_size == 1:
        return 0, 0, 0.0
    return gathered, reduced, (gathered + reduced) * (world_size - 1) / world_size
