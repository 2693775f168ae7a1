"""One rank of a training run, as torchrun runs it: build / train_step / loop. Read it top to bottom.

    bin/train furniture_train 2          # the normal way in (trainer/launcher/); it starts, per rank:
    python -m trainer.loop.train --run-dir RUN_DIR --attempt-dir RUN_DIR/attempts/<id>

The rank loads the config the launcher resolved and checked (RUN_DIR/attempts/<id>/config.json) and
nothing else. The boundary is torchtitan's:
    build()       model (model/parallel.py build_model), optimizer, LR schedule, data stream, Checkpointer,
                  and the resume from the latest complete checkpoint
    train_step()  grad_accum micro-batches (gradient sync on the last only, or on every one), clip, AdamW,
                  LR warm-up: one optimizer step, timed by phase (bench/ drives this same function)
    loop()        after each step one all_reduce averages the losses across ranks and agrees on whether any
                  rank was asked to stop (SIGTERM/SIGUSR1, or the attempt's stop request); the
                  Checkpointer (checkpoint/checkpointer.py, the one owner of the checkpoint policy) decides
                  when to save (checkpoint.every, the last step, a stop) and agrees on a stop that
                  arrived during the save; then the step is logged; before each save but a
                  preemption's, the held-out losses (trainer/loop/validate.py), which the checkpoint records
                  and checkpoint.best_by ranks (trainer/checkpoint/best.py)
Batches are a pure function of (seed, step, micro-step, rank), so the step number is the whole data
position. The records passed between these stages are in trainer/loop/rig.py; what a rank reports (metrics,
progress, rank 0's summary) is trainer/loop/observe.py; what the launcher reads back is written through
trainer/attempt.py (rank records, progress, RUN_DIR/summary.json).
"""

from __future__ import annotations

import gc

# The rank's own process (not bench/ or tests importing this) has the collector off during its imports;
# main() freezes those ~490k objects, then turns it on: a 2-rank tiny launch 9.6 -> 7.5 CPU-s, the same
# losses (bench/results/2026-12-06-rank_gc.md).
if __name__ == "__main__":
    gc.disable()

import dataclasses
import functools
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo  # FSDP2's hooks import it on their first call: here, it loads with the rest
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from trainer import testhooks
from trainer.attempt import (
    COMPLETED,
    EVALUATION,
    FAILED,
    FIRST_STEP,
    PREEMPTED,
    RUNNING,
    SAVE,
    Attempt,
    RankStatus,
    checkpoint_json,
    summary_path,
    write_summary,
)
from trainer.checkpoint.best import BestPin, best_by_of
from trainer.checkpoint.checkpointer import Checkpointer, NonFiniteState, PeerStopped, scan
from trainer.checkpoint.diskspace import find_out_of_space, guard
from trainer.checkpoint.size import ModelSize, estimate_bytes
from trainer.config import RunConfig
from trainer.config.perf import ac_plan, adamw_impl, compile_blocks, prefetch_data
from trainer.data.cache.store import PreparationStopped
from trainer.data.normalize import stats_record
from trainer.data.prefetch import Prefetcher
from trainer.data.stream import build_stream
from trainer.loop.divergence import APPLY, SKIP, STOP, NonfinitePolicy, SpikeWatch, blame, local_slots
from trainer.loop.metrics import Metrics
from trainer.loop.observe import Observers, final_summary, held_out_lines, record_step, stopped_in_preparation
from trainer.loop.phases import Phases
from trainer.loop.profiling import DeviceUtilisation, ProfilerWindow, device_peak_flops
from trainer.loop.rank import (
    StopRequest,
    agree_on_failure,
    init_distributed,
    leave_last_on_node_0,
    parse_args,
    pause_point,
    raise_if_any,
    record_failure,
    record_quiet_failure,
)
from trainer.loop.rig import LoopState, Rig, StepOutput
from trainer.loop.timing import StepBreakdown, install_comm_timing
from trainer.loop.validate import evaluate
from trainer.model.parallel import build_model, clip_grad_norm, prepare_micro_step
from trainer.outcomes import Diverged

__all__ = ["LoopState", "Rig", "StepOutput", "build", "loop", "main", "train", "train_step"]


def warmup_schedule(warmup_steps: int) -> Callable[[int], float]:
    """Linear warm-up to the configured LR over `warmup_steps` optimizer steps, then constant."""
    return lambda done: min(1.0, (done + 1) / max(1, warmup_steps))


# --- build -----------------------------------------------------------------------------------------


