"""The outcome of an attempt, decided from what the ranks recorded, not from torchrun's exit status alone.

A rank that aborts in teardown after recording completion does not fail the run; a zero exit status with
a rank that never recorded completion does not pass it. A failure names the rank that caused it: a real
error beats a rank that vanished, which beats a communication error (what survivors see when a peer dies).

Node 0 also needs rank 0's summary of this attempt (the outcome is on disk). Another node judges by the
rank records alone: every rank records its end before the last barrier, so they are final once its own
ranks exit, while rank 0 may still be writing the summary (node 0 judges that; trainer/launcher/nodes.py).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.attempt import (
    COMPLETED,
    FAILED,
    NEVER_STARTED,
    PREEMPTED,
    RUNNING,
    Attempt,
    RankStatus,
    Summary,
    read_json,
    read_summary,
)
from trainer.outcomes import Diverged

_COMM_ERROR = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|Socket Timeout|timed out|DistNetworkError|"
    r"DistBackendError|NCCL communicator was aborted|ProcessGroup.*(abort|shut)|recvBytes|sendBytes|"
    r"Application timeout caused pair closure|TCPStore",
    re.IGNORECASE,
)
_SIGNAL_LINE = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID (\d+)")
_EXIT_LINE = re.compile(r"exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")


@dataclass
class Verdict:
    status: str
    reason: str | None = None
    failed_rank: int | None = None
    rank_error: str | None = None
    notes: list[str] = field(default_factory=list)
    out_of_space: dict[str, Any] | None = None  # checkpoint/diskspace.py SpaceReport: reason = its line
    needs_fix: str | None = None  # the failing rank's RankStatus.needs_fix: a rerun fails the same way
    diverged: dict[str, Any] | None = None  # trainer.attempt.Diverged: reason is its one line
    hung: dict[str, Any] | None = None  # trainer.attempt.Hung: the stall detector ended the attempt


def torchrun_error_files(attempt_dir: Path, nproc: int) -> dict[int, dict[str, Any]]:
    """Per global rank: the error file torchrun's @record wrote for an uncaught exception."""
    found = {}
    for path in attempt_dir.glob("node*/*/attempt_*/*/error.json"):
        node = int(path.parts[-5][4:]) if path.parts[-5][4:].isdigit() else 0
        data = read_json(path)
        if data and path.parent.name.isdigit():
            message = data.get("message")
            if isinstance(message, dict):
                text = message.get("message", "")
                stamp = (message.get("extraInfo") or {}).get("timestamp")
            else:
                text, stamp = str(message), None
            found[node * nproc + int(path.parent.name)] = {"error": text, "time": float(stamp or 0) or None}
    return found


def _killed_by(stderr_tail: list[str], pid: int | None) -> str | None:
    if pid is None:
        return None
    text = "".join(stderr_tail)
    for _number, name, killed in _SIGNAL_LINE.findall(text):
        if int(killed) == pid:
            return f"killed by {name}"
    for code, exited in _EXIT_LINE.findall(text):
        if int(exited) == pid and int(code) < 0:
            try:
                return f"killed by {signal.Signals(-int(code)).name}"
            except ValueError:
                return f"killed by signal {-int(code)}"
    return None


def verdict(
    world_size: int,
    nproc: int,
    attempt: Attempt,
    run_dir: Path,
    rc: int,
    stderr_tail: list[str],
    record_lines: dict[int, dict[str, Any]] | None = None,
    node_rank: int = 0,
) -> Verdict:
    """`record_lines`: rank records that ranks printed on stderr because the file could not be written."""
    records = {r: attempt.read_rank(r, record_lines) for r in range(world_size)}
    states = {r: rec.status if rec else NEVER_STARTED for r, rec in records.items()}
    if node_rank == 0:
        rank_summary = read_summary(run_dir)
        if rank_summary is not None and rank_summary.attempt != attempt.id:
            rank_summary = None
    else:
        rank_summary = _from_records(records, states)
    finished = rank_summary.status if rank_summary else None
    teardown = (
        [f"torchrun exited {rc} after every rank recorded its result (a teardown hiccup, e.g. SIGABRT "
         f"after destroy_process_group): ignored"] if rc != 0 else []
    )  # fmt: skip
    if finished == COMPLETED and all(s == COMPLETED for s in states.values()):
        return Verdict(COMPLETED, notes=teardown)
    if (
        rank_summary is not None
        and finished == PREEMPTED
        and all(s in (COMPLETED, PREEMPTED) for s in states.values())
    ):
        return Verdict(PREEMPTED, reason=rank_summary.reason, notes=teardown)
    return _failure(records, states, torchrun_error_files(attempt.dir, nproc), rc, stderr_tail)


