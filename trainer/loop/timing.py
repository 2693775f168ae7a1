"""Where a training step's time goes: a per-rank, per-optimizer-step breakdown into phases.

The loop marks phase boundaries (`with breakdown.phase("forward"):`); FSDP2's collectives are timed
from inside FSDP through its public custom-comm hooks (`install_comm_timing`). At `end_step` the
timeline is resolved into non-overlapping intervals, so the phases plus `idle` add up to the step:

- nested phases count once: time goes to the innermost open phase (a profiler's "self time");
- communication wins over the phase it ran in: the reduce-scatter that FSDP2 runs from its
  post-backward hooks is `grad_comm`, not `backward`; the parameter all-gathers of forward (and of
  backward, for resharded blocks) are `param_comm`, not `forward`/`backward`;
- time inside the step but in no phase is `idle` (never negative by construction);
- `eval` (the held-out losses at a checkpoint, trainer/loop/validate.py) is charged whole, its FSDP
  all-gathers included, so its share is the evaluation's cost.

On CUDA every boundary is an event recorded on the current stream (communication: on FSDP's comm
stream), resolved with one synchronize at `end_step`, so asynchronous kernels are charged to the phase
whose stream interval they ran in. Comm that overlaps compute on another stream is charged to
communication, so on GPU `compute_share` is a lower bound. On CPU (gloo) every collective blocks the
calling thread, so host `perf_counter` stamps are exact.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Iterator, Sequence

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

# FSDP2's comm interfaces are not re-exported publicly in torch 2.13; set_custom_* (public) takes them.
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

PHASES = ("data", "h2d", "forward", "backward", "grad_comm", "param_comm", "optimizer", "checkpoint", "eval")
COMM_PHASES = ("grad_comm", "param_comm")  # recorded by install_comm_timing; grad_comm wins overlaps
COMPUTE_PHASES = ("forward", "backward", "optimizer")
_IDLE = "idle"


class _HostClock:
    """perf_counter stamps: exact when all work is synchronous on the calling thread (CPU, gloo)."""

    def stamp(self) -> float:
        return time.perf_counter()

    def resolve(self, stamps: Sequence[float]) -> list[float]:
        return [s - stamps[0] for s in stamps]


class _CudaClock:
    """CUDA events on the current stream; one synchronize per step resolves them all."""

    def __init__(self, device: torch.device):
        self.device = device

    def stamp(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def resolve(self, stamps: Sequence[torch.cuda.Event]) -> list[float]:
        torch.cuda.synchronize(self.device)
        origin = stamps[0]
        return [0.0] + [origin.elapsed_time(e) / 1e3 for e in stamps[1:]]


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _subtract(
    intervals: list[tuple[float, float]], cut: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Sorted disjoint `intervals` minus sorted disjoint `cut`."""
    out = []
    for start, end in intervals:
        pieces = [(start, end)]
        for c0, c1 in cut:
            if c1 <= start or c0 >= end:
                continue
            next_pieces = []
            for p0, p1 in pieces:
                if c0 > p0:
                    next_pieces.append((p0, min(p1, c0)))
                if c1 < p1:
                    next_pieces.append((max(p0, c1), p1))
            pieces = [(a, b) for a, b in next_pieces if b > a]
        out.extend(pieces)
    return out


def _overlap(start: float, end: float, disjoint: list[tuple[float, float]], starts: list[float]) -> float:
    """Length of [start, end] covered by the sorted disjoint intervals (`starts` = their starts)."""
    total = 0.0
    i = max(bisect.bisect_right(starts, start) - 1, 0)
    while i < len(disjoint) and disjoint[i][0] < end:
        total += max(0.0, min(end, disjoint[i][1]) - max(start, disjoint[i][0]))
        i += 1
    return total