def build(cfg: RunConfig, run_dir: Path, rank: int, world_size: int, device: torch.device, attempt_id: str,
          stop: Callable[[], bool] | None = None) -> Rig:  # fmt: skip
    """Model, sharding, optimizer, data, Checkpointer, and the resume from the latest complete checkpoint.

    Same seed on every rank: identical initial weights before sharding. `stop` (the rank's stop request)
    is asked between episodes while rank 0 prepares the latent cache: PreparationStopped on every rank."""
    model = build_model(cfg, device)
    optimizer = torch.optim.AdamW(  # the reference's AdamW (wan_va/train.py): betas, eps, weight decay
        [p for p in model.parameters() if p.requires_grad],  # frozen: never-called released tensors
        lr=cfg.train.lr,
        betas=(cfg.train.betas[0], cfg.train.betas[1]),
        eps=cfg.train.adam_eps,
        weight_decay=cfg.train.weight_decay,
        **adamw_impl(cfg, device),  # train.optimizer: auto = fused on CUDA, for_loop on CPU
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_schedule(cfg.train.warmup_steps))
    failure = None
    try:
        stream: Any = build_stream(cfg, rank, world_size, stop)  # may prepare the cache (a full disk stops)
        if prefetch_data(cfg, device):  # train.data_path: the next micro-batch prepared in a thread
            stream = Prefetcher(stream, cfg.train.grad_accum, pin=device.type == "cuda")
    except Exception as exc:
        failure = find_out_of_space(exc, "latent cache", cfg.data.path)
        if failure is None:
            raise
    agree_on_failure(failure, device)
    ckpt_root = run_dir / "checkpoints"
    checkpointer = Checkpointer(
        ckpt_root, cfg.checkpoint, last_step=cfg.train.steps, attempt=attempt_id, model_config=cfg.model,
        device=device, data_stats=stats_record(stream.normalizer, stream.latent_stats),
    )  # fmt: skip
    checkpointer.estimate = estimate_bytes(cfg, ModelSize.of(list(model.parameters())), world_size)
    if best_by_of(cfg) != "none" or cfg.eval.sim != "none":  # the best; checkpoints under simulation
        checkpointer.pin = BestPin(ckpt_root, best_by_of(cfg))
    breakdown = StepBreakdown(device)
    rig = Rig(cfg, rank, world_size, device, model, optimizer, scheduler, stream, checkpointer, breakdown)
    complete, rig.why_fresh = scan(ckpt_root)
    latest = complete[-1] if complete else None
    if latest is not None:
        checkpointer.resume(latest, model, optimizer, scheduler, cfg)
        rig.start_step, rig.resumed = latest.step, latest
    return rig


# --- one step --------------------------------------------------------------------------------------


def train_step(
    rig: Rig,
    step: int,
    on_first_micro: Callable[[], None] | None = None,
    before_update: Callable[[StepOutput], bool] | None = None,
) -> StepOutput:
    """One optimizer step: grad_accum micro-batches, clip, AdamW, LR schedule; phases timed in
    rig.breakdown (the caller opens and closes the step: start_step / end_step). `before_update` (the
    loop's one collective for the step) says whether the update is applied; without it, it always is."""
    cfg, model, breakdown, device = rig.cfg, rig.model, rig.breakdown, rig.device
    grad_accum = cfg.train.grad_accum
    lr = rig.scheduler.get_last_lr()[0]
    latent_sum = torch.zeros((), device=device)
    action_sum = torch.zeros((), device=device)
    for micro in range(grad_accum):
        # Reduce-scatter on the last micro-batch only (or every one, if asked); params stay gathered.
        prepare_micro_step(model, cfg, micro)
        with breakdown.phase("data"):
            batch = rig.stream.micro_batch(step, micro)
        with breakdown.phase("h2d"):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with breakdown.phase("forward"):
            out = testhooks.nonfinite_loss(model(batch), step, rig.rank)  # test hook: off unless set
            loss = out["loss"] / grad_accum
        with breakdown.phase("backward"):
            loss.backward()
        latent_sum += out["latent_loss"].detach()
        action_sum += out["action_loss"].detach()
        if micro == 0 and on_first_micro is not None:
            on_first_micro()
    with breakdown.phase("optimizer"):
        grad_norm = clip_grad_norm(model, cfg.train.grad_clip if cfg.train.grad_clip > 0 else math.inf)
    result = StepOutput(latent_sum, action_sum, float(grad_norm), float(lr))
    apply = before_update is None or before_update(result)  # never an update from a non-finite gradient
    with breakdown.phase("optimizer"):
        if apply:
            rig.optimizer.step()
        rig.optimizer.zero_grad(set_to_none=True)
        if apply:
            rig.scheduler.step()
    return result


# --- the loop --------------------------------------------------------------------------------------


