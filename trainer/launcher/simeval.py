"""The simulator evaluation during training (eval.sim): node 0's launcher evaluates checkpoints apart.

    sim = SimEval.start(launch, attempt)    # None unless eval.sim is set (node 0 only); a watcher thread
    torchrun.sidecar = sim                  # its processes survive the reaping of torchrun's orphans
    ...                                     # the ranks train; they never wait for an evaluation
    sim.finish(wait=completed)              # after the ranks: wait (eval.sim_wait_s, said) or abandon

Why the launcher: it already owns the processes, the signals and the verdict; the ranks only save. Every
POLL_S the watcher thread scans RUN_DIR/checkpoints for complete checkpoints whose step is a multiple of
eval.sim_every and that have no final record, queues them oldest first, and runs one evaluation at a time:
`python -m trainer.evaluation.cli CHECKPOINT --sim libero --suite ... --json-file ...` (bin/evaluate's own
module) in a session of its own, with the ranks' python, its output in OUT/launcher-evaluate.log, OUT =
RUN_DIR/evaluation/checkpoint_step_N/libero/<suite>/ (bin/evaluate's default). On eval.sim_device cpu it
runs with OMP_NUM_THREADS=1 (the spare cores; the ranks keep theirs); cuda:K gives it that GPU alone.

Retention: the checkpoint is pinned (simrecords.pin) before the evaluator starts and unpinned after its
record is written; rank 0's pruning keeps pinned steps (best.py BestPin) and re-reads the pins right before
each removal; a checkpoint marked as being removed is taken at the next poll (simrecords.py: no race). A
queued checkpoint pruned before its turn is recorded `skipped`; one that vanished during its evaluation
(removed by hand) `abandoned`. While it runs, the launcher touches the pin (its heartbeat).

Results (simresults.py): RUN_DIR/evaluation/sim.json (one record per step), a `{"record": "sim", "step",
"sim/success_rate", ...}` line in metrics.jsonl, `sim/success_rate` at the checkpoint's step in
RUN_DIR/tensorboard/ (an event file of its own, suffix .sim), RUN_DIR/checkpoints/best with eval.best_by
sim, and summary.json's `sim` (write_final_summary).

Stops: a stop request (the attempt's stop file: SIGTERM, SIGUSR1, Ctrl-C to the launcher) abandons the
running evaluation at once (SIGINT to its session, SIGKILL after ABANDON_GRACE_S; what finished stays in
OUT, results.json is only ever written whole by bin/evaluate) and records it `abandoned`; the next attempt
evaluates that checkpoint again (bin/evaluate continues its episodes). A `failed` one (bin/evaluate exited
2: bad input) keeps the eval.sim_* values it ran with (evaluator_settings); a later attempt whose values
differ (the user fixed one) evaluates it again, and says so. At the end of a completed run the
launcher says which evaluations are left and waits for them up to eval.sim_wait_s, then abandons the rest;
a failed, preempted or hung run abandons them at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from trainer.checkpoint import simrecords
from trainer.checkpoint.layout import scan
from trainer.launcher import simresults
from trainer.launcher.console import say

POLL_S = 1.0
ABANDON_GRACE_S = 20.0
FINAL = (simrecords.DONE, simrecords.FAILED, simrecords.SKIPPED)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)


@dataclass
class Running:
    step: int
    proc: subprocess.Popen[bytes]
    out: Path
    log: Path
    started: float


def evaluator_command(python: str, checkpoint: Path, ev: Any, out: Path) -> list[str]:
    """bin/evaluate's module on one checkpoint, with the run's eval.sim_* settings (no --config or scale
    flag: a checkpoint carries its own config, and bin/evaluate refuses one that is not its own)."""
    argv = [
        python, "-m", "trainer.evaluation.cli", str(checkpoint), "--sim", ev.sim, "--suite", ev.sim_suite,
        "--episodes", str(ev.sim_episodes), "--max-steps", str(ev.sim_max_steps), "--plots-dir", str(out),
        "--json-file", str(out / "launcher-evaluate.json"),
        "--device", "cpu" if ev.sim_device == "cpu" else "cuda",
    ]  # fmt: skip
    if ev.sim_tasks != "all":
        argv += ["--tasks", ev.sim_tasks]
    if ev.sim_workers:
        argv += ["--workers", str(ev.sim_workers)]
    return argv


SETTINGS = ("sim", "sim_suite", "sim_tasks", "sim_episodes", "sim_max_steps", "sim_workers", "sim_device")


def evaluator_settings(ev: Any) -> dict[str, Any]:
    """The eval.* values evaluator_command passes: a `failed` record keeps them (bin/evaluate's exit 2 is
    final for them alone; a resume with any of them changed evaluates that checkpoint again)."""
    return {f"eval.{name}": getattr(ev, name) for name in SETTINGS}


def _changed(had: Any, now: dict[str, Any]) -> str:
    if not isinstance(had, dict):
        return "settings it did not record (an earlier version)"
    return ", ".join(f"{k}={had.get(k)!r} (now {v!r})" for k, v in now.items() if had.get(k) != v)


def evaluator_env(env: dict[str, str], device: str) -> dict[str, str]:
    child = dict(env)
    if device == "cpu":
        child["OMP_NUM_THREADS"] = "1"  # spare cores: the ranks keep theirs (--device cpu; an empty
        # CUDA_VISIBLE_DEVICES would break robosuite's EGL device choice in the simulator workers)
    else:  # cuda:K: the K-th GPU this node sees, and only it
        index = int(device.split(":")[1])
        visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
        child["CUDA_VISIBLE_DEVICES"] = visible[index] if index < len(visible) else str(index)
    return child


def _unblock_signals() -> None:
    """In the evaluator's child before exec: the watcher thread blocks the stop signals, and a launcher
    started in the background of a non-interactive shell (`bin/train ... &` in a script) ignores SIGINT;
    an exec keeps both, so the evaluator would outlast abandon()'s SIGINT until the SIGKILL."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    for sig in STOP_SIGNALS:  # a handler is reset by the exec anyway; an ignored signal is not
        signal.signal(sig, signal.SIG_DFL)


