"""torchrun as the launcher's child, and the stop signals: the launcher owns processes and signals.

A stop signal (SIGTERM, SIGUSR1, SIGINT, SIGHUP) becomes the attempt's stop request plus a SIGUSR1 to
every rank; torchrun itself is never signalled (it answers SIGTERM by SIGKILLing the ranks 30 s later,
mid-save). Under Slurm, a preempted run asks `scontrol requeue` for its job.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from types import FrameType
from typing import Any

import psutil  # at import time: rank_pids runs in signal handlers, where a first import can re-enter

from trainer.attempt import Attempt, parse_record_line
from trainer.launcher.console import say

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the launcher dies (kill -9 included), so torchrun never orphans."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Torchrun:
    """torchrun as a child in its own session; stop requests go to the ranks, not to torchrun itself
    (torchrun answers SIGTERM by signalling the ranks and SIGKILLing them 30 s later, mid-save)."""

    def __init__(self, command: list[str], env: dict[str, str], attempt: Attempt):
        self.attempt = attempt
        self.signals: list[str] = []
        self.stderr_tail: deque[str] = deque(maxlen=400)
        self.record_lines: dict[int, dict[str, Any]] = {}  # rank records a rank could only print (disk full)
        self.proc: subprocess.Popen[str] | None = None
        for sig in FORWARDED_SIGNALS:  # before Popen: from here on a signal is a stop request
            signal.signal(sig, self.request_stop)
        self.proc = subprocess.Popen(
            command, env=env, stderr=subprocess.PIPE, text=True, errors="replace",
            start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip
        # The pump thread must never take a stop signal: the kernel may deliver a process-directed signal
        # to any thread that does not block it, and then the main thread, blocked in waitpid, would not
        # run the handler until torchrun exits. The thread inherits the mask set around its start.
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
        try:
            self._pump = threading.Thread(target=self._copy_stderr, daemon=True)
            self._pump.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)

    def _copy_stderr(self) -> None:
        # The ranks' stderr comes through torchrun: pass it on, keep the end to name a killed rank.
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            record = parse_record_line(line)
            if record is not None:  # a rank's record, not for the terminal
                self.record_lines[record["rank"]] = record
                continue
            sys.stderr.write(line)
            sys.stderr.flush()
            self.stderr_tail.append(line)

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        first = not self.signals
        self.signals.append(name)
        self.attempt.request_stop()
        for pid in self.rank_pids():
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        if first:
            say(
                f"received {name}: every rank stops at its next safe point and saves a checkpoint "
                f"(further signals change nothing; even kill -9 keeps the previous checkpoint)"
            )
        else:
            say(f"received {name} again: the stop is already under way")

    def rank_pids(self) -> list[int]:
        if self.proc is None:  # not started yet: the stop file alone tells the ranks
            return []
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []
        pids = []
        for child in children:
            try:
                if "trainer.train" in " ".join(child.cmdline()):
                    pids.append(child.pid)
            except psutil.Error:
                pass
        return pids

    def wait(self) -> int:
        assert self.proc is not None
        rc = self.proc.wait()
        for sig in FORWARDED_SIGNALS:  # the ranks are gone: what is left is writing the summary
            signal.signal(sig, _too_late)
        self._pump.join(timeout=10)
        return rc


def _too_late(signum: int, frame: FrameType | None) -> None:
    say(f"received {signal.Signals(signum).name} after the ranks exited: finishing the summary")


def requeue(environ: dict[str, str]) -> str:
    """Ask Slurm to requeue this job (it then restarts from the checkpoint just saved)."""
    job = environ["SLURM_JOB_ID"]
    if not shutil.which("scontrol"):
        return "not requeued: scontrol not found"
    out = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    if out.returncode == 0:
        return f"requeued Slurm job {job}"
    return f"not requeued: scontrol requeue {job} said: {(out.stderr or out.stdout).strip()}"


# --- main ------------------------------------------------------------------------------------------
