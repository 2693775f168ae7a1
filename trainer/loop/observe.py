"""What one rank reports while it trains and when it is done: the per-step record (metrics, TensorBoard,
the launcher's progress file) and rank 0's summary.json.

    obs = Observers(metrics, profiler, utilisation, peak_flops, flops_per_token, attempt)
    record_step(rig, obs, state, out, started)     # after each optimizer step (trainer.loop.train.loop); also
                                                   # the largest grad_norm and a WARNING on a spike
    summary = final_summary(rig, state, stop, attempt_id, started)   # rank 0, after the last barrier
    stopped_in_preparation(cfg, run_dir, attempt, stop, why, started)  # a stop while the cache was prepared

A write that runs out of space never raises here: it lands in state.failure, and the loop stops every rank
at its next safe point (trainer/checkpoint/diskspace.py).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from trainer.attempt import (
    PREEMPTED,
    STEP,
    Attempt,
    Progress,
    RankStatus,
    Summary,
    checkpoint_json,
    summary_path,
    write_summary,
)
from trainer.checkpoint.best import best_by_of, best_json
from trainer.checkpoint.checkpointer import scan
from trainer.checkpoint.diskspace import OutOfSpace, guard
from trainer.loop.metrics import Metrics, memory_gib
from trainer.loop.profiling import DeviceUtilisation, ProfilerWindow, throughput
from trainer.loop.rank import StopRequest
from trainer.loop.rig import LoopState, Rig, StepOutput
from trainer.loop.timing import summarize as summarize_timing


@dataclass
class Observers:
    """The loop's side channels: logging, profiling, utilisation, progress for the launcher."""

    metrics: Metrics
    profiler: ProfilerWindow
    utilisation: DeviceUtilisation
    peak_flops: float | None
    flops_per_token: float
    attempt: Attempt | None


