"""The summaries the launcher writes (RUN_DIR/summary.json through trainer.attempt.Summary): a preflight
failure, a stop before any rank started, `running` before any rank starts, a finished run settled, and
the final verdict. (Rank 0 writes its own at the end of the loop: trainer/loop/observe.py.)

And the last line of every outcome, `next_run_line`: what the next run of the same command will do,
from what is on disk: resume from step N (named), start fresh, find the run complete, or fail the same
way until the named fix is made; `report_outcome` says it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from trainer.attempt import (
    COMPLETED,
    EXIT_PREEMPTED,
    EXIT_PREFLIGHT,
    PREEMPTED,
    PREFLIGHT_FAILED,
    RUNNING,
    Attempt,
    Summary,
    checkpoint_json,
    read_summary,
    summary_path,
    write_summary,
)
from trainer.checkpoint.best import SIM, best_by_of, best_json
from trainer.checkpoint.diskspace import OutOfSpace, guard
from trainer.checkpoint.layout import scan
from trainer.config import RunConfig
from trainer.launcher import supervise
from trainer.launcher.console import say
from trainer.launcher.resolved import Launch
from trainer.launcher.simresults import sim_summary
from trainer.launcher.verdict import Verdict

# the last line of a config error (exit 2): nothing is on disk to resume or to start from
CONFIG_ERROR_NEXT = "nothing was written; the same command fails the same way until that value is fixed"


def next_run_line(run_dir: Path | None, cfg: RunConfig | None, needs_fix: str | None = None) -> str:
    """What the next run of the same command will do, from the checkpoints on disk; with `needs_fix`, it
    fails the same way until that is fixed, and this says what it does then."""
    if run_dir is None or cfg is None:
        return "nothing was written; the next run starts fresh"
    complete, _ = scan(run_dir / "checkpoints")
    if complete and complete[-1].step >= cfg.train.steps:
        then = f"finds the run complete ({complete[-1].path}, step {complete[-1].step}) and trains nothing"
    elif complete:
        then = f"resumes from step {complete[-1].step} ({complete[-1].path})"
    else:
        then = f"starts fresh (no complete checkpoint in {run_dir / 'checkpoints'})"
    if needs_fix:
        return f"the next run fails the same way until {needs_fix}; then it {then}"
    return f"the next run {then}"


BEFORE_START = "before any rank started"  # the end of a stop's reason when nothing was trained


def _previous(run_dir: Path) -> dict[str, Any] | None:
    """The last run that trained, as summary.json had it: what a preflight failure or a stop before any
    rank keeps (its losses, checkpoints, validation), never a chain of those."""
    before = read_summary(run_dir)
    if before is None:
        return None
    stopped_early = before.status == PREEMPTED and (before.reason or "").endswith(BEFORE_START)
    if before.status == PREFLIGHT_FAILED or stopped_early:
        return before.previous
    return before.to_json(stamp=False)


def preflight_failed(run_dir: Path, cfg: RunConfig, message: str, started: float) -> int:
    """Say why, and record it in summary.json (no checkpoint or attempt is touched: not progress)."""
    previous = _previous(run_dir)
    complete, _ = scan(run_dir / "checkpoints")
    try:
        write_summary(
            run_dir,
            Summary(
                PREFLIGHT_FAILED,
                steps_requested=cfg.train.steps,
                reason=message,
                last_complete_checkpoint=checkpoint_json(complete[-1]) if complete else None,
                wall_time_s=time.perf_counter() - started,
                previous_status=previous.get("status") if previous else None,
                previous=previous,  # the last real run's outcome (losses, steps) is kept, not overwritten
                config=cfg.name,
            ),
        )
    except OSError as exc:
        say(f"could not write the summary: {exc}")
    say(f"preflight failed: {message}; " + next_run_line(run_dir, cfg, needs_fix="that is fixed"))
    return EXIT_PREFLIGHT


def stopped_before_start(
    run_dir: Path | None, cfg: RunConfig | None, config: str, signal_name: str, started: float
) -> dict[str, Any]:
    """A stop signal before any rank started: nothing was trained. Recorded in summary.json when the run
    dir exists (a config was loaded), keeping the run's last checkpoint and its last real run's summary
    (a requeued attempt stopped in preflight, routine under Slurm, wiped them); returns the summary object
    (the --json report)."""
    known = cfg is not None and run_dir is not None and run_dir.is_dir()
    previous = _previous(run_dir) if known and run_dir is not None else None
    complete = scan(run_dir / "checkpoints")[0] if known and run_dir is not None else []
    summary = Summary(
        PREEMPTED,
        steps_requested=cfg.train.steps if cfg is not None else 0,
        reason=f"received {signal_name} {BEFORE_START}",
        last_complete_checkpoint=checkpoint_json(complete[-1]) if complete else None,
        wall_time_s=time.perf_counter() - started,
        previous_status=previous.get("status") if previous else None,
        previous=previous,
        config=cfg.name if cfg is not None else config,
    )
    if known and run_dir is not None:
        try:
            write_summary(run_dir, summary)
        except OSError as exc:
            say(f"could not write the summary: {exc}")
    return summary.to_json()


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
                last_complete_checkpoint=checkpoint_json(latest),
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
            last_complete_checkpoint=checkpoint_json(complete[-1]) if complete else None,
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
        diverged=result.diverged or base.diverged,
        hung=result.hung,
        damaged_checkpoints=launch.damaged,
        attempt=attempt.id,
        nnodes=launch.rdzv.nnodes,
        world_size=launch.world_size,
        env={"prefix": str(launch.choice.prefix), "provisioned": launch.choice.provisioned},
        config=launch.cfg.name,
        sim=sim_summary(launch.cfg, launch.run_dir),
    )
    if best_by_of(launch.cfg) == SIM:  # evaluations may have finished after rank 0's summary
        root = launch.run_dir / "checkpoints"
        summary = dataclasses.replace(summary, best_checkpoint=best_json(root, scan(root)[0], SIM))
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


def report_outcome(
    launch: Launch,
    attempt: Attempt,
    result: Verdict,
    no_requeue: bool,
    environ: dict[str, str],
    signals: list[str],
) -> None:
    """The outcome on the terminal: the verdict's notes, then one line ending with what the next run does."""
    for note in result.notes:
        say(note)
    summary = summary_path(launch.run_dir)
    if result.status == COMPLETED:
        say(f"completed {launch.cfg.train.steps} steps; summary {summary}")
        return
    if result.status == PREEMPTED:
        say(f"preempted ({result.reason}), exit {EXIT_PREEMPTED}: run the same command again; "
            + next_run_line(launch.run_dir, launch.cfg))  # fmt: skip
        if environ.get("SLURM_JOB_ID") and launch.rdzv.node_rank == 0:
            say(supervise.slurm_after_stop(signals, environ, no_requeue))
        return
    # one line: the failing rank's error (out of space: filesystem, path, free, needed, the fix) and what
    # the next run does; the tracebacks stay in the attempt's files
    needs_fix = "there is room" if result.out_of_space else result.needs_fix
    if result.diverged:  # the same config diverges the same way: the fix is in the line's reason
        needs_fix = needs_fix or "the cause is fixed (lower train.lr, check the data)"
    say(f"FAILED: {result.reason} (tracebacks and the ranks' output: {attempt.dir}/, summary: {summary}); "
        + next_run_line(launch.run_dir, launch.cfg, needs_fix))  # fmt: skip
