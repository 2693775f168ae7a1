"""The summaries the launcher writes (RUN_DIR/summary.json through trainer.attempt.Summary): a preflight
failure, `running` before any rank starts, a finished run settled, and the final verdict."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from trainer.attempt import (
    COMPLETED,
    EXIT_PREFLIGHT,
    PREFLIGHT_FAILED,
    RUNNING,
    Attempt,
    CheckpointRef,
    Summary,
    read_summary,
    summary_path,
    write_summary,
)
from trainer.checkpoint import scan
from trainer.config import RunConfig
from trainer.diskspace import OutOfSpace, guard
from trainer.launcher.console import say
from trainer.launcher.resolved import Launch
from trainer.launcher.verdict import Verdict


def _ckpt_json(info: object) -> dict[str, object] | None:
    ref = CheckpointRef.of(info)
    return dataclasses.asdict(ref) if ref else None


def preflight_failed(run_dir: Path, cfg: RunConfig, message: str, started: float) -> int:
    """Say why, and record it in summary.json (no checkpoint or attempt is touched: not progress)."""
    say(f"preflight failed: {message}")
    before = read_summary(run_dir)
    previous = before.to_json(stamp=False) if before else None
    if before and before.status == PREFLIGHT_FAILED:
        previous = before.previous  # keep the last run that trained, not a chain of failures
    complete, _ = scan(run_dir / "checkpoints")
    try:
        write_summary(
            run_dir,
            Summary(
                PREFLIGHT_FAILED,
                steps_requested=cfg.train.steps,
                reason=message,
                last_complete_checkpoint=_ckpt_json(complete[-1]) if complete else None,
                wall_time_s=time.perf_counter() - started,
                previous_status=previous.get("status") if previous else None,
                previous=previous,  # the last real run's outcome (losses, steps) is kept, not overwritten
                config=cfg.name,
            ),
        )
    except OSError as exc:
        say(f"could not write the summary: {exc}")
    return EXIT_PREFLIGHT


def settle_finished_run(run_dir: Path, cfg: RunConfig, latest: Any, started: float) -> None:
    """The last checkpoint is the requested step, but summary.json does not say completed (an attempt
    died after that save, e.g. out of space while writing the summary): make it say so."""
    before = read_summary(run_dir)
    if before is not None and before.status == COMPLETED:
        return
    try:
        losses = latest.train_state().get("losses")
        write_summary(
            run_dir,
            Summary(
                COMPLETED,
                steps_requested=cfg.train.steps,
                reason=f"checkpoint step {latest.step} is complete; summary.json said "
                f"{before.status if before else 'nothing'} (an attempt ended after that save)",
                last_complete_checkpoint=_ckpt_json(latest),
                final_losses=losses,
                wall_time_s=time.perf_counter() - started,
                config=cfg.name,
                previous_status=before.status if before else None,
                previous=before.to_json(stamp=False) if before else None,
            ),
        )
    except (OSError, ValueError) as exc:
        say(f"could not update {summary_path(run_dir)}: {exc}")


def write_running_summary(launch: Launch, attempt: Attempt) -> None:
    before = read_summary(launch.run_dir)
    previous = before.to_json(stamp=False) if before else None
    if before and before.status in (PREFLIGHT_FAILED, RUNNING) and before.previous:
        previous = before.previous  # the last attempt that got further than this
    write_summary(
        launch.run_dir,
        Summary(
            RUNNING,
            steps_requested=launch.cfg.train.steps,
            reason=f"attempt {attempt.id} is in progress (or died without a verdict)",
            attempt=attempt.id,
            config=launch.cfg.name,
            nnodes=launch.rdzv.nnodes,
            world_size=launch.world_size,
            damaged_checkpoints=launch.damaged,
            previous_status=before.status if before else None,
            previous=previous,
        ),
    )


def write_final_summary(
    launch: Launch, attempt: Attempt, result: Verdict, rc: int, exit_code: int, started: float
) -> bool:
    """summary.json as the launcher sees the outcome: rank 0's summary (if this attempt wrote one) plus
    the verdict, the exit code, torchrun's exit status and the launcher's wall time. False (said on
    stderr) when it cannot be written: summary.json then still says `running`, never a success."""
    base = read_summary(launch.run_dir)
    if base is None or base.attempt != attempt.id or base.status == RUNNING:  # rank 0 wrote none
        progress = attempt.read_progress()
        complete, _ = scan(launch.run_dir / "checkpoints")
        base = Summary(
            result.status,
            steps_requested=launch.cfg.train.steps,
            first_step=progress.first_step,
            last_step=progress.last_step,
            resumed_from=progress.resumed_from,
            final_losses=progress.final_losses,
            last_complete_checkpoint=_ckpt_json(complete[-1]) if complete else None,
        )
    summary = dataclasses.replace(
        base,
        status=result.status,
        steps_requested=launch.cfg.train.steps,
        reason=result.reason,
        exit_code=exit_code,
        failed_rank=result.failed_rank,
        rank_error=result.rank_error,
        wall_time_s=time.perf_counter() - started,
        torchrun_exit_code=rc,
        notes=result.notes,
        out_of_space=result.out_of_space,
        hung=result.hung,
        damaged_checkpoints=launch.damaged,
        attempt=attempt.id,
        nnodes=launch.rdzv.nnodes,
        world_size=launch.world_size,
        env={"prefix": str(launch.choice.prefix), "provisioned": launch.choice.provisioned},
        config=launch.cfg.name,
    )
    try:
        with guard(summary_path(launch.run_dir), "summary write", needed=len(str(summary.to_json()))):
            write_summary(launch.run_dir, summary)
    except OSError as exc:
        why = f"{exc.report.mount_point} is full" if isinstance(exc, OutOfSpace) else str(exc)
        say(
            f"could not write the summary ({result.status}, exit {exit_code}): {why}; "
            f"{summary_path(launch.run_dir)} still says running (this attempt), never a success"
        )
        return False
    return True