def record_step(rig: Rig, obs: Observers, state: LoopState, out: StepOutput, started: float) -> None:
    timing = rig.breakdown.end_step()
    state.timings.append(timing)
    s_per_it = time.perf_counter() - started
    tokens_per_step = rig.stream.tokens_per_micro_batch * rig.cfg.train.grad_accum * rig.world_size
    # Throughput of this rank's device (tokens/s summed over ranks is tokens_per_step / s_per_it).
    rate = throughput(tokens_per_step // rig.world_size, s_per_it, obs.flops_per_token, obs.peak_flops)
    assert state.losses is not None
    values = {
        **state.losses,
        "grad_norm": out.grad_norm,
        "lr": out.lr,
        "s_per_it": s_per_it,
        "tokens_per_s": tokens_per_step / s_per_it,
        "memory_gib": memory_gib(rig.device),
    }
    optional = {"mfu": rate["mfu"], "gpu_util": obs.utilisation.mean_since_last()}
    values.update({k: v for k, v in optional.items() if v is not None})
    warning = state.spikes.observe(state.step, out.grad_norm)
    peak = state.spikes.peak()
    peak_text = f"max grad_norm {peak['value']:.4g} at step {peak['step']}" if peak else ""
    validated = state.validation is not None and state.validation.step == state.step
    if validated:  # held-out losses measured at this step's checkpoint (trainer/loop/validate.py)
        values.update(state.validation.metrics())
    obs.metrics.log_step(state.step, values, timing, peak=peak_text)
    if validated:
        obs.metrics.info(state.validation.describe())
    for note in [*state.notes, *([warning] if warning else [])]:
        obs.metrics.info(note)
    state.notes.clear()
    if rig.rank == 0 and obs.attempt is not None and state.failure is None:
        progress = Progress(
            first_step=rig.start_step + 1,
            last_step=state.step,
            final_losses=state.losses,
            resumed_from=rig.resumed.step if rig.resumed else None,
            last_complete_checkpoint=checkpoint_json(state.last_ckpt),
            phase=STEP,
            phase_time=time.time(),
        )
        try:
            with guard(obs.attempt.dir, "progress write", needed=len(str(progress)) + 64):
                obs.attempt.write_progress(progress)
        except OutOfSpace as exc:
            state.failure = exc  # said at the next safe point, where every rank stops
    state.failure = state.failure or obs.metrics.failure


def final_summary(rig: Rig, state: LoopState, stop: StopRequest, attempt_id: str, started: float) -> Summary:
    steady = state.timings[1:] or state.timings  # the first step of an attempt pays for warm-up
    ran = state.step > rig.start_step
    return Summary(
        state.status,
        steps_requested=rig.cfg.train.steps,
        reason=_reason(state, stop),
        first_step=rig.start_step + 1 if ran else None,
        last_step=state.step if ran else None,
        resumed_from=rig.resumed.step if rig.resumed else None,
        last_complete_checkpoint=checkpoint_json(state.last_ckpt),
        final_losses=state.losses,
        wall_time_s=time.perf_counter() - started,
        timing={**summarize_timing(steady), "excludes_first_step": len(state.timings) > 1},
        world_size=rig.world_size,
        attempt=attempt_id,
        config=rig.cfg.name,
        data=_data_json(rig),
        diverged=dataclasses.asdict(state.diverged) if state.diverged else None,
        nonfinite_skipped=list(state.policy.skipped),
        grad_norm_max=state.spikes.peak(),
        validation=_last_validation(state),
        best_checkpoint=best_json(rig.checkpointer.root, scan(rig.checkpointer.root)[0], best_by_of(rig.cfg)),
    )


def _data_json(rig: Rig) -> dict[str, Any] | None:
    """The data summary, and whether stand-ins with the released transformer were allowed by the config
    (data.allow_stand_in_encoders, trainer/config/standins.py): an override is recorded, never silent."""
    if not rig.stream.data_summary:
        return None
    allowed = bool(getattr(rig.cfg.data, "allow_stand_in_encoders", False))
    return {**rig.stream.data_summary.to_json(), "allow_stand_in_encoders": allowed}


def _reason(state: LoopState, stop: StopRequest) -> str | None:
    if state.status == PREEMPTED:
        return f"preempted at step {state.step}: {stop.reason()}"
    return state.diverged.line() if state.diverged is not None else None


def _last_validation(state: LoopState) -> dict[str, Any] | None:
    """This attempt's last held-out losses, else those its last checkpoint recorded (a resumed attempt
    that evaluated nothing), else None."""
    if state.validation is not None:
        return state.validation.to_json()
    try:
        recorded = state.last_ckpt.train_state().get("validation") if state.last_ckpt else None
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def held_out_lines(summary: Summary) -> list[str]:
    """The run's last words on the model: its final held-out losses and its best checkpoint."""
    lines = []
    if summary.validation is not None:
        v = summary.validation
        lines.append(
            f"held-out ({v['episodes']} episodes, {v['clips']} clips) at step {v['step']}: "
            f"latent_loss {v['latent_loss']:.4f} | action_loss {v['action_loss']:.4f}"
        )
    if summary.best_checkpoint is not None:
        b = summary.best_checkpoint
        lines.append(
            f"best checkpoint by {b['metric']} ({b['value']:.4f}): step {b['step']} -> {b['pointer']}"
        )
    return lines


def stopped_in_preparation(
    cfg, run_dir: Path, attempt: Attempt | None, stop: StopRequest, why: Exception, started: float
) -> LoopState:
    """A stop that came while rank 0 prepared the latent cache on first use: every rank learnt it at the
    cache's agreement (trainer/data/cache/prepare.py), records PREEMPTED at step 0, and rank 0 writes the
    summary with what was kept, after every rank's record (the barrier). The launcher's verdict is then a
    stop (exit 75; Slurm requeues after USR1), never a failure, and the next attempt's preparation
    continues from the episodes encoded so far. Nothing was trained in this attempt; a cache prepared
    again (its data settings changed) may come after checkpoints, which the next attempt resumes from."""
    rank = dist.get_rank()
    complete = scan(run_dir / "checkpoints")[0]
    latest = complete[-1] if complete else None
    if attempt is not None:
        attempt.write_rank(RankStatus(rank, PREEMPTED, step=latest.step if latest else 0))
    dist.barrier()
    if rank == 0:
        reason = f"stopped while preparing the latent cache ({stop.reason()}): {why}"
        print(f"data: {reason}", flush=True)
        summary = Summary(
            PREEMPTED,
            steps_requested=cfg.train.steps,
            reason=reason,
            attempt=attempt.id if attempt else None,
            config=cfg.name,
            last_complete_checkpoint=checkpoint_json(latest),
            wall_time_s=time.perf_counter() - started,
            world_size=dist.get_world_size(),
        )
        with guard(summary_path(run_dir), "summary write", needed=len(str(summary.to_json()))):
            write_summary(run_dir, summary)
    return LoopState(status=PREEMPTED)
