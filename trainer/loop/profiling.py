"""Throughput, MFU, device utilisation and an opt-in torch.profiler window for the training loop.

window = ProfilerWindow(cfg.profile, run_dir, rank, device)   # does nothing unless cfg.profile.enabled
nvml = DeviceUtilisation(device)                              # samples NVML when pynvml is present
for step in ...:
    ...one optimizer step...
    window.step(step)
    metrics |= throughput(tokens, seconds, model.flops_per_token(), device_peak_flops(device))
    metrics["gpu_util"] = nvml.mean_since_last()               # None without NVML
window.close(); nvml.close()
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from trainer.plan.gpus import GPU_KINDS

# Dense (non-sparse) bf16 tensor-core peaks per device, FLOP/s, from NVIDIA's data sheets (the table, with
# each figure's source, is trainer/plan/gpus.py). Order matters: the first substring found in
# torch.cuda.get_device_name() wins.
BF16_DENSE_PEAK_FLOPS: tuple[tuple[str, float], ...] = tuple((k.name, k.bf16_dense_flops) for k in GPU_KINDS)


def device_peak_flops(device: torch.device | str) -> float | None:
    """The bf16 dense peak of `device` if it is in the table, else None (CPU: always None)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in BF16_DENSE_PEAK_FLOPS:
        if key in name:
            return peak
    return None


def throughput(
    tokens: int, seconds: float, flops_per_token: float | None = None, peak_flops: float | None = None
) -> dict[str, float | None]:
    """tokens/s of one rank; MFU = model FLOP/s (flops_per_token covers forward + backward) / device peak."""
    tokens_per_s = tokens / seconds if seconds > 0 else 0.0
    mfu = None
    if flops_per_token and peak_flops:
        mfu = tokens_per_s * flops_per_token / peak_flops
    return {"tokens_per_s": tokens_per_s, "mfu": mfu}


class DeviceUtilisation:
    """NVML's GPU utilisation (percent of time a kernel ran), sampled by a daemon thread.

    Without pynvml (or on CPU) every reading is None. NVML averages over its own ~1/6-1 s window, so
    sampling every `interval` seconds and averaging per logged step is enough.
    """

    def __init__(self, device: torch.device | str, interval: float = 0.2):
        self._samples: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self.reason = ""
        device = torch.device(device)
        if device.type != "cuda":
            self.reason = "not a CUDA device"
            return
        try:
            import pynvml  # from the nvidia-ml-py package
        except ImportError:
            self.reason = "pynvml not installed (pip package nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            # NVML numbers devices physically; honour CUDA_VISIBLE_DEVICES through the PCI bus id.
            bus_id = getattr(torch.cuda.get_device_properties(index), "pci_bus_id")  # noqa: B009 (not in stubs)
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        except Exception as exc:  # NVML missing from the driver, or no permission
            self.reason = f"NVML unavailable: {exc}"
            return
        self._nvml, self._handle, self._interval = pynvml, handle, interval
        self._thread = threading.Thread(target=self._run, name="nvml-utilisation", daemon=True)
        self._thread.start()

    @property
    def available(self) -> bool:
        return self._thread is not None

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            except Exception:
                continue
            with self._lock:
                self._samples.append(float(util))

    def mean_since_last(self) -> float | None:
        """Mean utilisation (0-100) since the previous call; None without NVML or without samples."""
        if not self.available:
            return None
        with self._lock:
            samples, self._samples = self._samples, []
        return sum(samples) / len(samples) if samples else None

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2)
            self._thread = None


class ProfilerWindow:
    """torch.profiler over steps [start_step, start_step + wait + warmup + active) of this rank.

    Call `step(step)` after each optimizer step with the step number just finished. Traces go to
    RUN_DIR/profile/rank<r>/steps_<a>-<b>.pt.trace.json (Chrome/Perfetto format; TensorBoard's
    profiler plugin reads the directory too). A resumed run past the window profiles nothing.
    """

    def __init__(self, profile_cfg, run_dir: Path | str, rank: int, device: torch.device | str):
        self.cfg = profile_cfg
        self.enabled = bool(profile_cfg.enabled)
        self.out_dir = Path(run_dir) / "profile" / f"rank{rank}"
        self.device = torch.device(device)
        self._prof: Any = None  # torch.profiler.profile while the window is open
        self._steps_in_window = 0
        self.traces: list[Path] = []
        total = profile_cfg.wait + profile_cfg.warmup + profile_cfg.active
        if self.enabled and (profile_cfg.active <= 0 or profile_cfg.wait < 0 or profile_cfg.warmup < 0):
            raise ValueError("profile: active must be > 0 and wait, warmup >= 0")
        self._total = total

    def _open(self, first_step: int) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        first_active = first_step + self.cfg.wait + self.cfg.warmup

        def on_trace_ready(prof) -> None:
            last = first_active + self.cfg.active - 1
            path = self.out_dir / f"steps_{first_active}-{last}.pt.trace.json"
            prof.export_chrome_trace(str(path))
            self.traces.append(path)

        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=self.cfg.wait, warmup=self.cfg.warmup, active=self.cfg.active, repeat=1),
            on_trace_ready=on_trace_ready,
            record_shapes=False,
            with_stack=False,
        )
        self._prof.start()

    def begin(self, step: int) -> None:
        """Before running `step`: opens the profiler when the window starts there."""
        if self.enabled and self._prof is None and self._steps_in_window == 0 and step == self.cfg.start_step:
            self._open(step)

    def step(self, step: int) -> None:
        """After `step` finished."""
        if self._prof is None:
            return
        self._prof.step()
        self._steps_in_window += 1
        if self._steps_in_window >= self._total:
            self.close()

    @property
    def active(self) -> bool:
        return self._prof is not None

    def close(self) -> None:
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.stop()