def _agree(rig: Rig, stop: StopRequest, state: LoopState, out: StepOutput) -> bool:
    """The step's one collective, before the update: mean losses over micro-batches and ranks, whether any
    rank must stop, whether any rank holds a failed write (then every rank raises here: the next safe
    point), and which ranks' own losses are non-finite (trainer/loop/divergence.py). Sets state.losses,
    .stopping, .action (and .diverged); returns whether the update is applied."""
    flag = torch.tensor(float(stop.local), device=rig.device)
    failed = torch.tensor(float(state.failure is not None), device=rig.device)
    slots = local_slots(out.latent_sum, out.action_sum, rig.rank, rig.world_size)
    agreed = torch.cat([torch.stack([out.latent_sum, out.action_sum, flag, failed]), slots])
    dist.all_reduce(agreed)
    raise_if_any(state.failure, agreed[3].item() > 0)
    latent_loss, action_loss = (agreed[:2] / (rig.cfg.train.grad_accum * rig.world_size)).tolist()
    state.losses = {"loss": latent_loss + action_loss, "latent_loss": latent_loss, "action_loss": action_loss}
    state.stopping = agreed[2].item() > 0
    found = blame(state.step, agreed[4:].tolist(), state.losses, out.grad_norm)
    state.action = state.policy.decide(found)
    if state.action == STOP:
        state.diverged = found
    elif state.action == SKIP and found is not None:  # the data position still advances (step + 1)
        state.notes.append(state.policy.skip_note(found))
    return state.action == APPLY


def _save(rig: Rig, stop: StopRequest, state: LoopState, phases: Phases) -> None:
    """Maybe evaluate and save (the Checkpointer decides); a save refused for a non-finite tensor on any
    rank stops the run as diverged. Each is a phase the stall detector knows (trainer/loop/phases.py)."""
    ckpt, step = rig.checkpointer, state.step
    if not ckpt.due(step, state.stopping):
        return
    validation = None
    if not (state.stopping and step < rig.cfg.train.steps):  # not when preempted: save and go
        with phases.during(EVALUATION):  # collective; recorded in the checkpoint (checkpoint.best_by)
            validation = evaluate(rig, step)
        state.validation = validation or state.validation
    try:
        with rig.breakdown.phase("checkpoint"), phases.during(SAVE, ckpt.estimate):
            state.stopping = ckpt.save_due(
                step,
                rig.model,
                rig.optimizer,
                rig.scheduler,
                stopping=state.stopping,
                stop_requested=lambda: stop.local,
                train_state={
                    "config": rig.cfg.to_dict(),
                    "losses": state.losses,
                    "validation": validation.to_json() if validation else None,
                },
                before_commit=functools.partial(pause_point, "checkpoint", step, rig.rank),
            )
    except NonFiniteState as exc:
        values = dict(state.losses or {})
        values.pop("loss", None)
        state.action, state.diverged = STOP, Diverged(step, exc.tensor, "non-finite", exc.rank, values)
    state.last_ckpt = ckpt.last_committed


def loop(rig: Rig, obs: Observers, stop: StopRequest) -> LoopState:
    """Steps start_step+1 .. train.steps, until every rank agrees to stop (after its checkpoint), or until
    a non-finite step stops the run (train.nonfinite). Each step, as nanoGPT's: train (agreeing on losses,
    stop and divergence before the update), maybe evaluate and save, log."""
    cfg = rig.cfg
    state = LoopState(step=rig.start_step, last_ckpt=rig.resumed)
    state.policy = NonfinitePolicy(cfg.train.nonfinite, cfg.train.nonfinite_max_skips)
    state.spikes = SpikeWatch(cfg.train.grad_spike_factor)
    agree = functools.partial(_agree, rig, stop, state)
    phases = Phases(obs.attempt, rig.rank)
    phases.enter(FIRST_STEP)  # the attempt's first step compiles: the stall detector's long limit
    for step in range(rig.start_step + 1, cfg.train.steps + 1):
        state.step = step
        obs.profiler.begin(step)
        step_started = time.perf_counter()
        rig.breakdown.start_step()
        out = train_step(rig, step, functools.partial(pause_point, "step", step, rig.rank), agree)
        if state.action != STOP:  # no checkpoint (and no evaluation) from a diverged state
            _save(rig, stop, state, phases)
        record_step(rig, obs, state, out, step_started)
        obs.profiler.step(step)
        if state.action == STOP:
            assert state.diverged is not None
            state.status, state.diverged.last_finite_checkpoint = FAILED, checkpoint_json(state.last_ckpt)
            obs.metrics.info(state.diverged.line())
            break
        if state.stopping and step < cfg.train.steps:
            state.status = PREEMPTED
            assert state.last_ckpt is not None
            obs.metrics.info(
                f"stopping at step {step} ({stop.reason()}): checkpoint {state.last_ckpt.path} saved; "
                "resume me"
            )
            break
    obs.profiler.close()
    obs.utilisation.close()
    rig.checkpointer.finish()  # an asynchronous save still in flight is committed before the rank reports
    if isinstance(rig.stream, Prefetcher):
        rig.stream.close()
    state.last_ckpt = rig.checkpointer.last_committed
    agree_on_failure(state.failure, rig.device)  # a write that failed after the last step's agreement
    return state