def _from_records(records: dict[int, RankStatus | None], states: dict[int, str]) -> Summary | None:
    """What a node other than 0 takes for rank 0's summary: the end every rank recorded, if all did."""
    if not all(s in (COMPLETED, PREEMPTED) for s in states.values()):
        return None
    if all(s == COMPLETED for s in states.values()):
        return Summary(COMPLETED, steps_requested=0)
    step = max((rec.step or 0) for rec in records.values() if rec is not None)
    return Summary(PREEMPTED, steps_requested=0, reason=f"every rank stopped at step {step}")


def _failure(
    records: dict[int, RankStatus | None],
    states: dict[int, str],
    errors: dict[int, dict[str, Any]],
    rc: int,
    stderr_tail: list[str],
) -> Verdict:
    """Failed: name the rank that caused it; a rank out of space or quota comes first, then a diverged
    run (each said in one line)."""
    for r, rec in sorted(records.items()):
        if rec and rec.out_of_space:
            return Verdict(FAILED, reason=rec.error, failed_rank=r, out_of_space=rec.out_of_space)
    for _, rec in sorted(records.items()):
        found = Diverged.from_json(rec.diverged) if rec else None
        if (
            rec is not None and found is not None
        ):  # every rank stopped on the same non-finite step (trainer/loop/divergence.py)
            return Verdict(FAILED, reason=found.line(), failed_rank=found.rank, diverged=rec.diverged)
    for r, rec in records.items():
        if rec and rec.status == FAILED:
            errors[r] = {"error": rec.error or "", "time": rec.time}
    real = sorted((e["time"] or 0, r) for r, e in errors.items() if not _COMM_ERROR.search(e["error"]))
    vanished = [r for r, s in states.items() if s in (RUNNING, NEVER_STARTED) and r not in errors]
    comm = sorted((e["time"] or 0, r) for r, e in errors.items() if _COMM_ERROR.search(e["error"]))
    if real:
        rank = real[0][1]
        error = errors[rank]["error"]
    elif vanished and any(states[r] == RUNNING for r in vanished):
        rank = next(r for r in vanished if states[r] == RUNNING)
        record = records[rank]
        pid, host = (record.pid, record.host) if record else (None, None)
        how = _killed_by(stderr_tail, pid) or "killed by a signal or crashed in native code"
        error = f"rank {rank} (pid {pid} on {host}) died without reporting an error: {how}"
    elif comm:
        rank = comm[0][1]
        error = errors[rank]["error"]
    elif all(s == NEVER_STARTED for s in states.values()):
        return Verdict(FAILED, reason=f"torchrun exited {rc} before any rank started (its output is above)")
    else:
        unfinished = ", ".join(f"rank {r}: {s}" for r, s in states.items() if s != COMPLETED)
        return Verdict(FAILED, reason=f"torchrun exited {rc} but not every rank finished ({unfinished})")
    others = [f"rank {r}: {s}" for r, s in states.items() if r != rank]
    record = records.get(rank)
    return Verdict(
        FAILED,
        reason=f"rank {rank} failed: {error.splitlines()[0] if error else '?'}",
        failed_rank=rank,
        rank_error=error,
        notes=[f"other ranks: {', '.join(others)}"] if others else [],
        needs_fix=record.needs_fix if record is not None and record.status == FAILED else None,
    )
