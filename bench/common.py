"""Shared bits of the benchmarks: result tables, the machine description, torchrun launching.

Every bench module has `run(quick: bool) -> list[Table]` and a `__main__` that prints its tables;
bench/run_all.py runs them all and writes bench/results/<date>.md.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("LINGBOT_BENCH_CACHE", Path.home() / ".cache" / "lingbot-bench"))


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list]
    ratio: str = ""  # the one-line conclusion
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        def cell(v):
            if isinstance(v, float):
                return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
            return str(v)

        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |"]
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in self.rows]
        if self.ratio:
            lines += ["", f"**{self.ratio}**"]
        lines += [""] + [f"- {n}" for n in self.notes] if self.notes else []
        return "\n".join(lines) + "\n"


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def machine() -> dict[str, str]:
    import torch

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "host": socket.gethostname(),
        "cpu": cpu,
        "cores": str(len(os.sched_getaffinity(0))),
        "memory_gib": f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f}",
        "gpu": gpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def torchrun(script: Path, nproc: int, args: list[str], out_dir: Path, timeout: float) -> list[dict]:
    """Run `script` under torchrun with `nproc` ranks; each rank writes out_dir/rank<r>.json."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(script), str(out_dir), *args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    files = [out_dir / f"rank{r}.json" for r in range(nproc)]
    # Results are written before teardown; torch 2.13/gloo sometimes aborts in teardown after that.
    if not all(f.exists() for f in files):
        raise RuntimeError(f"{script.name}: torchrun exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return [json.loads(f.read_text()) for f in files]


def bench_config(overrides: dict | None = None):
    """The cpu_scale furniture_train config (or the cluster one on a GPU), data cached outside the repo."""
    import torch

    from trainer.config import load_config

    base = {"data.path": str(CACHE / "data" / "furniture_train")}
    return load_config(
        "furniture_train", cpu_scale=not torch.cuda.is_available(), overrides={**base, **(overrides or {})}
    )


class PeakMemory:
    """Peak memory during a window: max_memory_allocated on GPU, sampled RSS (psutil, 2 ms) on CPU."""

    def __init__(self, device):
        import psutil

        self.device, self.process = device, psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        import torch

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.peak = self.process.memory_info().rss
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc):
        import torch

        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, self.process.memory_info().rss)


def init_distributed():
    """torchrun rank setup: (rank, world, device), NCCL on GPU, gloo on CPU."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return rank, world, device


class TrainingRig:
    """The project's model, sharding, optimizer and data, with the train loop's step (trainer/train.py)."""

    def __init__(self, cfg, rank: int, world: int, device):
        import torch

        from trainer.data import build_stream
        from trainer.model import WorldModel
        from trainer.parallel import set_grad_sync, shard_model

        self.model_name = "trainer.model.WorldModel"
        from trainer.timing import StepBreakdown, install_comm_timing

        self.cfg, self.device, self.set_grad_sync = cfg, device, set_grad_sync
        # shard as the FSDP2 default (reshard after forward); step() toggles keep_unsharded per variant
        cfg.train.keep_params_gathered = False
        torch.manual_seed(cfg.train.seed)
        self.model = shard_model(WorldModel(cfg), cfg, device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda done: 1.0)
        self.stream = build_stream(cfg, rank, world)
        self.breakdown = StepBreakdown(device)
        install_comm_timing(self.model, self.breakdown)

    def step(self, step: int, sync: str | None = None, keep_unsharded: bool = False) -> dict:
        """One optimizer step of grad_accum micro-batches; returns its StepBreakdown record.

        keep_unsharded: parameters stay all-gathered from the first forward to the last backward
        (FSDP2 set_reshard_after_forward(False) + set_reshard_after_backward on the last micro-step
        only): one all-gather pass per step instead of two per micro-step, for unsharded-param memory.
        """
        import torch

        sync = sync or self.cfg.train.grad_sync
        accum, b = self.cfg.train.grad_accum, self.breakdown
        if keep_unsharded:
            self.model.set_reshard_after_forward(False)
        b.start_step()
        for micro in range(accum):
            if keep_unsharded:
                self.model.set_reshard_after_backward(micro == accum - 1)
            self.set_grad_sync(self.model, sync == "every" or micro == accum - 1)
            with b.phase("data"):
                batch = self.stream.micro_batch(step, micro)
            with b.phase("h2d"):
                batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            with b.phase("forward"):
                loss = self.model(batch)["loss"] / accum
            with b.phase("backward"):
                loss.backward()
        with b.phase("optimizer"):
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
        record = b.end_step()
        if keep_unsharded:  # back to shard_model's settings: blocks reshard after forward, the root not
            for module in self.model.blocks:
                module.set_reshard_after_forward(True)
        return record
