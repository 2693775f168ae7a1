"""The training loop, one process per rank, as torchrun runs it. Read it top to bottom.

    bin/train furniture_train 2                      # the normal way in (trainer/launch.py)
    torchrun --nproc-per-node 2 -m trainer.train --config furniture_train --run-dir runs/x [--cpu-scale]

Each optimizer step: grad_accum micro-batches (gradient sync on the last only, or on every one), clip,
AdamW, LR warm-up, then one all_reduce that averages the losses across ranks and agrees on whether any
rank was asked to stop (SIGTERM/SIGUSR1, or the launcher's stop file). Checkpoints every
checkpoint.every steps, at the last step, and when stopping. Batches are a pure function of
(seed, step, micro-step, rank), so the step number is the whole data position.

What the launcher reads back (RUN_DIR/attempts/<id>/, given by LINGBOT_ATTEMPT_DIR):
    rank_<R>.json     this rank's record: running -> completed | preempted | failed (with the error)
    progress.json     rank 0, every step: first/last step run, last losses, last complete checkpoint
    stop              the launcher's stop request (exists = stop at the next safe point)
and RUN_DIR/summary.json, written by rank 0 when training ends.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from trainer import summary as summaries
from trainer.checkpoint import Checkpointer, CheckpointError, resume_conflicts, scan
from trainer.config import load_config, parse_set
from trainer.data import build_stream
from trainer.metrics import Metrics, memory_gib
from trainer.parallel import build_model, clip_grad_norm, prepare_micro_step
from trainer.profiling import DeviceUtilisation, ProfilerWindow, device_peak_flops, throughput
from trainer.timing import StepBreakdown, install_comm_timing
from trainer.timing import summarize as summarize_timing

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Set by SIGTERM/SIGUSR1 or by the launcher's stop file; acted on only at a safe point."""

    def __init__(self, stop_file: Path | None):
        self.stop_file = stop_file
        self.signal_name: str | None = None
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        # Only set a flag: a second signal during a checkpoint save must not interrupt the save.
        self.signal_name = self.signal_name or signal.Signals(signum).name

    @property
    def local(self) -> bool:
        return self.signal_name is not None or (self.stop_file is not None and self.stop_file.exists())

    def reason(self) -> str:
        return f"received {self.signal_name}" if self.signal_name else "the launcher asked to stop"


class RankRecord:
    """RUN_DIR/attempts/<id>/rank_<R>.json: how far this rank got, for the launcher's verdict."""

    def __init__(self, attempt_dir: Path | None, rank: int):
        self.path = attempt_dir / f"rank_{rank}.json" if attempt_dir else None
        self.base = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname()}

    def write(self, status: str, **fields) -> None:
        if self.path is not None:
            summaries.atomic_write_json(
                self.path, {**self.base, "status": status, "time": time.time(), **fields}
            )


def pause_point(point: str, step: int, rank: int) -> None:
    """Test hook: LINGBOT_TEST_PAUSE_AT=<point>:<step> makes rank LINGBOT_TEST_PAUSE_RANK (default 0)
    announce itself in $LINGBOT_TEST_PAUSE_DIR/reached and wait there until .../release exists."""
    if os.environ.get("LINGBOT_TEST_PAUSE_AT") != f"{point}:{step}":
        return
    if rank != int(os.environ.get("LINGBOT_TEST_PAUSE_RANK", "0")):
        return
    pause_dir = Path(os.environ["LINGBOT_TEST_PAUSE_DIR"])
    summaries.atomic_write_json(
        pause_dir / "reached", {"pid": os.getpid(), "rank": rank, "point": point, "step": step}
    )
    while not (pause_dir / "release").exists():
        time.sleep(0.02)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one rank of a training run (started by torchrun)")
    parser.add_argument("--config", required=True)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--cpu-scale", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    return parser.parse_args(argv)


def warmup_schedule(warmup_steps: int):
    """Linear warm-up to the configured LR over `warmup_steps` optimizer steps, then constant."""
    return lambda done: min(1.0, (done + 1) / max(1, warmup_steps))


def init_distributed() -> tuple[int, int, int, torch.device]:
    if "RANK" not in os.environ:
        sys.exit("trainer.train is one rank of a torchrun job: run it with bin/train (or torchrun)")
    rank, world_size, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return rank, world_size, local_rank, device


