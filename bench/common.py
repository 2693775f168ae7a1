"""Shared bits of the benchmarks: result tables, the machine description, torchrun launching, the tests'
fixture builders run as programs (fixture_program: bench/ imports nothing of tests/).

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


def fixture_program(code: str, timeout: float) -> str:
    """Run `code` (Python that imports a builder of tests/support/) as a program of its own; its stdout.
    bench/ never imports tests/: the test suite owns its fixture builders (the toolchain stand-in, the
    lerobot writer env), and a benchmark that needs one runs it as the tests' own program would, so a
    change inside tests/support/ can never break an import of bench/ (tests/test_structure_bench.py)."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, text=True, timeout=timeout,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(
            f"the fixture builder failed (exit {done.returncode}; its stderr is above): {code!r}"
        )
    return done.stdout


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


def publish(lines: list[str], out: Path | None) -> None:
    """A report's lines: printed, and written atomically to `out` when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        from provision.atomic import write_atomic

        write_atomic(out, text.encode())


def torchrun(script: Path, nproc: int, args: list[str], out_dir: Path, timeout: float) -> list[dict]:
    """Run `script` under torchrun with `nproc` ranks; each rank writes out_dir/rank<r>.json."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "--log-dir", str(out_dir / "torchrun-logs"), str(script), str(out_dir), *args]  # fmt: skip
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
            assert self._thread is not None
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
    """The trainer's own build() and train_step() (trainer/loop/train.py): the step the loop runs, not a copy.

    grad_sync / keep_params_gathered override the config for this rig (each variant is its own rig,
    built like a training run: same seed, so the same initial weights)."""

    def __init__(
        self,
        cfg,
        rank: int,
        world: int,
        device,
        run_dir: Path,
        grad_sync: str | None = None,
        keep_params_gathered: bool | None = None,
    ):
        import copy

        from trainer.loop.timing import install_comm_timing
        from trainer.loop.train import build

        cfg = copy.deepcopy(cfg)
        if grad_sync is not None:
            cfg.train.grad_sync = grad_sync
        if keep_params_gathered is not None:
            cfg.train.keep_params_gathered = keep_params_gathered
        self.cfg, self.device = cfg, device
        self.rig = build(cfg, Path(run_dir), rank, world, device, attempt_id="bench")
        self.model, self.optimizer, self.scheduler = self.rig.model, self.rig.optimizer, self.rig.scheduler
        self.stream, self.breakdown = self.rig.stream, self.rig.breakdown
        self.model_name = "trainer.loop.train.build (trainer.model.parallel.build_model)"
        install_comm_timing(self.model, self.breakdown)

    def step(self, step: int) -> dict:
        """One optimizer step through trainer.loop.train.train_step; returns its StepBreakdown record."""
        from trainer.loop.train import train_step

        self.breakdown.start_step()
        train_step(self.rig, step)
        return self.breakdown.end_step()
