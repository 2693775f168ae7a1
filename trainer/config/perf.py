"""The speed options of a run, resolved for a device: what `auto` means, and the one parser of each value.

    compile_blocks(cfg, device)      -> bool   train.compile: auto = off (unmeasured on a GPU)
    ac_plan(cfg)                     -> AcPlan model.activation_checkpointing: none | full | op | block:K
    prefetch_data(cfg, device)       -> bool   train.data_path: auto = inline (same)
    adamw_impl(cfg, device)          -> dict   train.optimizer: auto = fused on CUDA, for_loop on CPU

None of them changes the maths (a checkpoint resumes across any of them). Each `auto` is the choice a
measurement supports (docs/performance.md: the CPU numbers measured here). On CUDA, compile and prefetch
(torchtitan's choices) stay off until the GPU run of bench/gpu_check.sh measures each faster than the
behaviour before them; fused AdamW was already the CUDA default.
model.activation_checkpointing=auto is resolved by the plan (trainer/plan/choices.py: the fastest choice
predicted to fit) where the launcher plans for a known GPU; a rank that still sees `auto` uses `full` on
CUDA (always fits where anything does) and `none` on CPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_BLOCK = re.compile(r"^block:(\d+)$")


@dataclass(frozen=True)
class AcPlan:
    """Which blocks are checkpointed and how: mode none | full | op; every `every`-th block (1 = all)."""

    mode: str
    every: int = 1

    def wraps(self, index: int) -> bool:
        return self.mode != "none" and index % self.every == 0

    @property
    def name(self) -> str:
        return f"block:{self.every}" if self.mode == "full" and self.every > 1 else self.mode


def parse_ac(value: str, device_type: str = "cuda") -> AcPlan:
    """model.activation_checkpointing -> AcPlan; `auto` unresolved by a plan: full on CUDA, none on CPU."""
    value = str(value).lower()
    if value == "auto":
        value = "full" if device_type == "cuda" else "none"
    m = _BLOCK.match(value)
    if m:
        return AcPlan("full", int(m.group(1))) if int(m.group(1)) > 1 else AcPlan("full")
    if value in ("true", "full"):
        return AcPlan("full")
    if value in ("false", "none"):
        return AcPlan("none")
    if value == "op":
        return AcPlan("op")
    raise ValueError(f"model.activation_checkpointing={value!r}: expected auto, none, full, op or block:K")


def ac_plan(cfg, device_type: str = "cuda") -> AcPlan:
    return parse_ac(cfg.model.activation_checkpointing, device_type)


def _auto(value: str, device: torch.device | str, on_cuda: str, on_cpu: str) -> str:
    value = str(value).lower()
    if value != "auto":
        return value
    return on_cuda if device_type(device) == "cuda" else on_cpu


def device_type(device: torch.device | str) -> str:
    """The device's type ("cuda" for torch.device("cuda:1") or "cuda:1") without importing torch: the
    launcher, which plans with these rules, never imports torch on a CPU node."""
    kind = getattr(device, "type", None)
    return kind if isinstance(kind, str) else str(device).split(":", 1)[0]


def compile_blocks(cfg, device: torch.device | str) -> bool:
    """train.compile: auto = off on every device until a measurement says compiled blocks are faster: on
    the CPU bench/bench_compile.py measured them slower over the main job (the first step's compile); on
    CUDA no GPU run has measured them yet (bench/gpu_check.sh's "compile off" row against its candidate
    row decides)."""
    return _auto(cfg.train.compile, device, "false", "false") in ("true", "on", "1", "yes")


def prefetch_data(cfg, device: torch.device | str) -> bool:
    """train.data_path: auto = inline on every device until a measurement says the prefetching thread is
    faster: on the CPU it was not (2 shared cores: a second busy thread slows the step, and data is < 1%
    of the CPU step); on CUDA no GPU run has measured it yet (bench/gpu_check.sh's "inline data" row)."""
    return _auto(cfg.train.data_path, device, "inline", "inline") == "prefetch"


def adamw_impl(cfg, device: torch.device | str) -> dict[str, bool]:
    """AdamW's implementation flags: fused (CUDA kernels over all parameters), foreach or for_loop. auto:
    fused on CUDA; for_loop on CPU (torch's own CPU default: foreach was not shown faster there)."""
    choice = _auto(cfg.train.optimizer, device, "fused", "for_loop")
    return {"fused": True} if choice == "fused" else {"foreach": choice == "foreach"}