@record
def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    cfg = load_config(args.config, cpu_scale=args.cpu_scale, overrides=parse_set(args.set))
    run_dir = args.run_dir.absolute()
    attempt_dir = Path(os.environ["LINGBOT_ATTEMPT_DIR"]) if os.environ.get("LINGBOT_ATTEMPT_DIR") else None
    attempt = attempt_dir.name if attempt_dir else f"manual-{os.getpid()}"
    stop = StopRequest(attempt_dir / "stop" if attempt_dir else None)

    rank, world_size, _, device = init_distributed()
    rank_record = RankRecord(attempt_dir, rank)
    rank_record.write("running")
    try:
        status, step = train(
            cfg, run_dir, rank, world_size, device, attempt, attempt_dir, stop, started, rank_record
        )
    except BaseException as exc:
        rank_record.write("failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        raise
    dist.destroy_process_group()
    if os.environ.get("LINGBOT_TEST_ABORT_AFTER_DESTROY") == str(rank):
        os.abort()  # test hook: reproduce the teardown SIGABRT deterministically
    return 0


def train(
    cfg, run_dir, rank, world_size, device, attempt, attempt_dir, stop, started, rank_record
) -> tuple[str, int]:
    total_steps, grad_accum = cfg.train.steps, cfg.train.grad_accum
    ckpt_root = run_dir / "checkpoints"

    # Model, sharding, optimizer. Same seed on every rank: identical initial weights before sharding.
    model = build_model(cfg, device)
    flops_per_token = model.flops_per_token()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_schedule(cfg.train.warmup_steps))
    stream = build_stream(cfg, rank, world_size)
    tokens_per_step = stream.tokens_per_micro_batch * grad_accum * world_size
    checkpointer = Checkpointer(
        ckpt_root,
        keep=cfg.checkpoint.keep,
        rank=rank,
        world_size=world_size,
        attempt=attempt,
        export_safetensors=cfg.checkpoint.export_safetensors,
    )

    # Resume from the latest complete checkpoint, or say why this is a fresh start.
    complete, why_fresh = scan(ckpt_root)
    latest = complete[-1] if complete else None
    start_step = 0
    if latest is not None:
        conflicts = resume_conflicts(latest.train_state(), cfg, world_size)
        if conflicts:
            raise CheckpointError(f"cannot resume from {latest.path}: " + "; ".join(conflicts))
        checkpointer.load(latest, model, optimizer, scheduler)
        start_step = latest.step
    metrics = Metrics(cfg, run_dir, rank=rank, start_step=start_step, attempt=attempt)
    if latest is not None:
        metrics.info(f"resuming from {latest.path} (step {latest.step} of {total_steps})")
    else:
        metrics.info(f"fresh start: {why_fresh}")
    metrics.info(
        f"{cfg.name}: {total_steps} steps x {grad_accum} micro-batches x {world_size} ranks on {device}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params (sharded view), grad_sync={cfg.train.grad_sync}, keep_params_gathered={cfg.train.keep_params_gathered}"
    )

    breakdown = StepBreakdown(device)
    install_comm_timing(model, breakdown)
    profiler = ProfilerWindow(cfg.profile, run_dir, rank, device)  # no-op unless profile.enabled
    utilisation = DeviceUtilisation(device)  # NVML on GPU; None readings elsewhere
    peak_flops = device_peak_flops(device)
    timings: list[dict] = []
    last_ckpt = latest
    losses = None
    status, step = summaries.COMPLETED, start_step

    for step in range(start_step + 1, total_steps + 1):
        profiler.begin(step)
        step_started = time.perf_counter()
        breakdown.start_step()
        lr = scheduler.get_last_lr()[0]
        latent_sum = torch.zeros((), device=device)
        action_sum = torch.zeros((), device=device)
        for micro in range(grad_accum):
            # Reduce-scatter on the last micro-batch only (or every one, if asked); params stay gathered.
            prepare_micro_step(model, cfg, micro)
            with breakdown.phase("data"):
                batch = stream.micro_batch(step, micro)
            with breakdown.phase("h2d"):
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with breakdown.phase("forward"):
                out = model(batch)
                loss = out["loss"] / grad_accum
            with breakdown.phase("backward"):
                loss.backward()
            latent_sum += out["latent_loss"].detach()
            action_sum += out["action_loss"].detach()
            if micro == 0:
                pause_point("step", step, rank)
        with breakdown.phase("optimizer"):
            grad_norm = clip_grad_norm(model, cfg.train.grad_clip if cfg.train.grad_clip > 0 else math.inf)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()

        # One collective: mean losses over micro-batches and ranks, and whether any rank must stop.
        agreed = torch.stack([latent_sum, action_sum, torch.tensor(float(stop.local), device=device)])
        dist.all_reduce(agreed)
        latent_loss, action_loss = (agreed[:2] / (grad_accum * world_size)).tolist()
        stopping = agreed[2].item() > 0
        losses = {"loss": latent_loss + action_loss, "latent_loss": latent_loss, "action_loss": action_loss}

        due = step % cfg.checkpoint.every == 0 or step == total_steps
        if due or stopping:
            with breakdown.phase("checkpoint"):
                # Asynchronous only mid-run: a stop or the last step must be on disk before we exit.
                checkpointer.save(
                    step,
                    model,
                    optimizer,
                    scheduler,
                    train_state={"config": cfg.to_dict(), "losses": losses},
                    before_commit=lambda s=step: pause_point("checkpoint", s, rank),
                    asynchronous=cfg.checkpoint.async_save and not stopping and step < total_steps,
                )
            last_ckpt = checkpointer.last_committed or latest
            if not stopping:  # a signal that arrived during the save stops us here
                flag = torch.tensor(float(stop.local), device=device)
                dist.all_reduce(flag)
                stopping = flag.item() > 0
                if stopping and step < total_steps:
                    checkpointer.finish()  # commit an asynchronous save before stopping on it
                    last_ckpt = checkpointer.last_committed

        timing = breakdown.end_step()
        timings.append(timing)
        s_per_it = time.perf_counter() - step_started
        # Throughput of this rank's device (tokens/s summed over ranks is tokens_per_step / s_per_it).
        rate = throughput(tokens_per_step // world_size, s_per_it, flops_per_token, peak_flops)
        values = {
            **losses,
            "grad_norm": float(grad_norm),
            "lr": lr,
            "s_per_it": s_per_it,
            "tokens_per_s": tokens_per_step / s_per_it,
            "memory_gib": memory_gib(device),
        }
        optional = {"mfu": rate["mfu"], "gpu_util": utilisation.mean_since_last()}
        values.update({k: v for k, v in optional.items() if v is not None})
        metrics.log_step(step, values, timing)
        if rank == 0 and attempt_dir is not None:
            summaries.atomic_write_json(
                attempt_dir / "progress.json",
                {
                    "first_step": start_step + 1,
                    "last_step": step,
                    "final_losses": losses,
                    "resumed_from": latest.step if latest else None,
                    "last_complete_checkpoint": _ckpt_json(last_ckpt),
                },
            )
        profiler.step(step)
        if stopping and step < total_steps:
            status = summaries.PREEMPTED
            metrics.info(
                f"stopping at step {step} ({stop.reason()}): checkpoint {last_ckpt.path} saved; resume me"
            )
            break

    profiler.close()
    utilisation.close()
    if checkpointer.finish() is not None:  # an asynchronous save still in flight
        last_ckpt = checkpointer.last_committed
    # Recorded before the last barrier: once node 0 passes it, every rank's record (on every node) is
    # final, and a rank that aborts later inside destroy_process_group (a known gloo hiccup) has still
    # finished its work. The launcher judges the run by these records.
    rank_record.write(status, step=step)
    dist.barrier()  # every rank is done with training before the summary says so
    if rank == 0:
        steady = timings[1:] or timings  # the first step of an attempt pays for warm-up
        summaries.write_summary(
            run_dir,
            summaries.make_summary(
                status,
                steps_requested=total_steps,
                reason=f"preempted at step {step}: {stop.reason()}"
                if status == summaries.PREEMPTED
                else None,
                first_step=start_step + 1 if step > start_step else None,
                last_step=step if step > start_step else None,
                resumed_from=latest.step if latest else None,
                last_complete_checkpoint=_ckpt_json(last_ckpt),
                final_losses=losses,
                wall_time_s=time.perf_counter() - started,
                timing={**summarize_timing(steady), "excludes_first_step": len(timings) > 1},
                world_size=world_size,
                attempt=attempt,
                config=cfg.name,
            ),
        )
        if status == summaries.COMPLETED:
            metrics.info(f"completed {total_steps} steps; summary {summaries.summary_path(run_dir)}")
    metrics.close()
    return status, step


def _ckpt_json(info) -> dict | None:
    return {"step": info.step, "path": str(info.path)} if info is not None else None


if __name__ == "__main__":
    sys.exit(main())
