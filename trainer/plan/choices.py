"""model.activation_checkpointing=auto: the fastest choice the plan predicts to fit, per GPU kind.

    peaks = ac_peaks(cfg, world_size)                       # {choice: traced peak bytes per rank}
    rows = ac_choices(cfg, world_size, nnodes, kind, peaks)  # [(choice, peak, predicted step s, fits)]
    choice = pick(rows)                                     # fastest that fits; full when none fits

Candidates, fastest first by the step-time model (trainer/plan/steptime.py): none (no recompute), op
(op-level selective: recompute the elementwise work only), block:2 (every other block fully
recomputed), full. Peaks: none, op and full are traced (trainer/plan/memory.py, the same trace as the
plan's); block:2 is interpolated halfway between none and full (its blocks alternate between the two,
each block its own FSDP2 unit, so the activations are the mean of the two; the fixed categories are
equal). The launcher's preflight writes the choice into the attempt's config.json, so every rank runs
the plan's choice; the plan prints every row.
"""

from __future__ import annotations

import copy

CANDIDATES = ("none", "op", "block:2", "full")
TRACED = ("none", "op", "full")


def with_ac(cfg, choice: str):
    out = copy.deepcopy(cfg)
    out.model.activation_checkpointing = choice
    return out


def ac_peaks(cfg, world_size: int) -> dict[str, dict[str, int]]:
    """{choice: the traced peak by category} for every candidate (block:2 interpolated)."""
    from trainer.plan.memory import traced_peak

    peaks = {c: traced_peak(with_ac(cfg, c), world_size, "cuda") for c in TRACED}
    none, full = peaks["none"], peaks["full"]
    peaks["block:2"] = {k: (none[k] + full[k]) // 2 for k in none}
    return peaks


def ac_choices(
    cfg, world_size: int, nnodes: int, kind, peaks, counts=None
) -> list[tuple[str, int, float, bool]]:
    """(choice, peak bytes, predicted step seconds, fits) per candidate, fastest first."""
    from trainer.plan.steptime import predict_step

    usable = kind.memory_bytes * (1 - cfg.plan.margin)
    rows = []
    for choice in CANDIDATES:
        step = predict_step(with_ac(cfg, choice), world_size, nnodes, kind, counts).step_s
        peak = peaks[choice]["total"]
        rows.append((choice, peak, step, peak <= usable))
    return sorted(rows, key=lambda r: r[2])


def pick(rows: list[tuple[str, int, float, bool]]) -> str:
    return next((r[0] for r in rows if r[3]), "full")
