"""torchrun as the launcher's child, and the stop signals: the launcher owns processes and signals.

A stop signal (SIGTERM, SIGUSR1, SIGINT, SIGHUP) to the launcher becomes the attempt's stop request plus
a SIGUSR1 to every rank. torchrun is never the one that acts on a stop, even when it is signalled too
(under Slurm, srun and slurmstepd signal every process of the step, torchrun included):
- torchrun starts with SIGTERM, SIGUSR1 and SIGINT ignored and its --signals-to-handle limited to
  SIGHUP,SIGQUIT (PET_SIGNALS_TO_HANDLE). Otherwise SIGUSR1 kills it (no handler: exit -10, the
  ranks orphaned mid-save) and SIGTERM makes it raise SignalException (a 30-line traceback) and
  SIGKILL the ranks 30 s later.
  The ranks inherit the ignored dispositions until trainer/loop/rank.py installs its own stop handlers.
- torchrun's parent-death signal is SIGHUP, which it does handle: if the launcher dies (kill -9 too),
  torchrun stops its ranks and exits.
- The launcher is a child subreaper: if torchrun dies (kill -9), its ranks become the launcher's
  children, and the launcher SIGKILLs and reaps them before the verdict. No rank trains on as an orphan,
  and none can write a summary that contradicts the launcher's.
- A stop before any rank exists (torchrun still starting, or waiting in its static rendezvous for a node
  that has not joined: it ignores the stop signals and would wait for its join timeout) is acted on at
  once: the launcher SIGKILLs torchrun (nothing is trained, nothing to save) and `stopped_before_ranks`
  names the signal; the verdict is then preempted, exit 75, the same rule for requeue.

Under Slurm (requeue_wanted is the rule; the README's exit-code section says it):
- SIGUSR1 (the time-limit warning `--signal=B:USR1@N`, or `scancel --batch --signal=USR1`) means
  "checkpoint and come back": after the save, node 0 runs `scontrol requeue`.
- SIGTERM (scancel, scontrol requeue, PreemptMode=REQUEUE/CANCEL, the time limit itself) is Slurm
  acting: save within KillWait, exit 75, never requeue: a cancel stays cancelled, a requeue is Slurm's.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import psutil  # at import time: rank_pids runs in signal handlers, where a first import can re-enter

from trainer import testhooks
from trainer.attempt import Attempt, Hung, parse_record_line
from trainer.launcher.console import TracebackFilter, say
from trainer.launcher.stall import POLL_S, StallDetector, kill_tree

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)


# Signals torchrun ignores (the launcher acts on them) and the ones it may handle itself.
TORCHRUN_IGNORES = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
TORCHRUN_HANDLES = "SIGHUP,SIGQUIT"
TORCHRUN_DEATH_SIGNAL = signal.SIGHUP
REQUEUE_SIGNALS = frozenset({"SIGUSR1"})
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> int:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    return int(libc.prctl(option, value, 0, 0, 0))


def _torchrun_preexec() -> None:
    """In the child, before exec: ignore the stop signals; SIGHUP when the launcher dies (kill -9 too)."""
    for sig in TORCHRUN_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    _prctl(PR_SET_PDEATHSIG, TORCHRUN_DEATH_SIGNAL)


def torchrun_environment(env: dict[str, str]) -> dict[str, str]:
    """torchrun's environment: it registers its terminating handler only for SIGHUP and SIGQUIT.
    (PET_SIGNALS_TO_HANDLE is torchrun's --signals-to-handle, whose default SIGTERM,SIGINT,SIGHUP,SIGQUIT
    it copies into TORCHELASTIC_SIGNALS_TO_HANDLE; the ignored dispositions alone would be overridden.)"""
    return {
        **env,
        "PET_SIGNALS_TO_HANDLE": TORCHRUN_HANDLES,
        "TORCHELASTIC_SIGNALS_TO_HANDLE": TORCHRUN_HANDLES,
    }


class Torchrun:
    """torchrun as a child in its own session; stop requests go to the ranks, not to torchrun itself
    (torchrun answers SIGTERM by signalling the ranks and SIGKILLing them 30 s later, mid-save)."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        attempt: Attempt,
        detector: StallDetector | None = None,
        log: Path | None = None,
    ):
        self.attempt = attempt
        self.log = log  # every line of torchrun's stderr; the terminal gets it without tracebacks
        self.detector = detector  # the stall detector (trainer/launcher/stall.py), polled while we wait
        self.hung: Hung | None = None  # what it saw, once it ended the attempt
        self.lingered: str | None = None  # the line, when torchrun outlived every rank's completion
        self.quiet = False  # after a hang: the dying ranks' output goes to the log only, not the terminal
        self.signals: list[str] = []
        self.stderr_tail: deque[str] = deque(maxlen=400)
        self.record_lines: dict[int, dict[str, Any]] = {}  # rank records a rank could only print (disk full)
        self.proc: subprocess.Popen[str] | None = None
        self.killed_note: str | None = None  # set when torchrun itself was killed (see wait)
        self.stopped_before_ranks: str | None = None  # the signal that ended torchrun before any rank ran
        self.sidecar: Any = None  # simeval.SimEval (eval.sim): halted, and its processes spared, at the end
        self.meeting: Any = None  # rendezvous.Rendezvous: watched until a rank starts (_check_meeting)
        self.met = False  # a rank started on this node (or recorded itself): the rendezvous is over
        self.no_rendezvous: str | None = None  # the line, when one node's rendezvous never completed
        self._meeting_said = False
        self._started = time.monotonic()
        for sig in FORWARDED_SIGNALS:  # before Popen: from here on a signal is a stop request
            signal.signal(sig, self.request_stop)
        self.subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1) == 0  # orphaned ranks come back to us
        self.proc = subprocess.Popen(
            command, env=torchrun_environment(env), stderr=subprocess.PIPE, text=True, errors="replace",
            start_new_session=True, preexec_fn=_torchrun_preexec,
        )  # fmt: skip
        if self.signals and not self.stopped_before_ranks:  # a stop that came while torchrun started:
            self._stop_if_no_rank_started()  # no rank can exist yet (it once said both lines, a race)
        # The pump thread must never take a stop signal: the kernel may deliver a process-directed signal
        # to any thread that does not block it, and then the main thread, blocked in waitpid, would not
        # run the handler until torchrun exits. The thread inherits the mask set around its start.
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
        try:
            self._pump = threading.Thread(target=self._copy_stderr, daemon=True)
            self._pump.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
        if self.signals:  # a stop came before torchrun existed: no rank can have started yet
            self._stop_if_no_rank_started()

    def _copy_stderr(self) -> None:
        # The ranks' stderr comes through torchrun: to the log, to the terminal without tracebacks (the
        # launcher says a failure in one line); keep the end to name a killed rank.
        assert self.proc is not None and self.proc.stderr is not None
        tracebacks = TracebackFilter()
        log = _open_log(self.log)
        for line in self.proc.stderr:
            record = parse_record_line(line)
            if record is not None:  # a rank's record, not for the terminal
                self.record_lines[record["rank"]] = record
                continue
            if log is not None:
                try:
                    log.write(line)
                    log.flush()
                except OSError:  # a full disk: the terminal still gets the line
                    log = None
            if tracebacks.keep(line) and not self.quiet:
                sys.stderr.write(line)
                sys.stderr.flush()
            self.stderr_tail.append(line)
        if log is not None:
            log.close()

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        first = not self.signals
        self.signals.append(name)
        self.attempt.request_stop(f"the launcher received {name}")
        if self.stopped_before_ranks or self._stop_if_no_rank_started():
            return  # said once, in the verdict: no rank started, nothing was trained
        if self.proc is None:  # torchrun is being started: the check right after Popen decides, once
            return
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

    def _stop_if_no_rank_started(self) -> bool:
        """No rank process and no rank record yet (torchrun starting, or waiting in its rendezvous):
        SIGKILL torchrun now rather than when its join timeout ends. True when it did so."""
        if self.proc is None or self.proc.poll() is not None or not self.signals:
            return False
        if self.rank_pids() or any(self.attempt.dir.glob("rank_*.json")):
            return False  # a rank exists (on some node: the rendezvous is over): it saves and stops
        self.stopped_before_ranks = self.signals[0]
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True

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
                if "trainer.loop.train" in " ".join(child.cmdline()):
                    pids.append(child.pid)
            except psutil.Error:
                pass
        return pids

    def _watch(self) -> int:
        """Wait for torchrun; meanwhile poll the stall detector, and end the attempt when it fires."""
        assert self.proc is not None
        while True:
            try:
                watching = self.detector and not self.hung and not self.lingered
                meeting = self.meeting is not None and not self.met and not self._meeting_said
                return self.proc.wait(timeout=POLL_S if watching or meeting else None)
            except subprocess.TimeoutExpired:
                pass
            if self._check_meeting() or self.detector is None:
                continue
            hung = self.detector.check(self.proc.pid)
            if isinstance(hung, str):  # every rank completed; torchrun lingers: end it, the work is done
                self.lingered, self.quiet = hung, True
                say(hung)
                kill_tree(self.proc.pid)
            elif hung is not None:
                self.quiet = True
                say(hung.line)  # when the stall is seen; the stacks (seconds under load) after it
                hung = self.hung = self.detector.with_stacks(hung, self.proc.pid)
                files = ", ".join(hung.stack_files.values()) or "none (no rank process)"
                say(f"stacks of every rank: {files}")
                kill_tree(self.proc.pid)

    def _check_meeting(self) -> bool:
        """Until a rank starts here: past the rendezvous limit, say why in one line (once); on one node end
        torchrun (the verdict: failed, with that line). True when it ended torchrun."""
        from trainer.launcher.rendezvous import overdue, rendezvous_limit

        if self.meeting is None or self.met or self._meeting_said or self.proc is None:
            return False
        if self.rank_pids() or any(self.attempt.dir.glob("rank_*.json")):
            self.met = True
            return False
        waited = time.monotonic() - self._started
        if waited < rendezvous_limit():
            return False
        self._meeting_said = True
        line = overdue(self.meeting, waited)
        if self.meeting.nnodes > 1:  # another node may start late: torchrun's join timeout decides
            say(f"{line}; waiting on (torchrun's join timeout decides)")
            return False
        say(f"{line}; ending the attempt")
        self.no_rendezvous, self.quiet = line, True
        kill_tree(self.proc.pid)
        return True

    def wait(self) -> int:
        assert self.proc is not None
        rc = self._watch()
        if self.sidecar is not None:  # no new evaluator from here on; the running one is not an orphan
            self.sidecar.halt()
        orphans = self._stop_orphans()  # before the pump: an orphan still holds torchrun's stderr pipe
        for sig in FORWARDED_SIGNALS:  # the ranks are gone: what is left is writing the summary
            signal.signal(sig, _too_late)
        self._pump.join(timeout=10)
        ended = self.stopped_before_ranks or self.hung or self.lingered or self.no_rendezvous
        if rc < 0 and not ended:
            how = _signal_name(-rc)
            self.killed_note = (
                f"torchrun (pid {self.proc.pid}) was killed by {how} while its ranks ran"
                + (f"; the launcher stopped its {len(orphans)} orphaned rank(s) (pids "
                   f"{', '.join(map(str, orphans))}) with SIGKILL" if orphans else "")
            )  # fmt: skip
            say(self.killed_note)
        return rc

    def _stop_orphans(self) -> list[int]:
        """SIGKILL and reap what is left of torchrun's process tree (re-parented to us, the subreaper)."""
        try:
            left = psutil.Process().children(recursive=True)
        except psutil.Error:
            return []
        spared = self.sidecar.pids() if self.sidecar is not None else set()
        left = [p for p in left if p.pid not in spared]
        for proc in left:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=30)
        return [p.pid for p in left]


