"""The stall detector: a hung rank is a failure that is said, with where each rank is, not silence.

The launcher polls the attempt's progress.json (rank 0 writes it after every step; a step completes on
every rank at its collective, so one writer speaks for all) while it waits for torchrun. When no step
has completed for longer than the limit, it says one line at once, then records every local rank's
Python stacks (py-spy: seconds on a loaded node) and ends the attempt (the verdict is failed, exit 1,
with a `hung` record; trainer/outcomes.py Hung).

The limit (config `hang`, trainer/config.py HangConfig) follows the phase rank 0 reports in
progress.json (trainer/loop/phases.py), counted from the phase's start: start-up (no progress.json yet) and
the first compiled step, start_s; a step, step_factor x the median step time of this attempt after its
first warm_up_steps steps (before that, the first compiled step's time), at least floor_s; a save or
an evaluation, step_factor x the length rank 0 predicts from this attempt's measurements, at least
phase_s (an I/O phase's own floor: a network filesystem can stall for minutes without anything hung).
Always at most 0.9 x collective_timeout_s (the backend's own timeout is the backstop and must come later).

When the attempt has stalled but every rank recorded `completed` and the last step's checkpoint is
complete, it is not a hang: torchrun (or what is left of the ranks' teardown) did not exit. The launcher
ends it, names it in one line, and the verdict is the work's: completed.

Stacks: py-spy (`py-spy dump --nonblocking`), not a faulthandler signal the ranks register: a rank
that is stopped (SIGSTOP, a frozen node, a process stuck in the kernel) cannot run a signal handler,
so a faulthandler dump comes only from the healthy ranks, while py-spy reads the interpreter's memory
from outside (process_vm_readv; root or the same user with ptrace allowed) and needs nothing from the
rank: it names the frame of the stopped rank as well as the collective the others wait in. Without
py-spy on PATH (or beside the launcher's python) the record says so and the attempt still ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from provision.atomic import write_atomic
from trainer.attempt import COMPLETED, EVALUATION, FIRST_STEP, SAVE, Attempt, Hung, Progress, record_hang
from trainer.config import HangConfig

POLL_S = 0.5  # how often the launcher looks at progress.json while torchrun runs
CEILING = 0.9  # the limit never reaches this fraction of the collective timeout
PY_SPY_TIMEOUT_S = 30.0
STACKS_DIR = "stacks"


def duration(seconds: float) -> str:
    """4 min 10 s, 6.3 s, 1 h 2 min."""
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@dataclass
class StallClock:
    """Completed steps and rank 0's phase as the launcher observes them, and the limit they imply."""

    cfg: HangConfig
    started: float  # monotonic: torchrun's start
    last_step: int | None = None
    last_change: float = 0.0  # the last step or phase change seen: the stall is counted from it
    last_step_at: float = 0.0
    first_step: int | None = None
    step_times: list[float] = field(default_factory=list)  # seconds per step, after warm-up
    phase: str | None = None  # None: start-up (no progress.json yet)
    expect_s: float | None = None  # rank 0's prediction of the phase's length
    phase_key: tuple[object, ...] = ()
    first_step_s: float | None = None  # the attempt's first (compiled) step, from its phase's start

    def __post_init__(self) -> None:
        self.last_change = self.last_step_at = self.started

    def observe(
        self, step: int | None, now: float, phase: str | None = None, phase_time: float | None = None,
        expect_s: float | None = None,
    ) -> None:  # fmt: skip
        """Feed progress.json's last completed step (and its phase) read at monotonic time `now`."""
        key, since = (phase, phase_time), self.last_change
        if phase is not None and key != self.phase_key:
            self.phase, self.expect_s, self.phase_key, self.last_change = phase, expect_s, key, now
        if step is None or step == self.last_step:
            return
        if self.last_step is not None and step > self.last_step and self.first_step is not None:
            done = step - self.first_step  # steps completed in this attempt, this one included
            if done > self.cfg.warm_up_steps:
                per_step = (now - self.last_step_at) / (step - self.last_step)
                self.step_times.extend([per_step] * min(step - self.last_step, 8))
        if self.first_step is None:
            self.first_step, self.first_step_s = step, now - since
        self.last_step, self.last_step_at, self.last_change = step, now, now

    def median(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None

    def phase_name(self) -> str:
        if self.phase in (SAVE, EVALUATION, FIRST_STEP):
            return self.phase
        return "start-up" if self.last_step is None else "step"

    def limit(self) -> float:
        """start-up and the first compiled step: start_s; a save or an evaluation: step_factor x its
        predicted length, at least phase_s (a filesystem's stall is not a hang); a step: step_factor x the
        median step, at least floor_s (during the warm-up steps, the first compiled step's time stands
        for the median). At most 0.9 x the backend's."""
        cfg, name = self.cfg, self.phase_name()
        if name in ("start-up", FIRST_STEP):
            own = cfg.start_s
        elif name in (SAVE, EVALUATION):
            own = max(cfg.phase_s, cfg.step_factor * (self.expect_s or 0.0))
        else:
            median = self.median()
            if median is None and self.first_step_s is not None:  # warm-up: the compiled step's time
                median = self.first_step_s
            own = max(cfg.floor_s, cfg.step_factor * median) if median is not None else cfg.start_s
        return min(own, CEILING * cfg.collective_timeout_s)

    def stalled_for(self, now: float) -> float:
        return now - self.last_change

    def stalled(self, now: float) -> bool:
        return self.stalled_for(now) > self.limit()


def rank_processes(torchrun_pid: int) -> dict[int, psutil.Process]:
    """The local ranks under torchrun, by global rank (their RANK variable)."""
    found: dict[int, psutil.Process] = {}
    try:
        children = psutil.Process(torchrun_pid).children()
    except psutil.Error:
        return found
    for child in children:
        try:
            if "trainer.loop.train" in " ".join(child.cmdline()):
                found[int(child.environ()["RANK"])] = child
        except (psutil.Error, KeyError, ValueError):
            pass
    return found


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def innermost_frame(dump: str) -> str | None:
    """The first frame under the main thread's header in a `py-spy dump` (the innermost call). The main
    thread is the one py-spy names "MainThread" or, where it prints no name (a process that never
    imported threading: `Thread 4798 (idle)`), the one whose id is the process's (Linux: TID == PID)."""
    lines = dump.splitlines()
    pid = next((line.split()[1].rstrip(":") for line in lines if line.startswith("Process ")), None)
    for i, line in enumerate(lines):
        if line.startswith("Thread ") and ("MainThread" in line or line.split()[1] == pid):
            for frame in lines[i + 1 :]:
                if frame.strip() and frame.startswith((" ", "\t")):
                    return frame.strip()
                if frame.startswith("Thread "):
                    return None
    return None


def dump_stacks(procs: dict[int, psutil.Process], out_dir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """py-spy's dump of every rank into out_dir/rank_<R>.txt: (files by rank, innermost frame by rank)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tool = py_spy()
    files: dict[str, str] = {}
    innermost: dict[str, str] = {}
    for rank, proc in sorted(procs.items()):
        path = out_dir / f"rank_{rank}.txt"
        if tool is None:
            text = "py-spy not found (beside the launcher's python or on PATH): pip install py-spy\n"
        else:
            argv = [tool, "dump", "--nonblocking", "--pid", str(proc.pid)]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S)
                text = done.stdout + (
                    f"\n[py-spy exit {done.returncode}] {done.stderr}" if done.returncode else ""
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                text = f"py-spy failed: {exc}\n"
        write_atomic(path, text)
        files[str(rank)] = str(path)
        innermost[str(rank)] = innermost_frame(text) or text.strip().splitlines()[-1][:200]
    return files, innermost


def stopped(procs: dict[int, psutil.Process]) -> list[int]:
    out = []
    for rank, proc in sorted(procs.items()):
        try:
            if proc.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                out.append(rank)
        except psutil.Error:
            pass
    return out


class StallDetector:
    """Polled by supervise.Torchrun.wait: `check()` returns a Hung record once the attempt has stalled."""

    def __init__(self, cfg: HangConfig, attempt: Attempt, node: int, world_size: int, policy: str):
        self.cfg, self.attempt, self.node, self.world_size, self.policy = (
            cfg,
            attempt,
            node,
            world_size,
            policy,
        )
        self.clock = StallClock(cfg, started=time.monotonic())

    def check(self, torchrun_pid: int) -> Hung | str | None:
        """None while the attempt moves; a Hung record once it stalled (its stacks: with_stacks); a line
        (str) when every rank reported completion and the last checkpoint is complete, yet torchrun did not
        exit."""
        now = time.monotonic()
        progress = self.attempt.read_progress()
        self.clock.observe(progress.last_step, now, progress.phase, progress.phase_time, progress.expect_s)
        if not self.clock.stalled(now):
            return None
        lingered = self.finished_line(progress)
        return lingered if lingered is not None else self.fire(torchrun_pid, now)

    def finished_line(self, progress: Progress) -> str | None:
        records = [self.attempt.read_rank(r) for r in range(self.world_size)]
        if not all(r is not None and r.status == COMPLETED for r in records) or progress.last_step is None:
            return None
        from trainer.checkpoint.layout import scan  # on disk (an asynchronous save commits late)

        complete, _ = scan(self.attempt.dir.parent.parent / "checkpoints")
        if not complete or complete[-1].step != progress.last_step:
            return None
        return (
            f"torchrun did not exit {duration(self.clock.stalled_for(time.monotonic()))} after every rank "
            f"reported completion (step {progress.last_step}, checkpoint {complete[-1].path} complete): "
            "ended it; the work is done"
        )

    def fire(self, torchrun_pid: int, now: float) -> Hung:
        clock = self.clock
        procs = rank_processes(torchrun_pid)
        median = clock.median()
        ranks = list(range(self.world_size))
        since = f"step {clock.last_step}" if clock.last_step is not None else "their start (no step yet)"
        # one rounded figure for the line and the summary: formatting the unrounded value here and rounding
        # it again for the summary could print 8.5 s beside a recorded 8.449
        stalled_s = round(clock.stalled_for(now), 3)
        line = (
            f"no step for {duration(stalled_s)}"
            + (
                f" (median step {duration(median)})"
                if median is not None
                else f" (limit {duration(clock.limit())})"
            )
            + (
                f" during the {clock.phase_name()} (limit {duration(clock.limit())})"
                if clock.phase_name() != "step"
                else ""
            )
            + f": ranks {', '.join(map(str, ranks))} silent since {since}"
        )
        halted = stopped(procs)
        if halted:
            line += "; stopped (not running): " + ", ".join(f"rank {r} (pid {procs[r].pid})" for r in halted)
        return Hung(
            node=self.node,
            line=line,
            last_step=clock.last_step,
            silent_ranks=ranks,
            stalled_s=stalled_s,
            limit_s=round(clock.limit(), 3),
            median_step_s=round(median, 4) if median is not None else None,
            stack_files={},  # with_stacks() fills them once the line is said
            innermost={},
            stopped_ranks=halted,
            policy=self.policy,
        )

    def with_stacks(self, hung: Hung, torchrun_pid: int) -> Hung:
        """The Hung record with every local rank's stacks (py-spy: seconds on a loaded node), taken after
        the launcher said the line, so the line comes when the stall is seen, and before the ranks end."""
        procs = rank_processes(torchrun_pid)
        files, innermost = dump_stacks(procs, self.attempt.dir / STACKS_DIR / f"node{self.node}")
        return replace(hung, stack_files=files, innermost=innermost)


def resolve_policy(cfg: HangConfig, environ: dict[str, str]) -> str:
    """auto: requeue under Slurm (a hang is often the node's fault), fail elsewhere."""
    if cfg.policy != "auto":
        return cfg.policy
    return "requeue" if environ.get("SLURM_JOB_ID") else "fail"


def kill_tree(torchrun_pid: int) -> list[int]:
    """SIGKILL torchrun first (killed ranks would make it print a failure report), then every process
    under it (a stopped process dies of SIGKILL too); they are re-parented to the launcher, which reaps
    them (supervise.Torchrun._stop_orphans)."""
    try:
        below = psutil.Process(torchrun_pid).children(recursive=True)
    except psutil.Error:
        below = []
    try:
        os.kill(torchrun_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for proc in below:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return [p.pid for p in below]


def settle(hung: Hung, run_dir: Path, attempt: Attempt, environ: dict[str, str], no_requeue: bool) -> bool:
    """After a hang: record it (node 0: RUN_DIR/hangs.json, which survives a requeue; every node: its
    hung.node<N>.json) and decide the policy. True when node 0 should requeue the Slurm job now."""
    want = False
    if hung.node == 0:
        before = record_hang(run_dir, attempt.id, hung.last_step)
        again = [h for h in before if h.get("step") == hung.last_step]
        if hung.policy != "requeue":
            hung.requeue = "not requeued: hang.policy is fail (the default outside Slurm)"
        elif again:
            hung.requeue = (
                f"not requeued: the second hang after step {hung.last_step} "
                f"(attempt {again[0].get('attempt')} hung there too); "
                "a hang that repeats at the same step fails for good"
            )
        elif not environ.get("SLURM_JOB_ID"):
            hung.requeue = "not requeued: hang.policy is requeue, but this is not a Slurm job"
        elif no_requeue:
            hung.requeue = "not requeued: hang.policy is requeue, but --no-requeue was given"
        else:
            hung.requeue, want = f"requeueing Slurm job {environ['SLURM_JOB_ID']}", True
    attempt.write_hung(hung)
    return want
