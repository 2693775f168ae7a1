"""RUN_DIR/summary.json: the honest outcome of the last run, written atomically.

One schema for every outcome (completed / preempted / failed / preflight_failed). Rank 0 writes it when
training ends; the launcher rewrites it after torchrun exits, adding what only it knows (the exit code it
returns, torchrun's own exit status, which rank failed). Written to a temporary file in the same
directory, fsynced and renamed, so a reader sees the old summary or the new one, never half of one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from provision.atomic import write_json_atomic

SUMMARY_NAME = "summary.json"

COMPLETED = "completed"
PREEMPTED = "preempted"
FAILED = "failed"
PREFLIGHT_FAILED = "preflight_failed"
STATUSES = (COMPLETED, PREEMPTED, FAILED, PREFLIGHT_FAILED)

# The launcher's exit codes (documented in the README and in `bin/train --help`).
EXIT_OK = 0  # the requested steps are done (also: a re-run of a finished run)
EXIT_FAILED = 1  # training failed on some rank; the summary names the rank and its error
EXIT_USAGE = 2  # bad command line or config (unknown config, bad --set); nothing written
EXIT_PREFLIGHT = 3  # env missing/incomplete, a preflight check failed, run dir not writable
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by SIGTERM/SIGUSR1 after saving a checkpoint; resume me
EXIT_CODES = {
    COMPLETED: EXIT_OK,
    FAILED: EXIT_FAILED,
    PREFLIGHT_FAILED: EXIT_PREFLIGHT,
    PREEMPTED: EXIT_PREEMPTED,
}


def summary_path(run_dir: Path) -> Path:
    return Path(run_dir) / SUMMARY_NAME


def atomic_write_json(path: Path, data: dict) -> None:
    """Write `data` as JSON to `path` so that readers never see a partial file."""
    write_json_atomic(path, data)


def read_summary(run_dir: Path) -> dict | None:
    """The current summary, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads(summary_path(run_dir).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def make_summary(
    status: str,
    *,
    steps_requested: int,
    reason: str | None = None,
    exit_code: int | None = None,
    **fields,
) -> dict:
    """A summary dict with every schema key present (None where unknown), plus any extra fields.

    Keys: status, exit_code, reason, steps_requested, first_step, last_step (run in this attempt),
    resumed_from, last_complete_checkpoint {step, path}, final_losses {loss, latent_loss, action_loss},
    wall_time_s, timing (per-phase summary from trainer.timing), failed_rank, rank_error, written_at.
    """
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}; expected one of {STATUSES}")
    summary = {
        "status": status,
        "exit_code": EXIT_CODES[status] if exit_code is None else exit_code,
        "reason": reason,
        "steps_requested": steps_requested,
        "first_step": None,
        "last_step": None,
        "resumed_from": None,
        "last_complete_checkpoint": None,
        "final_losses": None,
        "wall_time_s": None,
        "timing": None,
        "failed_rank": None,
        "rank_error": None,
    }
    summary.update(fields)
    summary["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return summary


def write_summary(run_dir: Path, summary: dict) -> Path:
    path = summary_path(run_dir)
    atomic_write_json(path, summary)
    return path
