"""The launcher <-> rank protocol: RUN_DIR/attempts/<id>/ and RUN_DIR/summary.json, with typed records.

This module is the one owner of those files; the launcher (trainer/launcher/) and the ranks
(trainer/loop/train.py) both read and write them only through it. Every write is atomic (provision.atomic).

    RUN_DIR/attempts/<id>/
        config.json       the resolved, checked RunConfig, written by the launcher before any rank starts;
                          the ranks load it and nothing else (no YAML is parsed on a rank)
        rank_<R>.json     RankStatus: running -> completed | preempted | failed (with the error)
        progress.json     Progress, rank 0, every step: first/last step, last losses, last checkpoint;
                          and at each phase (first step, step, save, evaluation) with its expected length
        stop              the stop request (exists = every rank stops at its next safe point)
        node<N>/          torchrun's per-node log dir (error files of failed ranks)
        node<N>.log       the launcher's copy of node N's torchrun stderr (the terminal gets it without
                          tracebacks); rank_<R>.log: the traceback of rank R's failure
        hung.node<N>.json Hung, the launcher of node N when its stall detector fired (stacks/ beside it)
    RUN_DIR/summary.json  Summary: the honest outcome of the last run (one builder: Summary(...))
    RUN_DIR/hangs.json    every hang of the run (step, attempt): a second hang at the same step fails
                          for good instead of being requeued (it survives the requeue)

Statuses and the launcher's exit codes live here too (documented in the README and `bin/train --help`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision.atomic import write_atomic, write_json_atomic
from trainer.config import RunConfig, config_from_dict
from trainer.outcomes import Hung, known_fields

SUMMARY_NAME = "summary.json"
ATTEMPTS_DIR = "attempts"
CONFIG_NAME = "config.json"
PROGRESS_NAME = "progress.json"
STOP_NAME = "stop"
HANGS_NAME = "hangs.json"
# A rank whose record cannot be written (a full disk) prints it on stderr behind this prefix instead;
# the launcher takes such lines out of the stream it shows and reads them as records.
RECORD_LINE_PREFIX = "[lingbot-record] "

RUNNING = "running"
COMPLETED = "completed"
PREEMPTED = "preempted"
FAILED = "failed"
PREFLIGHT_FAILED = "preflight_failed"
STATUSES = (RUNNING, COMPLETED, PREEMPTED, FAILED, PREFLIGHT_FAILED)
NEVER_STARTED = "never started"  # a rank with no record (only ever a reader's word, never written)

EXIT_OK = 0  # the requested steps are done (also: a re-run of a finished run)
EXIT_FAILED = 1  # training failed on some rank; the summary names the rank and its error
EXIT_USAGE = 2  # bad command line or config (unknown config, bad --set); nothing written
EXIT_PREFLIGHT = 3  # env missing/incomplete, a preflight check failed, run dir not writable
EXIT_BUSY = 73  # EX_CANTCREAT: another live bin/train holds the run dir (launcher/ownership.py)
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by SIGTERM/SIGUSR1 after saving a checkpoint; resume me
EXIT_CODES: dict[str, int | None] = {
    RUNNING: None,  # an attempt in progress has no exit code yet
    COMPLETED: EXIT_OK,
    FAILED: EXIT_FAILED,
    PREFLIGHT_FAILED: EXIT_PREFLIGHT,
    PREEMPTED: EXIT_PREEMPTED,
}


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from `path`, or None when it is missing, unreadable or not an object (the one reader
    of the protocol's files, and of torchrun's error files and the nodes' outcome files)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class CheckpointRef:
    step: int
    path: str

    @classmethod
    def of(cls, info: Any) -> CheckpointRef | None:
        """From a trainer.checkpoint.checkpointer.CheckpointInfo (or None)."""
        return cls(info.step, str(info.path)) if info is not None else None


def checkpoint_json(info: Any) -> dict[str, Any] | None:
    """A checkpoint/layout.py CheckpointInfo (or None) as summary.json and progress.json hold it."""
    ref = CheckpointRef.of(info)
    return dataclasses.asdict(ref) if ref is not None else None


def parse_record_line(line: str) -> dict[str, Any] | None:
    """A rank record printed on stderr (RECORD_LINE_PREFIX + JSON), or None for any other line."""
    if not line.startswith(RECORD_LINE_PREFIX):
        return None
    try:
        data = json.loads(line[len(RECORD_LINE_PREFIX) :])
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("rank"), int) else None


@dataclass
class RankStatus:
    """rank_<R>.json: how far one rank got, for the launcher's verdict."""

    rank: int
    status: str
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)
    time: float = field(default_factory=time.time)
    step: int | None = None
    error: str | None = None
    traceback: str | None = None
    # what must change before a rerun can pass (bad data, weights, config: it would fail the same way);
    # None: the failure may not repeat (a crash, a lost peer), the next run resumes
    needs_fix: str | None = None
    out_of_space: dict[str, Any] | None = (
        None  # checkpoint/diskspace.py SpaceReport: a write ran out of space
    )
    diverged: dict[str, Any] | None = None  # Diverged: the run stopped on non-finite values