def _open_log(path: Path | None) -> TextIO | None:
    if path is None:
        return None
    try:
        return open(path, "a", encoding="utf-8")
    except OSError:
        return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _too_late(signum: int, frame: FrameType | None) -> None:
    say(f"received {signal.Signals(signum).name} after the ranks exited: finishing the summary")


def requeue_wanted(signals: list[str]) -> bool:
    """The rule: only SIGUSR1 asks for a requeue; SIGTERM (and INT/HUP) leave the decision to Slurm."""
    return bool(signals) and signals[0] in REQUEUE_SIGNALS


def slurm_after_stop(signals: list[str], environ: dict[str, str], no_requeue: bool) -> str:
    """Node 0 under Slurm, after a stop: requeue for SIGUSR1, otherwise say who decides."""
    first = signals[0] if signals else "a stop request"
    if not requeue_wanted(signals):
        return (
            f"not requeued: {first} is Slurm acting (scancel, scontrol requeue, preemption, time limit); "
            "Slurm's own decision stands (a requeue by Slurm resumes from the checkpoint)"
        )
    if no_requeue:
        return f"not requeued: {first} asked for it, but --no-requeue was given"
    return requeue(environ)


def test_pause(point: str) -> None:
    """Test hook (trainer/testhooks.py): park the launcher at `point` when a test asks."""
    testhooks.pause(point, 0)


def requeue(environ: dict[str, str]) -> str:
    """Ask Slurm to requeue this job (it then restarts from the checkpoint just saved)."""
    job = environ["SLURM_JOB_ID"]
    if not shutil.which("scontrol"):
        return "not requeued: scontrol not found"
    out = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    if out.returncode == 0:
        return f"requeued Slurm job {job}"
    if out.returncode < 0:  # a requeue ends the job's processes, scontrol among them: it may not answer
        return (
            f"requeue of Slurm job {job} asked: scontrol was ended by {signal.Signals(-out.returncode).name} "
            "before it answered, as Slurm ends a job's processes when it requeues it (the job's Restarts "
            "count says whether it did)"
        )
    return f"not requeued: scontrol requeue {job} said: {(out.stderr or out.stdout).strip()}"


# --- main ------------------------------------------------------------------------------------------