# --- the rank's life -------------------------------------------------------------------------------


def train(
    cfg: RunConfig,
    run_dir: Path,
    device: torch.device,
    attempt: Attempt | None,
    stop: StopRequest,
    started: float,
) -> LoopState:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    attempt_id = attempt.id if attempt else f"manual-{os.getpid()}"
    try:
        rig = build(cfg, run_dir, rank, world_size, device, attempt_id, lambda: stop.local)
    except PreparationStopped as stopped:  # on every rank, at the cache's agreement (data/cache/prepare.py)
        return stopped_in_preparation(cfg, run_dir, attempt, stop, stopped, started)
    flops_per_token = rig.model.flops_per_token()
    metrics = Metrics(cfg, run_dir, rank=rank, start_step=rig.start_step, attempt=attempt_id)
    if rig.resumed is not None:
        metrics.info(f"resuming from {rig.resumed.path} (step {rig.resumed.step} of {cfg.train.steps})")
    else:
        metrics.info(f"fresh start: {rig.why_fresh}")
    metrics.info(
        f"{cfg.name}: {cfg.train.steps} steps x {cfg.train.grad_accum} micro-batches x {world_size} ranks "
        f"on {device}, {sum(p.numel() for p in rig.model.parameters()) / 1e6:.2f}M params (sharded view), "
        f"grad_sync={cfg.train.grad_sync}, keep_params_gathered={cfg.train.keep_params_gathered}, "
        f"compiled blocks {compile_blocks(cfg, device)}, activation checkpointing "
        f"{ac_plan(cfg, device.type).name}, data {type(rig.stream).__name__}"
    )
    install_comm_timing(rig.model, rig.breakdown)
    obs = Observers(
        metrics=metrics,
        profiler=ProfilerWindow(cfg.profile, run_dir, rank, device),  # no-op unless profile.enabled
        utilisation=DeviceUtilisation(device),  # NVML on GPU; None readings elsewhere
        peak_flops=device_peak_flops(device),
        flops_per_token=flops_per_token,
        attempt=attempt,
    )
    state = loop(rig, obs, stop)
    # Recorded before the last barrier: once node 0 passes it, every rank's record (on every node) is
    # final, and a rank that aborts later inside destroy_process_group (a known gloo hiccup) has still
    # finished its work. The launcher judges the run by these records.
    if attempt is not None:
        found = state.diverged
        record = RankStatus(rank, state.status, step=state.step)
        if found is not None:  # every rank stopped on the same step: the launcher says it in one line
            record.error, record.diverged = found.line(), dataclasses.asdict(found)
        attempt.write_rank(record)
    dist.barrier()  # every rank is done with training before the summary says so
    if rank == 0:
        pause_point("summary", state.step, rank)
        summary = final_summary(rig, state, stop, attempt_id, started)
        with guard(summary_path(run_dir), "summary write", needed=len(str(summary.to_json()))):
            write_summary(run_dir, summary)
        if state.status == COMPLETED:
            for line in held_out_lines(summary):
                metrics.info(line)
            metrics.info(f"completed {cfg.train.steps} steps; summary {summary_path(run_dir)}")
    metrics.close()
    return state


@record
def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    gc.freeze()  # what the imports created stays; the collector walks only what comes after
    gc.enable()
    run_dir, attempt_dir = parse_args(argv)
    attempt = Attempt(attempt_dir)
    cfg = attempt.read_config()
    stop = StopRequest(attempt)

    rank, _, _, device = init_distributed(cfg.hang.collective_timeout_s)
    attempt.write_rank(RankStatus(rank, RUNNING))
    try:
        train(cfg, run_dir, device, attempt, stop, started)
    except BaseException as exc:
        space = find_out_of_space(exc, "run", run_dir)
        if space is None and not isinstance(exc, PeerStopped):
            if not isinstance(exc, Exception):
                attempt.write_rank(
                    RankStatus(rank, FAILED, error=repr(exc), traceback=traceback.format_exc())
                )
                raise
            record_failure(attempt, rank, exc)  # the traceback to the attempt's files, not the terminal
            sys.exit(1)  # torchrun stops the other ranks
        # A full disk (here or on a peer): every rank stopped at the same safe point. Said in one line by
        # the launcher from this record; the detail goes to the attempt's log, not the terminal.
        record_quiet_failure(attempt, rank, cfg, space, exc)
    dist.destroy_process_group()
    leave_last_on_node_0()  # several nodes: node 0's torchrun hosts the store, it must leave last
    testhooks.abort_after_destroy(rank)  # test hook: the teardown SIGABRT, deterministically
    return 0


if __name__ == "__main__":
    sys.exit(main())