class SimEval:
    """The watcher (module docstring). poll() is the whole of one pass; the thread calls it every POLL_S."""

    def __init__(self, cfg: Any, run_dir: Path, python: str, env: dict[str, str], stop_file: Path) -> None:
        self.cfg, self.ev = cfg, cfg.eval
        self.run_dir, self.root = Path(run_dir), Path(run_dir) / "checkpoints"
        self.python, self.env, self.stop_file = python, env, stop_file
        records = simrecords.read_records(self.root)
        now = evaluator_settings(self.ev)
        again = {step: r for step, r in records.items() if r.get("status") == simrecords.FAILED
                 and r.get("settings") != now}  # fmt: skip
        for step, r in sorted(again.items()):
            say(f"sim: step {step} failed with {_changed(r.get('settings'), now)}: evaluated again")
        self.seen = {step for step, r in records.items() if r.get("status") in FINAL and step not in again}
        complete = scan(self.root)[0]
        self.floor = complete[-1].step if complete else 0  # later due steps the watcher must see or record
        self.queue: list[int] = []
        self.current: Running | None = None
        self.publisher = simresults.Publisher(cfg, self.run_dir)
        self.halted = threading.Event()
        self.thread: threading.Thread | None = None

    @classmethod
    def start(cls, launch: Any, attempt: Any) -> SimEval | None:
        if launch.cfg.eval.sim == "none" or launch.rdzv.node_rank != 0:
            return None
        sim = cls(launch.cfg, launch.run_dir, str(launch.choice.python), launch.env, attempt.stop_file)
        ev = launch.cfg.eval
        say(f"sim: checkpoints every {ev.sim_every} steps are evaluated in LIBERO {ev.sim_suite} (tasks "
            f"{ev.sim_tasks}, {ev.sim_episodes} episode(s) each, max {ev.sim_max_steps} steps) by a process "
            f"beside the ranks, on {ev.sim_device}; results in {sim.root.parent / 'evaluation'}")  # fmt: skip
        if ev.sim_device == "cpu" and not launch.cpu_scale:
            say("sim: eval.sim_device is cpu at full scale: the policy is served on CPU (hours per "
                "evaluation); give it a GPU the ranks leave free with eval.sim_device=cuda:K")  # fmt: skip
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the main thread takes the stop signals
        try:
            sim.thread = threading.Thread(target=sim._watch, name="lingbot-simeval", daemon=True)
            sim.thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return sim

    def _watch(self) -> None:
        while not self.halted.wait(POLL_S):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - the watcher must never take the launcher down
                say(f"sim: watcher error (evaluations stop for this attempt): {type(exc).__name__}: {exc}")
                return

    def halt(self) -> None:
        """Stop the watcher thread (torchrun's orphans are reaped next; the evaluator keeps running)."""
        self.halted.set()
        if self.thread is not None:
            self.thread.join()

    def pids(self) -> set[int]:
        """The evaluator and its descendants (the simulator workers): not torchrun's orphans."""
        if self.current is None:
            return set()
        try:
            proc = psutil.Process(self.current.proc.pid)
            return {proc.pid} | {p.pid for p in proc.children(recursive=True)}
        except psutil.Error:
            return {self.current.proc.pid}

    def poll(self) -> None:
        if self.stop_file.exists():
            self.abandon("the run was asked to stop (a stop signal): the ranks save and exit")
            return
        self._discover()
        self._reap()
        self._start_next()

    def _discover(self) -> None:
        complete = scan(self.root)[0]
        steps = {c.step for c in complete}
        for info in complete:
            if info.step % self.ev.sim_every == 0 and info.step not in self.seen:
                self.seen.add(info.step)
                self.queue.append(info.step)
        newest = max(steps, default=0)
        for step in range(
            self.floor + self.ev.sim_every - self.floor % self.ev.sim_every, newest, self.ev.sim_every
        ):
            if step not in self.seen:  # saved and pruned (checkpoint.keep) between two polls
                self.seen.add(step)
                self._record(
                    step, simrecords.SKIPPED, reason="pruned by checkpoint.keep before the launcher saw it"
                )

    def _start_next(self) -> None:
        while self.current is None and self.queue:
            step = self.queue.pop(0)
            simrecords.pin(self.root, step)  # before the check: pruning either sees the pin or ran before
            if simrecords.being_removed(self.root, step):  # rank 0 decides on it now: kept or gone next poll
                self.queue.insert(0, step)
                return
            info = next((c for c in scan(self.root)[0] if c.step == step), None)
            if info is None:
                self._record(step, simrecords.SKIPPED, reason="pruned by checkpoint.keep before its turn")
                continue
            out = self.run_dir / "evaluation" / info.path.name / self.ev.sim / self.ev.sim_suite
            out.mkdir(parents=True, exist_ok=True)
            (out / "launcher-evaluate.json").unlink(missing_ok=True)
            log = out / "launcher-evaluate.log"
            argv = evaluator_command(self.python, info.path, self.ev, out)
            with open(log, "ab") as sink:
                proc = subprocess.Popen(
                    argv, env=evaluator_env(self.env, self.ev.sim_device), stdin=subprocess.DEVNULL,
                    stdout=sink, stderr=sink, start_new_session=True, preexec_fn=_unblock_signals,
                )  # fmt: skip
            self.current = Running(step, proc, out, log, time.time())
            going = "the ranks have ended" if self.halted.is_set() else "training goes on"
            say(f"sim: evaluating {info.path.name} (pid {proc.pid}, log {log}); {going}")

    def _reap(self) -> None:
        run = self.current
        if run is not None:
            simrecords.beat(self.root, run.step)  # the pin's heartbeat: a reader elsewhere sees it held
        if run is None or run.proc.poll() is None:
            return
        rc = run.proc.returncode
        result = simresults.read_results(run.out)
        complete = result is not None and rc == 0 and not result.get("missing")
        if complete:
            self._record(run.step, simrecords.DONE, run, result)
        elif not (self.root / f"checkpoint_step_{run.step}").is_dir():
            self._record(
                run.step, simrecords.ABANDONED, run, None, "its checkpoint was removed while evaluated"
            )
        elif rc == 2:  # bad input: the same command fails the same way; retried once its settings change
            why = f"bin/evaluate exited 2 (log {run.log}); evaluated again once an eval.sim_* value changes"
            self._record(run.step, simrecords.FAILED, run, None, why)
        else:  # errored episodes, a simulator env that did not build: the next attempt retries (it resumes)
            why = f"bin/evaluate exited {rc} (log {run.log}); the next attempt evaluates it again"
            self._record(run.step, simrecords.ABANDONED, run, None, why)
        self.current = None

    def abandon(self, why: str) -> None:
        """End the running evaluation (SIGINT, SIGKILL after ABANDON_GRACE_S) and record it and the queue."""
        run, self.current = self.current, None
        if run is not None:
            family = self.pids_of(run)
            _signal_session(run.proc.pid, signal.SIGINT)
            try:
                run.proc.wait(timeout=ABANDON_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_session(run.proc.pid, signal.SIGKILL)
                run.proc.wait()
            _kill_left(family)
            self._record(run.step, simrecords.ABANDONED, run, simresults.read_results(run.out), why)
            say(f"sim: abandoned the evaluation of step {run.step}: {why}; what finished stays in {run.out} "
                f"(the next attempt, or bin/evaluate {self.root}/checkpoint_step_{run.step} --sim "
                f"{self.ev.sim}, continues it)")  # fmt: skip
        for step in self.queue:
            simrecords.write_record(self.root, {"step": step, "status": simrecords.ABANDONED, "reason": why})
        self.queue.clear()

    def pids_of(self, run: Running) -> list[psutil.Process]:
        try:
            return psutil.Process(run.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def _record(self, step: int, status: str, run: Running | None = None, result: dict | None = None,
                reason: str | None = None) -> None:  # fmt: skip
        started, code, log = (run.started, run.proc.returncode, run.log) if run else (None, None, None)
        record = simresults.make_record(step, status, started, result, reason, code, log)
        record["settings"] = evaluator_settings(self.ev)
        self.publisher.publish(record)  # the record first, then the pin goes: pruning sees one of them
        simrecords.unpin(self.root, step)

    def finish(self, wait: bool) -> None:
        """After the ranks: the last checkpoint queued, then wait (bounded, said) or abandon."""
        self.halt()
        stop = self.stop_file.exists()
        if not stop:
            self._discover()
            self._reap()
            self._start_next()
        if self.current is not None or self.queue:
            steps = ([self.current.step] if self.current else []) + self.queue
            if wait and not stop:
                self._wait(steps)
            else:
                self.abandon("the run ended " + ("on a stop signal" if stop else "without completing"))
        self.publisher.close()

    def _wait(self, steps: list[int]) -> None:
        bound = self.ev.sim_wait_s
        say(f"sim: the run ended while the evaluation of step(s) {steps} is still to finish: waiting up to "
            f"{bound:.0f} s (eval.sim_wait_s); a stop signal abandons it")  # fmt: skip
        signalled: list[str] = []
        previous = {
            s: signal.signal(s, lambda n, f: signalled.append(signal.Signals(n).name)) for s in STOP_SIGNALS
        }
        deadline = time.monotonic() + bound
        try:
            while (self.current is not None or self.queue) and not signalled and time.monotonic() < deadline:
                assert self.current is not None
                try:
                    self.current.proc.wait(timeout=min(POLL_S, max(0.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    continue
                self._reap()
                self._start_next()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.current is not None or self.queue:
            why = f"received {signalled[0]}" if signalled else f"eval.sim_wait_s ({bound:.0f} s) passed"
            self.abandon(why)


def _signal_session(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_left(family: list[psutil.Process]) -> None:
    """The simulator workers run in sessions of their own: end any the evaluator left behind."""
    for proc in family:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(family, timeout=10)