class StepBreakdown:
    """Per-rank breakdown of one optimizer step into PHASES + idle (see the module docstring)."""

    PHASES = PHASES

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._clock = _CudaClock(self.device) if self.device.type == "cuda" else _HostClock()
        self._active = False
        self._stack: list[str] = []
        self._marks: list[tuple[object, str | None]] = []  # (stamp, innermost phase from here on)
        self._comm: list[tuple[object, object, str]] = []  # (start stamp, end stamp, comm phase)
        self._comm_calls = dict.fromkeys(COMM_PHASES, 0)
        self.comm_calls: dict[str, int] = dict.fromkeys(COMM_PHASES, 0)  # of the last ended step

    @property
    def in_step(self) -> bool:
        return self._active

    def start_step(self) -> None:
        self._stack = []
        self._comm = []
        self._comm_calls = dict.fromkeys(COMM_PHASES, 0)
        self._marks = [(self._clock.stamp(), None)]
        self._active = True

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; known: {', '.join(PHASES)}")
        if not self._active:  # outside a step (e.g. setup): nothing to attribute to
            yield
            return
        self._stack.append(name)
        self._marks.append((self._clock.stamp(), name))
        try:
            yield
        finally:
            self._stack.pop()
            self._marks.append((self._clock.stamp(), self._stack[-1] if self._stack else None))

    @contextlib.contextmanager
    def comm(self, name: str) -> Iterator[None]:
        """Time one collective; called by the comm wrappers, possibly from autograd's thread."""
        if name not in COMM_PHASES:
            raise ValueError(f"unknown comm phase {name!r}; known: {', '.join(COMM_PHASES)}")
        if not self._active or "eval" in self._stack:  # held-out evaluation: its all-gathers are its cost
            yield
            return
        start = self._clock.stamp()
        try:
            yield
        finally:
            self._comm.append((start, self._clock.stamp(), name))
            self._comm_calls[name] += 1

    def end_step(self) -> dict[str, float]:
        if not self._active:
            raise RuntimeError("StepBreakdown.end_step() without start_step()")
        if self._stack:
            raise RuntimeError(f"StepBreakdown.end_step() inside open phase(s): {self._stack}")
        self._marks.append((self._clock.stamp(), None))
        self._active = False
        comm = list(self._comm)  # a snapshot: a stray late collective must not mutate it mid-resolve
        stamps = [s for s, _ in self._marks] + [s for c in comm for s in c[:2]]
        times = self._clock.resolve(stamps)  # type: ignore[arg-type]  # stamps are this clock's own
        n = len(self._marks)
        mark_times, comm_times = times[:n], times[n:]
        step = mark_times[-1]

        def clipped(kind: str) -> list[tuple[float, float]]:
            return _merge(
                [
                    (max(0.0, comm_times[2 * i]), min(step, comm_times[2 * i + 1]))
                    for i, c in enumerate(comm)
                    if c[2] == kind
                ]
            )

        grad = clipped("grad_comm")
        param = _subtract(clipped("param_comm"), grad)
        all_comm = _merge(grad + param)
        starts = [a for a, _ in all_comm]
        seconds = dict.fromkeys((*PHASES, _IDLE), 0.0)
        seconds["grad_comm"] = sum(b - a for a, b in grad)
        seconds["param_comm"] = sum(b - a for a, b in param)
        for i in range(n - 1):
            start, end = mark_times[i], mark_times[i + 1]
            label = self._marks[i][1] or _IDLE
            seconds[label] += max(0.0, (end - start) - _overlap(start, end, all_comm, starts))

        self.comm_calls = dict(self._comm_calls)
        out = {"step_s": step}
        for name in (*PHASES, _IDLE):
            out[f"{name}_s"] = seconds[name]
        for name in (*PHASES, _IDLE):
            out[f"{name}_share"] = seconds[name] / step if step > 0 else 0.0
        out["compute_share"] = sum(seconds[p] for p in COMPUTE_PHASES) / step if step > 0 else 0.0
        return out


