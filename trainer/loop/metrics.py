"""Per-step metrics: one log line per step, a progress line with ETA, TensorBoard events, metrics.jsonl.

Only rank 0 logs. Sinks:
    stdout and RUN_DIR/train.log   human-readable lines
    RUN_DIR/metrics.jsonl          one JSON object per step (floats round-trip exactly: tests compare them)
    RUN_DIR/tensorboard/           torch.utils.tensorboard events; a resumed run purges the steps after
                                   its checkpoint, so a preempted attempt's extra steps do not double up
    wandb (offline mode only)      when log.wandb is set and wandb is installed; never contacts a hub
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import TextIO

import torch

from trainer.checkpoint.diskspace import OutOfSpace, guard
from trainer.config import RunConfig
from trainer.loop.timing import format_breakdown


def format_duration(seconds: float) -> str:
    seconds = int(round(max(0.0, seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def memory_gib(device: torch.device) -> float:
    """Peak device memory on GPU; peak resident set size of this process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class Metrics:
    def __init__(self, cfg: RunConfig, run_dir: Path, *, rank: int, start_step: int, attempt: str):
        self.enabled = rank == 0
        self.total = cfg.train.steps
        self.start_step = start_step
        self.started = time.perf_counter()
        self.progress_every = max(1, self.total // 20)
        self.log_every = max(1, cfg.train.log_every)
        self.tensorboard = None
        self.wandb = None
        self.failure: OutOfSpace | None = None  # a write that ran out of space (the loop stops on it)
        if not self.enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.text = open(run_dir / "train.log", "a", buffering=1)
        self.jsonl = open(run_dir / "metrics.jsonl", "a", buffering=1)
        if cfg.log.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # tensorboard is in the env's spec; say so if someone removed it
                self.info(f"log.tensorboard is set but tensorboard cannot be imported ({exc}): no events")
            else:
                # purge_step drops events an earlier attempt wrote past the checkpoint we resumed from.
                self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1)
        if cfg.log.wandb:
            self.wandb = self._wandb(cfg, run_dir, attempt)

    def _wandb(self, cfg: RunConfig, run_dir: Path, attempt: str):
        try:
            import wandb
        except ImportError:
            self.info("log.wandb is set but wandb is not installed in this env: logging to TensorBoard only")
            return None
        os.environ["WANDB_MODE"] = "offline"  # no hub access, ever; `wandb sync` later if wanted
        return wandb.init(
            mode="offline",
            dir=str(run_dir),
            project="lingbot",
            name=f"{cfg.name}-{attempt}",
            config=cfg.to_dict(),
        )

    def _write(self, stream: TextIO, text: str) -> None:
        """A write that never raises for a full disk: the failure waits in .failure for the loop's next
        safe point (every rank stops there together)."""
        if self.failure is not None:
            return
        try:
            with guard(stream.name, "metrics/log write", needed=len(text.encode())):
                stream.write(text)
        except OutOfSpace as exc:
            self.failure = exc

    def info(self, message: str) -> None:
        if not self.enabled:
            return
        line = f"[train] {message}"
        print(line, flush=True)
        self._write(self.text, line + "\n")

    def log_step(self, step: int, values: dict[str, float], timing: dict[str, float], peak: str = "") -> None:
        """values: latent_loss, action_loss, loss, grad_norm, lr, s_per_it, tokens_per_s, memory_gib, ...;
        `peak` (the largest grad_norm so far and its step) goes on the progress line."""
        if not self.enabled:
            return
        record = {"step": step, **values, "timing": timing}
        self._write(self.jsonl, json.dumps(record) + "\n")
        if self.tensorboard is not None:
            for key, value in values.items():  # held-out losses (val_*) under val/
                tag = f"val/{key[4:]}" if key.startswith("val_") else f"train/{key}"
                self.tensorboard.add_scalar(tag, value, step)
            for key, value in timing.items():
                if key.endswith("_share"):
                    self.tensorboard.add_scalar(f"timing/{key}", value, step)
        if self.wandb is not None:
            self.wandb.log({**values, **{f"timing/{k}": v for k, v in timing.items()}}, step=step)
        if step % self.log_every == 0 or step == self.total:
            self.info(
                f"step {step}/{self.total} | latent_loss {values['latent_loss']:.4f} | "
                f"action_loss {values['action_loss']:.4f} | grad_norm {values['grad_norm']:.3f} | "
                f"lr {values['lr']:.2e} | {values['s_per_it']:.2f} s/it | "
                f"{values['tokens_per_s']:.0f} tok/s | "
                f"mem {values['memory_gib']:.2f} GiB"
                + (f" | mfu {values['mfu']:.1%}" if "mfu" in values else "")
                + (f" | gpu {values['gpu_util']:.0f}%" if "gpu_util" in values else "")
            )
        if step % self.progress_every == 0 or step == self.total:
            self.progress(step, format_breakdown(timing) if timing else "", peak)

    def progress(self, step: int, breakdown: str = "", peak: str = "") -> None:
        done = step - self.start_step
        elapsed = time.perf_counter() - self.started
        eta = elapsed / done * (self.total - step) if done > 0 else float("nan")
        eta_text = format_duration(eta) if done > 0 else "?"
        self.info(
            f"progress {step}/{self.total} ({100.0 * step / self.total:.0f}%) | "
            f"elapsed {format_duration(elapsed)} | eta {eta_text}"
            + (f" | {peak}" if peak else "")
            + (f" | {breakdown}" if breakdown else "")
        )

    def close(self) -> None:
        if not self.enabled:
            return
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
        for stream in (self.text, self.jsonl):
            try:
                stream.close()
            except OSError:  # flushing into a full disk: the failure was already reported
                pass
        sys.stdout.flush()
