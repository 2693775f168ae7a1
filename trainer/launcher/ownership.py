"""One writer per run dir: RUN_DIR/owner.json, taken before bin/train writes anything, held (with a
heartbeat) until the verdict is written, released after.

    owner = take_ownership(run_dir, environ)     # OwnerBusy: another launch holds it (exit EXIT_BUSY)
    ... preflight, torchrun, the verdict ...
    owner.release()

The primitive is link(2), the classic NFS-safe lock file: the record is written to a unique temporary
file beside it and hard-linked to `owner.json`. link is atomic on NFS (v2 to v4) and Lustre, it fails
when the name exists, and where the server's reply is lost the link count of our own temporary file
(2 = the link is ours) says whether it happened. Where a filesystem has no hard links, an
`os.open(O_CREAT | O_EXCL)` of the name is used (exclusive create is atomic from NFSv3 on). flock/fcntl
locks are not relied upon: Lustre honours them only when mounted with `-o flock`, NFS only with a working
lock manager (lockd/NLM for v3), and a lock held by a dead node's client is not reliably released; a
file that exists is a fact every client sees.

A holder that died must not block the next run forever. The record names the holder (host, boot id,
pid and that pid's start time, Slurm job id and restart count, since when); the holder's launcher
refreshes the record's mtime every HEARTBEAT_S seconds (a thread; the mtime on a shared filesystem is
the server's clock, and a reader compares it with the mtime of a file it has just written there, so no
two hosts' clocks are compared). A holder is stale, and is taken over with one line, when:
- it is on this host (same hostname and boot id) and its pid is not running, or is running with another
  start time (a reused pid);
- it is this Slurm job at a higher restart count (a requeue takes over its own run dir at once);
- Slurm says its job is no longer running (`squeue -h -j ID -o %T` answers nothing or a finished state);
- its heartbeat stopped for STALE_S seconds (default 5 x HEARTBEAT_S: a missed beat or two, and NFS's
  attribute cache, up to 60 s, are never mistaken for a dead node).
`LINGBOT_OWNER_HEARTBEAT_S` and `LINGBOT_OWNER_STALE_S` change the two times.

A takeover renames the stale record aside (`owner.json.stale-<token>`; rename is atomic, so of two
launchers taking over at once one moves it), then checks that what it moved is the record it judged
(else it puts it back and re-judges), then takes the name as above. The read-only commands
(`bin/evaluate`, the server, `--plan`, `--sbatch`) never take ownership.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

OWNER_NAME = "owner.json"
HEARTBEAT_S = 30.0
STALE_BEATS = 5
SLURM_RUNNING = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                 "SIGNALING", "STAGE_OUT", "STOPPED"}  # fmt: skip


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_start(pid: int) -> float | None:
    """The pid's start time (psutil, seconds since the epoch), None when no such process."""
    try:
        return round(psutil.Process(pid).create_time(), 2)
    except psutil.Error:
        return None


@dataclass
class OwnerRecord:
    host: str
    pid: int
    boot_id: str
    pid_start: float | None
    since: float  # time.time() when taken
    slurm_job_id: str | None = None
    slurm_restarts: int = 0
    command: str = ""
    token: str = ""

    @classmethod
    def mine(cls, environ: dict[str, str], command: str) -> OwnerRecord:
        pid = os.getpid()
        return cls(
            host=socket.gethostname(), pid=pid, boot_id=boot_id(), pid_start=pid_start(pid),
            since=time.time(),
            slurm_job_id=environ.get("SLURM_JOB_ID") or None,
            slurm_restarts=int(environ.get("SLURM_RESTART_COUNT") or 0),
            command=command, token=uuid.uuid4().hex,
        )  # fmt: skip

    def describe(self) -> str:
        job = f", Slurm job {self.slurm_job_id}" if self.slurm_job_id else ""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"host {self.host}, pid {self.pid}{job}, since {when}"


def _read(path: Path) -> OwnerRecord | None:
    try:
        data = json.loads(path.read_text())
        fields = {f.name for f in dataclasses.fields(OwnerRecord)}
        return OwnerRecord(**{k: v for k, v in data.items() if k in fields})
    except (OSError, ValueError, TypeError):
        return None


def settings(environ: dict[str, str]) -> tuple[float, float]:
    """(heartbeat, stale-after) in seconds, from LINGBOT_OWNER_HEARTBEAT_S / LINGBOT_OWNER_STALE_S."""
    beat = float(environ.get("LINGBOT_OWNER_HEARTBEAT_S") or HEARTBEAT_S)
    return beat, float(environ.get("LINGBOT_OWNER_STALE_S") or STALE_BEATS * beat)


