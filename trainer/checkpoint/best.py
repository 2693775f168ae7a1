"""The best checkpoint by a held-out metric: kept out of pruning, pointed to by RUN_DIR/checkpoints/best.

    pin = BestPin(root, "val_action_loss")     # checkpoint.best_by
    keep = pin(complete)                        # rank 0, before pruning: {best step}; updates the pointer
    best = find_best(complete, "val_action_loss")   # (CheckpointInfo, value) or None; reading only

Each checkpoint's train_state.json carries the held-out losses measured at its step ("validation":
trainer/loop/validate.py Validation.to_json, None when none was measured). The best is the complete checkpoint
with the lowest value of checkpoint.best_by (the earliest on a tie); it survives resumes because it is
recomputed from the checkpoints themselves, and it is never pruned by checkpoint.keep (a run keeps its
newest `keep` checkpoints plus the best when that is older: at most keep + 1).

The pointer is a relative symlink `best -> checkpoint_step_N`, replaced atomically (a new link under a
temporary name, then rename(2) over the old one): a reader sees the old best or the new one, never
neither, and `RUN_DIR/checkpoints/best/` opens like any checkpoint directory (model.safetensors,
transformer/ for the simulator), also after the run dir is copied or moved (relative). It is not a
checkpoint: the layout's patterns (trainer/checkpoint/layout.py) match only checkpoint_step_N*, and
pruning never follows a symlink (checkpointer.py). With no measured checkpoint the pointer is
removed rather than left pointing at a pruned directory.

By simulator success rate (eval.best_by sim, `best_by_of(cfg)` = "sim"): the complete checkpoint with the
highest success rate among the finished evaluations of RUN_DIR/evaluation/sim.json (simrecords.py; the
earliest on a tie), recomputed by rank 0 at every save and by the launcher after every evaluation. BestPin
also keeps the checkpoints under evaluation (simrecords.pinned_steps) out of pruning.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from trainer.checkpoint import simrecords
from trainer.checkpoint.layout import TRAIN_STATE, CheckpointInfo

POINTER = "best"
_METRIC_KEYS = {"val_action_loss": "action_loss", "val_latent_loss": "latent_loss", "val_loss": "loss"}
SIM = "sim"  # eval.best_by: the simulator's success rate (higher is better)


def best_by_of(cfg: Any) -> str:
    """The metric that picks the best checkpoint: eval.best_by sim, else checkpoint.best_by."""
    return SIM if cfg.eval.best_by == SIM else cfg.checkpoint.best_by


def measured(info: CheckpointInfo, best_by: str) -> float | None:
    """The checkpoint's held-out `best_by` value, or None when it was not measured (or unreadable)."""
    try:
        validation = json.loads((info.path / TRAIN_STATE).read_text()).get("validation")
        value = validation[_METRIC_KEYS[best_by]] if isinstance(validation, dict) else None
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def find_best(complete: list[CheckpointInfo], best_by: str) -> tuple[CheckpointInfo, float] | None:
    """The complete checkpoint with the lowest measured `best_by` (earliest on a tie), with its value;
    for "sim" the highest success rate (earliest on a tie)."""
    if best_by == SIM and complete:
        rates = simrecords.success_rates(complete[0].path.parent)
        scored = [(c, rates[c.step]) for c in sorted(complete, key=lambda c: c.step) if c.step in rates]
        return max(scored, key=lambda pair: pair[1]) if scored else None
    if best_by not in _METRIC_KEYS:
        return None
    best: tuple[CheckpointInfo, float] | None = None
    for info in sorted(complete, key=lambda c: c.step):
        value = measured(info, best_by)
        if value is not None and (best is None or value < best[1]):
            best = (info, value)
    return best


def point(root: Path, target: CheckpointInfo | None) -> None:
    """Make root/best a relative symlink to `target` atomically (remove it when target is None)."""
    link = Path(root) / POINTER
    if target is None:
        if link.is_symlink():
            link.unlink()
        return
    if link.is_symlink() and os.readlink(link) == target.path.name:
        return
    tmp = link.with_name(f".{POINTER}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target.path.name, tmp)
    os.replace(tmp, link)


def best_json(root: Path, complete: list[CheckpointInfo], best_by: str) -> dict[str, Any] | None:
    """summary.json's best_checkpoint: {step, path, pointer, metric, value}, or None."""
    found = find_best(complete, best_by)
    if found is None:
        return None
    info, value = found
    return {
        "step": info.step,
        "path": str(info.path),
        "pointer": str(Path(root) / POINTER),
        "metric": "sim_success_rate" if best_by == SIM else best_by,
        "value": value,
    }


class BestPin:
    """Checkpointer.pin: called by rank 0 before pruning with the complete checkpoints; points `best` at
    the best one and returns its step plus the steps under simulator evaluation (the steps pruning must
    keep)."""

    def __init__(self, root: Path, best_by: str):
        self.root, self.best_by = Path(root), best_by

    def __call__(self, complete: list[CheckpointInfo]) -> set[int]:
        # the pins before the records: the launcher writes a checkpoint's record, then unpins it, so a
        # checkpoint scored meanwhile is seen pinned or scored (records first, it could be neither: pruned)
        pinned = simrecords.pinned_steps(self.root)
        found = find_best(complete, self.best_by)
        point(self.root, found[0] if found else None)
        return ({found[0].step} if found else set()) | pinned


__all__ = ["POINTER", "SIM", "BestPin", "best_by_of", "best_json", "find_best", "measured", "point"]
