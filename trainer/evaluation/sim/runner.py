"""Run episodes on K simulator worker processes: a crash is one episode's error, the others go on.

    pool = Pool(argv, env, workers=2, logs=DIR, episode_timeout=2700.0)
    for record in pool.run([(task, episode), ...]):      # as they finish, in any order
        ...                                              # a worker's record, or {"task", "episode", "error"}
    pool.stop()                                          # Ctrl-C: end the workers (their episodes are lost)

Each worker is `argv` (trainer/evaluation/sim/worker.py in the simulator env) started in a session of its
own (a Ctrl-C on the terminal reaches this process only; it decides), fed one job per stdin line, answering
one JSON line per episode; its stderr goes to DIR/worker-<k>.log. One thread per worker slot takes the next
job from a shared queue, so a slow episode never holds the others. A worker that exits (a crash, a kill)
or answers something that is not a record turns its episode into an error record naming the exit status
and the log; a fresh worker takes the slot's next job. A worker that answers nothing for `episode_timeout`
seconds (a hung simulator or renderer) is ended and its episode is an error saying so. An errored episode is
not retried in the same run (a re-run does: it has no record on disk).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path


def exit_text(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited {code}"


class Pool:
    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        workers: int,
        logs: Path,
        episode_timeout: float | None = None,
    ):
        self.argv, self.env, self.workers, self.logs = argv, env, workers, logs
        self.episode_timeout = episode_timeout
        self.procs: dict[int, subprocess.Popen] = {}
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def _start(self, slot: int) -> subprocess.Popen | None:
        """A worker for `slot`, or None once stop() has begun (under the lock: stop() sees every worker
        started before it, and none starts after)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with self.lock:
            if self.stopping.is_set():
                return None
            with open(self.logs / f"worker-{slot}.log", "a") as log:
                proc = subprocess.Popen(
                    self.argv, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                    text=True, start_new_session=True,
                )  # fmt: skip
            self.procs[slot] = proc
        return proc

    def _slot(self, slot: int, jobs: queue.Queue, out: queue.Queue) -> None:
        proc: subprocess.Popen | None = None
        try:
            while not self.stopping.is_set():
                try:
                    task, episode = jobs.get_nowait()
                except queue.Empty:
                    break
                if proc is None or proc.poll() is not None:
                    proc = self._start(slot)
                    if proc is None:
                        break
                assert proc.stdin is not None and proc.stdout is not None
                hung = threading.Event()
                watchdog = None
                if self.episode_timeout is not None:
                    watchdog = threading.Timer(self.episode_timeout, _hung, (proc, hung))
                    watchdog.daemon = True
                    watchdog.start()
                try:
                    proc.stdin.write(json.dumps({"task": task, "episode": episode}) + "\n")
                    proc.stdin.flush()
                    line = proc.stdout.readline()
                except (BrokenPipeError, OSError):
                    line = ""
                finally:
                    if watchdog is not None:
                        watchdog.cancel()
                if self.stopping.is_set():
                    break
                try:
                    record = json.loads(line) if line else None
                except json.JSONDecodeError:
                    record = None
                if not isinstance(record, dict) or "success" not in record:
                    try:
                        proc.wait(timeout=10)  # it closed its stdout: it is exiting; its status says how
                    except subprocess.TimeoutExpired:
                        _end(proc)
                    log = self.logs / f"worker-{slot}.log"
                    why = exit_text(proc.returncode) if not line else f"answered {line.strip()[:120]!r}"
                    if hung.is_set():
                        why = f"answered nothing within {self.episode_timeout:g} s (hung; ended it)"
                    why += f": {_last_line(log)}" if _last_line(log) else ""
                    record = {
                        "task": task,
                        "episode": episode,
                        "error": f"simulator worker {why} (log {log})",
                    }
                    proc = None
                out.put(record)
        finally:
            if proc is not None:
                _end(proc, close=True)
            out.put(None)  # this slot is done

    def run(self, jobs: list[tuple[int, int]]) -> Iterator[dict]:
        todo: queue.Queue = queue.Queue()
        for job in jobs:
            todo.put(job)
        out: queue.Queue = queue.Queue()
        slots = max(1, min(self.workers, len(jobs)))
        threads = [
            threading.Thread(target=self._slot, args=(k, todo, out), daemon=True) for k in range(slots)
        ]
        for t in threads:
            t.start()
        running = len(threads)
        while running:
            record = out.get()
            if record is None:
                running -= 1
            else:
                yield record

    def stop(self) -> None:
        """End every worker (SIGTERM to its session, SIGKILL after 10 s); their running episodes are lost."""
        with self.lock:
            self.stopping.set()
            procs = list(self.procs.values())
        for proc in procs:
            _end(proc)


def _hung(proc: subprocess.Popen, hung: threading.Event) -> None:
    """The watchdog: the worker has not answered its episode in time; end it (its stdout closes)."""
    hung.set()
    _end(proc)


def _last_line(log: Path) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()
        lines = [x.strip() for x in text if x.strip() and "WARNING" not in x]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def _end(proc: subprocess.Popen, close: bool = False) -> None:
    """Close stdin (a worker between jobs exits on EOF), else signal its session; wait for it."""
    if close and proc.poll() is None and proc.stdin is not None:
        try:
            proc.stdin.close()
            proc.wait(timeout=30)
            return
        except (OSError, subprocess.TimeoutExpired):
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