def slurm_job_state(job: str) -> str | None:
    """Slurm's state of a job ("" when Slurm no longer knows it), None when Slurm cannot be asked."""
    if not shutil.which("squeue"):
        return None
    try:
        argv = ["squeue", "-h", "-j", job, "-o", "%T"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:  # "Invalid job id specified": the job is gone from the controller
        return "" if "Invalid job id" in out.stderr else None
    return out.stdout.strip().splitlines()[0].strip() if out.stdout.strip() else ""


@dataclass
class Clues:
    """What a judge of a holder may know (injected in tests: fake clocks, pids, hosts)."""

    host: str
    boot_id: str
    heartbeat_age: float | None  # seconds since the holder's last beat, by the filesystem's clock
    stale_s: float
    slurm_job_id: str | None = None
    slurm_restarts: int = 0
    pid_start: Callable[[int], float | None] = pid_start
    slurm_state: Callable[[str], str | None] = slurm_job_state


def stale_reason(holder: OwnerRecord, clues: Clues) -> str | None:
    """Why `holder` no longer holds the run dir (a line's middle), or None while it may be alive."""
    same_job = holder.slurm_job_id and holder.slurm_job_id == clues.slurm_job_id
    if same_job and clues.slurm_restarts > holder.slurm_restarts:  # Slurm ended the earlier start
        return f"this is its requeue (Slurm job {holder.slurm_job_id}, restart {clues.slurm_restarts})"
    if holder.host == clues.host and holder.boot_id == clues.boot_id:
        started = clues.pid_start(holder.pid)
        if started is None:
            return f"its pid {holder.pid} is not running on this host"
        if holder.pid_start is not None and abs(started - holder.pid_start) > 1.0:
            return f"its pid {holder.pid} is now another process (started at another time)"
        return None  # a live launcher on this host: never taken over
    if holder.host == clues.host and holder.boot_id != clues.boot_id:
        return "this host rebooted since it took the run dir"
    if holder.slurm_job_id:
        state = clues.slurm_state(holder.slurm_job_id)
        if state == "":
            return f"Slurm no longer knows job {holder.slurm_job_id}"
        if state is not None and state.split()[0] not in SLURM_RUNNING:
            return f"Slurm says job {holder.slurm_job_id} is {state}"
    if clues.heartbeat_age is not None and clues.heartbeat_age > clues.stale_s:
        return f"its heartbeat stopped {clues.heartbeat_age:.0f} s ago (limit {clues.stale_s:.0f} s)"
    return None


def holder_gone(path: Path, environ: dict[str, str] | None = None) -> str | None:
    """Why the holder recorded in the file `path` is gone (a line's middle), or None while it may be alive:
    a lock file of another kind that names its holder as owner.json does (an OwnerRecord: the simulator
    evaluation's pins, trainer/checkpoint/simrecords.py), judged by stale_reason; its heartbeat is the
    file's mtime (its holder touches it). A bare pid (an older pin) is a process of this host. A file that
    is not a record is never judged gone."""
    environ = dict(os.environ) if environ is None else environ
    try:
        text, mtime = path.read_text(), path.stat().st_mtime
    except FileNotFoundError:
        return "it was released"
    holder = _read(path)
    if holder is None and text.strip().isdigit():
        holder = OwnerRecord(socket.gethostname(), int(text.strip()), boot_id(), None, mtime)
    if holder is None:
        return None
    here = holder.host == socket.gethostname()
    age = None if here else _fs_now(path.parent) - mtime  # another host's: its heartbeat, by the fs clock
    slurm_job, restarts = environ.get("SLURM_JOB_ID") or None, int(environ.get("SLURM_RESTART_COUNT") or 0)
    return stale_reason(holder, Clues(socket.gethostname(), boot_id(), age, settings(environ)[1], slurm_job,
                                      restarts))  # fmt: skip


class OwnerBusy(Exception):
    """Another live launch holds the run dir; str() is the one line to say."""


def _link_create(path: Path, text: str) -> bool:
    """Create `path` holding `text` atomically, False when it exists (link(2), else O_EXCL)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    tmp.write_text(text)
    try:
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                return _excl_create(path, text)
            if os.stat(tmp).st_nlink == 2:  # NFS: the reply was lost but the link was made
                return True
            raise
    finally:
        tmp.unlink(missing_ok=True)


def _excl_create(path: Path, text: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return True


def _fs_now(directory: Path) -> float:
    """The filesystem's clock: the mtime of a file written there now."""
    probe = directory / f".owner-clock.{uuid.uuid4().hex[:12]}"
    probe.write_text("")
    try:
        return probe.stat().st_mtime
    finally:
        probe.unlink(missing_ok=True)


class Ownership:
    """The run dir held by this launcher: a heartbeat thread, and release()."""

    def __init__(self, path: Path, record: OwnerRecord, heartbeat_s: float):
        self.path, self.record, self.heartbeat_s = path, record, heartbeat_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="owner-heartbeat", daemon=True)
        # never the thread a stop signal lands on (supervise.py: the main thread must get it at once)
        stops = {signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP}
        before = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        try:
            self._thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)

    def _beat(self) -> None:
        while not self._done.wait(self.heartbeat_s):
            try:
                os.utime(self.path)  # mtime := now, by the server's clock on NFS
            except OSError:
                pass

    def still_mine(self) -> bool:
        held = _read(self.path)
        return held is not None and held.token == self.record.token

    def release(self) -> None:
        self._done.set()
        if self.still_mine():
            self.path.unlink(missing_ok=True)