def summarize(records: Sequence[dict[str, float]]) -> dict[str, float]:
    """Totals over steps and shares of the total time (what summary.json reports)."""
    if not records:
        return {}
    keys = ["step_s"] + [f"{p}_s" for p in (*PHASES, _IDLE)]
    totals = {k: sum(r[k] for r in records) for k in keys}
    step = totals["step_s"]
    out = {"steps": float(len(records)), **{f"total_{k}": v for k, v in totals.items()}}
    for p in (*PHASES, _IDLE):
        out[f"{p}_share"] = totals[f"{p}_s"] / step if step > 0 else 0.0
    out["compute_share"] = sum(totals[f"{p}_s"] for p in COMPUTE_PHASES) / step if step > 0 else 0.0
    return out


def format_breakdown(record: dict[str, float]) -> str:
    """One log-line fragment: the non-zero shares, largest first, then the compute share."""
    shares = [(p, record[f"{p}_share"]) for p in (*PHASES, _IDLE) if record.get(f"{p}_share", 0) >= 0.005]
    parts = [f"{p} {s:.0%}" for p, s in sorted(shares, key=lambda x: -x[1])]
    return f"compute {record['compute_share']:.2f} | " + " ".join(parts)


# --- FSDP2 communication ---------------------------------------------------------------------------


class TimedReduceScatter(ReduceScatter):
    """FSDP2's gradient reduce-scatter, timed as grad_comm; delegates to the comm it replaces."""

    def __init__(self, inner: ReduceScatter, breakdown: StepBreakdown):
        self.inner = inner
        self.breakdown = breakdown

    def allocate(self, size, *, dtype, device):
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        with self.breakdown.comm("grad_comm"):
            return self.inner(
                output_tensor=output_tensor, input_tensor=input_tensor, group=group, op=op, async_op=async_op
            )


class TimedAllGather(AllGather):
    """FSDP2's parameter all-gather, timed as param_comm. Async all-gathers (explicit
    `unshard(async_op=True)`, not used by the default schedule) are timed at issue only."""

    def __init__(self, inner: AllGather, breakdown: StepBreakdown):
        self.inner = inner
        self.breakdown = breakdown

    def allocate(self, size, *, dtype, device):
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        with self.breakdown.comm("param_comm"):
            return self.inner(
                output_tensor=output_tensor, input_tensor=input_tensor, group=group, async_op=async_op
            )


def install_comm_timing(model: nn.Module, breakdown: StepBreakdown) -> None:
    """Time every FSDP2 collective of `model` into `breakdown` (grad_comm / param_comm).

    Uses FSDPModule.set_custom_reduce_scatter / set_custom_all_gather, wrapping whatever comm each
    module already has, so FSDP's own schedule, streams and buffers are unchanged. Idempotent: a second
    call re-targets the wrappers. HSDP's extra all-reduce (not used by this project's 1-D mesh) is not
    wrapped and stays inside backward.
    """
    found = False
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        groups = _param_groups(module)
        if not groups:
            continue
        found = True
        group = groups[0]
        rs = getattr(group, "_reduce_scatter_comm", None) or DefaultReduceScatter()
        ag = getattr(group, "_all_gather_comm", None) or DefaultAllGather()
        rs = rs.inner if isinstance(rs, TimedReduceScatter) else rs
        ag = ag.inner if isinstance(ag, TimedAllGather) else ag
        module.set_custom_reduce_scatter(TimedReduceScatter(rs, breakdown))
        module.set_custom_all_gather(TimedAllGather(ag, breakdown))
    if not found:
        raise ValueError("install_comm_timing: the model has no fully_shard-ed module with parameters")


def _param_groups(module: FSDPModule) -> list:
    """The module's FSDP param groups (none for a module without parameters). A private field: torch 2.13
    holds a list (`_fsdp_param_groups`), torch <= 2.11 one group or None (`_fsdp_param_group`; found on
    the first GPU check, torch 2.11.0+cu130)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [group] if group is not None else []
