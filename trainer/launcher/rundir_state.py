"""What a run dir's checkpoints say before a launch: damaged ones moved aside, a finished run recognised.

    damaged = quarantine(run_dir, node_rank)            # [Damaged as JSON]; PreflightError: refuse
    code = finished(run_dir, cfg, world_size, started)  # EXIT_OK: nothing to train; None: train

A `best` that is a folder (a run dir copied with `cp -L`) refuses the launch, naming the fix. Node 0 moves
every damaged checkpoint aside (never deletes it) and names each; the ranks then resume from
the newest intact one. One that cannot be moved (a read-only checkpoints dir) refuses the launch: left in
place it would be resumed from, or counted as the finished run. A run whose newest intact checkpoint is the
requested step is finished, but only for the config that trained it: a rerun whose settings conflict with
that checkpoint's (another model, seed, world size; the same rule a resume applies) is refused, not
reported complete.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from trainer.attempt import EXIT_OK, summary_path
from trainer.checkpoint.best import POINTER
from trainer.checkpoint.layout import MARKER, DamagedInPlace, quarantine_damaged, resume_conflicts, scan
from trainer.config import RunConfig
from trainer.launcher.console import say
from trainer.launcher.errors import PreflightError
from trainer.launcher.summaries import settle_finished_run


def quarantine(run_dir: Path, node_rank: int) -> list[dict[str, Any]]:
    best = run_dir / "checkpoints" / POINTER
    if best.exists() and not best.is_symlink():  # every node: no rank may start on it
        raise PreflightError(
            f"{best} is a folder, not the link bin/train keeps to the best checkpoint (a copy made with "
            f"`cp -L` or `rsync -L`?): its re-pointing would fail after the last save, and bin/evaluate and "
            f"bin/serve would read it as the best; remove it (`rm -r {best}`; the checkpoint it copies is "
            "still there) and the next run points it again"
        )
    if node_rank != 0:
        return []
    try:
        moved = quarantine_damaged(run_dir / "checkpoints")
    except DamagedInPlace as exc:
        raise PreflightError(str(exc)) from None
    except OSError as exc:  # not even listed or read: the ranks' own checks still refuse a bad one
        say(f"could not look through the checkpoints in {run_dir / 'checkpoints'}: {exc}")
        return []
    for d in moved:
        say(f"damaged checkpoint {d.path}: {d.problem}; moved aside to {d.moved_to} (not deleted)")
    complete, _ = scan(run_dir / "checkpoints")
    if complete and not _has_checksums(complete[-1].path):  # never unsaid: a flipped byte goes unseen
        say(
            f"checkpoint {complete[-1].path}: its {MARKER} lists no sha256 (an older or hand-made marker): "
            "its files are checked by size only"
        )
    return [dataclasses.asdict(d) for d in moved]


def _has_checksums(path: Path) -> bool:
    try:
        return bool(json.loads((path / MARKER).read_text()).get("sha256"))
    except (OSError, ValueError, AttributeError):
        return True  # unreadable: the ranks' own checks refuse it, named


def finished(run_dir: Path, cfg: RunConfig, world_size: int, started: float) -> int | None:
    complete, _ = scan(run_dir / "checkpoints")
    if not complete or complete[-1].step < cfg.train.steps:
        return None
    latest = complete[-1]
    conflicts = resume_conflicts(latest.train_state(), cfg, world_size)
    if conflicts:
        raise PreflightError(f"{latest.path} finished another run's settings: {'; '.join(conflicts)}")
    settle_finished_run(run_dir, cfg, latest, started)
    say(
        f"run complete: {latest.path} is step {latest.step} of {cfg.train.steps}; nothing to train "
        f"(summary: {summary_path(run_dir)}; raise train.steps with --set to train further)"
    )
    return EXIT_OK