# The phases rank 0 reports in progress.json (the stall detector's limit follows them; no file: start-up)
FIRST_STEP = "first step"  # the attempt's first step: it compiles
STEP = "step"
SAVE = "save"
EVALUATION = "evaluation"
PHASES = (FIRST_STEP, STEP, SAVE, EVALUATION)


@dataclass
class Progress:
    """progress.json: rank 0's view after every step (what a launcher reports if rank 0 dies), and the
    phase it is in: FIRST_STEP before the attempt's first step, STEP after each step, SAVE and EVALUATION
    around those, with `expect_s` the rank's own prediction of the phase's length (None: nothing measured
    yet) and `phase_time` its time.time() at the phase's start."""

    first_step: int | None = None
    last_step: int | None = None
    final_losses: dict[str, float] | None = None
    resumed_from: int | None = None
    last_complete_checkpoint: dict[str, Any] | None = None
    phase: str | None = None
    phase_time: float | None = None
    expect_s: float | None = None


@dataclass
class Summary:
    """RUN_DIR/summary.json, one schema for every outcome; every key is always present (None if unknown)."""

    status: str
    steps_requested: int
    exit_code: int | None = None  # None: the status's own exit code (EXIT_CODES)
    reason: str | None = None
    attempt: str | None = None
    config: str | None = None
    first_step: int | None = None  # first and last step run in this attempt
    last_step: int | None = None
    resumed_from: int | None = None
    last_complete_checkpoint: dict[str, Any] | None = None  # {step, path}
    final_losses: dict[str, float] | None = None  # {loss, latent_loss, action_loss}
    wall_time_s: float | None = None
    timing: dict[str, Any] | None = None  # per-phase summary from trainer.loop.timing
    failed_rank: int | None = None
    rank_error: str | None = None
    world_size: int | None = None
    nnodes: int | None = None
    torchrun_exit_code: int | None = None
    notes: list[str] | None = None
    env: dict[str, Any] | None = None  # {prefix, provisioned}
    data: dict[str, Any] | None = None  # DatasetSummary: episodes found/used/skipped, stand-ins, cameras
    validation: dict[str, Any] | None = None  # the last held-out losses (trainer/loop/validate.py Validation)
    best_checkpoint: dict[str, Any] | None = None  # {step, path, pointer, metric, value} (checkpoint.best_by)
    out_of_space: dict[str, Any] | None = None  # checkpoint/diskspace.py SpaceReport of a failed write
    damaged_checkpoints: list[dict[str, Any]] | None = None  # moved aside: {step, path, moved_to, problem}
    diverged: dict[str, Any] | None = None  # Diverged: stopped on non-finite values (status failed)
    nonfinite_skipped: list[int] | None = None  # steps whose update was skipped (train.nonfinite=skip)
    grad_norm_max: dict[str, Any] | None = None  # {value, step}: the largest grad_norm seen in this attempt
    hung: dict[str, Any] | None = None  # Hung, when the launcher's stall detector ended the attempt
    sim: dict[str, Any] | None = None  # eval.sim: the simulator evaluations (trainer/launcher/simresults.py)
    previous_status: str | None = None
    previous: dict[str, Any] | None = None  # a preflight failure keeps the last real run's outcome here
    written_at: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {STATUSES}")
        if self.exit_code is None:
            self.exit_code = EXIT_CODES[self.status]

    def to_json(self, stamp: bool = True) -> dict[str, Any]:
        """As written to summary.json; `stamp` sets written_at to now (False: as read)."""
        data = dataclasses.asdict(self)
        if stamp:
            data["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary | None:
        try:
            return cls(**known_fields(cls, data))
        except (TypeError, ValueError):
            return None


def summary_path(run_dir: Path) -> Path:
    return Path(run_dir) / SUMMARY_NAME


def read_summary(run_dir: Path) -> Summary | None:
    """The current summary, or None when there is none (or it is unreadable)."""
    data = read_json(summary_path(run_dir))
    return Summary.from_json(data) if data is not None else None


def write_summary(run_dir: Path, summary: Summary) -> Path:
    path = summary_path(run_dir)
    write_json_atomic(path, summary.to_json())
    return path


class Attempt:
    """One attempt's directory, RUN_DIR/attempts/<id>/ (the id is the directory's name)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)

    @classmethod
    def of_run(cls, run_dir: Path, attempt_id: str) -> Attempt:
        return cls(Path(run_dir) / ATTEMPTS_DIR / attempt_id)

    @property
    def id(self) -> str:
        return self.dir.name

    @property
    def stop_file(self) -> Path:
        return self.dir / STOP_NAME

    def node_log_dir(self, node_rank: int) -> Path:
        return self.dir / f"node{node_rank}"

    def output_log(self, node_rank: int) -> Path:
        """node<N>.log: every line of that node's torchrun stderr (the ranks' too, tracebacks included)."""
        return self.dir / f"node{node_rank}.log"

    def used(self) -> bool:
        """True when another launch already left files here (reusing them would forge the verdict).
        config.json (with the temporary file its atomic write leaves for a moment, `.config.json.*.tmp`)
        and the node<N>/ log dirs do not count: every node of this attempt writes them, and with several
        nodes another one may get there first (a test_slurm two-node job once found node 1's temporary
        config file and refused to start node 0)."""
        if not self.dir.exists():
            return False
        return any(not _written_by_every_node(p.name) for p in self.dir.iterdir())

    # the config: written once by the launcher, read by every rank
    def write_config(self, cfg: RunConfig) -> Path:
        path = self.dir / CONFIG_NAME
        write_json_atomic(path, cfg.to_dict())
        return path

    def read_config(self) -> RunConfig:
        path = self.dir / CONFIG_NAME
        return config_from_dict(json.loads(path.read_text()), source=str(path))

    # rank records
    def rank_path(self, rank: int) -> Path:
        return self.dir / f"rank_{rank}.json"

    def write_rank(self, record: RankStatus) -> bool:
        """Write rank_<R>.json; when that fails (a full disk), print it as a record line on stderr.
        Returns whether the file was written."""
        record.time = time.time()
        data = dataclasses.asdict(record)
        try:
            write_json_atomic(self.rank_path(record.rank), data)
            return True
        except OSError:
            sys.stderr.write(RECORD_LINE_PREFIX + json.dumps(data) + "\n")
            sys.stderr.flush()
            return False

    def read_rank(self, rank: int, fallback: dict[int, dict[str, Any]] | None = None) -> RankStatus | None:
        """The rank's record; a record line from its stderr (`fallback`, by rank) when newer or alone."""
        data = read_json(self.rank_path(rank))
        line = (fallback or {}).get(rank)
        if line is not None and (
            data is None or float(line.get("time") or 0) >= float(data.get("time") or 0)
        ):
            data = line
        if data is None:
            return None
        try:
            return RankStatus(**known_fields(RankStatus, data))
        except TypeError:
            return None

    # progress
    def write_progress(self, progress: Progress) -> None:
        write_json_atomic(self.dir / PROGRESS_NAME, dataclasses.asdict(progress))

    def read_progress(self) -> Progress:
        data = read_json(self.dir / PROGRESS_NAME) or {}
        return Progress(**known_fields(Progress, data))

    # the stall detector's record
    def hung_path(self, node: int) -> Path:
        return self.dir / f"hung.node{node}.json"

    def write_hung(self, record: Hung) -> None:
        write_json_atomic(self.hung_path(record.node), dataclasses.asdict(record))

    def read_hung(self, node: int) -> Hung | None:
        data = read_json(self.hung_path(node))
        try:
            return Hung(**known_fields(Hung, data)) if data is not None else None
        except TypeError:
            return None

    # the stop request
    def request_stop(self, why: str = "") -> None:
        """`why`: what the ranks' records say stopped them (the launcher forwards every stop as SIGUSR1)."""
        write_atomic(self.stop_file, why)

    def stop_requested(self) -> bool:
        return self.stop_file.exists()

    def stop_reason(self) -> str | None:
        try:
            return self.stop_file.read_text().strip() or None
        except OSError:
            return None