def take_ownership(
    run_dir: Path, environ: dict[str, str], command: str = "", clues: Clues | None = None
) -> tuple[Ownership, str | None]:
    """Hold run_dir (made if missing) for this launcher: (the ownership, a takeover line or None).
    Raises OwnerBusy with the one line to say when a live launch holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / OWNER_NAME
    beat, stale_s = settings(environ)
    mine = OwnerRecord.mine(environ, command)
    text = json.dumps(dataclasses.asdict(mine), indent=1) + "\n"
    said = None
    for _ in range(5):  # each round: take the name, or judge its holder (a race re-judges)
        if _link_create(path, text):
            return Ownership(path, mine, beat), said
        holder = _read(path)
        try:
            age = _fs_now(run_dir) - path.stat().st_mtime
        except FileNotFoundError:
            continue  # released (or moved aside) meanwhile: try to take it again
        if holder is None:  # link makes the name appear whole; O_EXCL's creator may still be writing
            if age > 5.0:
                raise OwnerBusy(f"{path} exists but is not an owner record; remove it if no bin/train "
                                "uses this run dir")  # fmt: skip
            continue
        judge = Clues(socket.gethostname(), boot_id(), age, stale_s, mine.slurm_job_id, mine.slurm_restarts)
        if clues is not None:  # tests: fake hosts, pids, Slurm and heartbeat ages
            given = clues.heartbeat_age
            judge = clues if given is not None else dataclasses.replace(clues, heartbeat_age=age)
        reason = stale_reason(holder, judge)
        if reason is None:
            raise OwnerBusy(
                f"run dir {run_dir} is in use by another bin/train ({holder.describe()}); wait for it to "
                f"end, stop it, or pass another --run-dir (a holder that died is taken over: same host at "
                f"once, another host after {stale_s:.0f} s without a heartbeat)"
            )
        aside = path.with_name(f"{OWNER_NAME}.stale-{mine.token[:12]}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            continue  # another launcher moved it first
        moved = _read(aside)
        if moved is None or moved.token != holder.token:  # a fresh record replaced the judged one
            try:
                os.link(aside, path)
            except FileExistsError:
                pass
            aside.unlink(missing_ok=True)
            continue
        aside.unlink(missing_ok=True)
        said = f"run dir {run_dir}: taking it over from {holder.describe()}: {reason}"
    raise OwnerBusy(f"run dir {run_dir}: could not take it after 5 tries (other launchers race for it)")


def claim_run_dir(run_dir: Path, node_rank: int | None, environ: dict[str, str], known: Any) -> int | None:
    """bin/train, before it writes anything: node 0 takes the run dir (known.owner, released by main after
    the verdict is written). The exit code when it cannot (nothing written; one line said), else None."""
    from trainer.attempt import EXIT_BUSY, EXIT_PREFLIGHT, PREFLIGHT_FAILED
    from trainer.launcher.console import say

    node = node_rank if node_rank is not None else int(environ.get("SLURM_NODEID") or 0)
    if node != 0:  # node 0 holds it for the whole job; the other nodes write no summary
        return None
    try:
        known.owner, takeover = take_ownership(run_dir, environ, shlex.join(["bin/train", *sys.argv[1:]]))
    except OwnerBusy as exc:
        say(f"refused: {exc} (exit {EXIT_BUSY})")
        known.report, known.run_dir = {"error": str(exc), "busy": True}, None
        return EXIT_BUSY
    except OSError as exc:
        say(
            f"preflight failed: run dir {run_dir} is not writable ({exc}); pass a writable --run-dir; "
            "the next run fails the same way until the run dir is usable"
        )
        known.report, known.run_dir = {"status": PREFLIGHT_FAILED, "error": str(exc)}, None
        return EXIT_PREFLIGHT
    if takeover:
        say(takeover)
    return None