def read_hangs(run_dir: Path) -> list[dict[str, Any]]:
    """RUN_DIR/hangs.json: every hang of this run, oldest first ({attempt, step, time})."""
    data = read_json(Path(run_dir) / HANGS_NAME) or {}
    hangs = data.get("hangs")
    return [h for h in hangs if isinstance(h, dict)] if isinstance(hangs, list) else []


def record_hang(run_dir: Path, attempt_id: str, step: int | None) -> list[dict[str, Any]]:
    """Add this hang to RUN_DIR/hangs.json; returns the hangs recorded before it."""
    before = read_hangs(run_dir)
    entry = {"attempt": attempt_id, "step": step, "time": time.time()}
    write_json_atomic(Path(run_dir) / HANGS_NAME, {"hangs": [*before, entry]})
    return before


def _written_by_every_node(name: str) -> bool:
    in_flight = name.startswith(f".{CONFIG_NAME}.") and name.endswith(".tmp")  # provision.atomic's temp file
    return name == CONFIG_NAME or in_flight or name.startswith("node")


def prune_attempts(run_dir: Path, keep: int) -> None:
    """Keep the `keep` most recently touched attempt directories."""
    import shutil

    root = Path(run_dir) / ATTEMPTS_DIR
    if not root.is_dir():
        return
    attempts = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for old in attempts[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
