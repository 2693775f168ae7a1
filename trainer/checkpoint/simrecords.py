"""Simulator evaluations of a run's checkpoints, as retention and the best checkpoint see them.

    pin(root, step); unpin(root, step)     # the launcher, around one checkpoint's evaluation
    beat(root, step)                        # the launcher, while it runs: the pin's heartbeat (mtime)
    pinned_steps(root)                      # {steps}: retention (checkpoint.keep) leaves them alone
    with removal(root, step) as free:       # rank 0's pruning, around each removal: free = not pinned now
    being_removed(root, step)               # the launcher, after pinning: a removal is deciding on it
    read_records(root)                      # {step: record}: RUN_DIR/evaluation/sim.json
    write_record(root, record)              # the launcher, after each evaluation (atomic)
    success_rates(root)                     # {step: rate} of the finished evaluations

`root` is RUN_DIR/checkpoints. Both files live outside it (pruning removes any unknown folder there):

    RUN_DIR/evaluation/sim-pins/checkpoint_step_N   exists while the launcher's evaluator reads that
                                                     checkpoint; names the launcher (its holder record)
    RUN_DIR/evaluation/sim.json                      {"evaluations": {"<step>": record}}, one writer (the
                                                     launcher, trainer/launcher/simeval.py)

A record: {step, status, success_rate, episodes, successes, results, seconds, started, finished, reason,
settings (the eval.sim_* values it ran with: simeval.py evaluator_settings)};
status is `done` (results.json complete, every asked episode ran), `failed` (the evaluator exited
non-zero), `abandoned` (stopped by a stop signal, the end-of-run bound, or its checkpoint vanished), or
`skipped` (its checkpoint was pruned by checkpoint.keep before its turn). Only `done` records carry a
success_rate that counts (metrics, best_by sim). Rank 0 reads this file when it prunes (best.py BestPin),
so a finished evaluation's checkpoint is judged by its record, not by its pin.

Pin and prune never race (issue 56): rank 0 reads the pins before the records (best.py BestPin; the
launcher writes a record before it unpins, so a checkpoint just scored is seen pinned or scored), and
removes each checkpoint inside `removal`: it marks the removal (RUN_DIR/checkpoints/.removing-
checkpoint_step_N, its holder record), then reads the pins again, and removes only what is not pinned now.
The launcher pins first, then looks for that mark (`being_removed`): when it is there it waits for the next
poll (the checkpoint is then kept, or gone: skipped). Of the two, each writes before it reads, so at least
one sees the other: an evaluator never starts on a checkpoint being removed, and a pin is never missed.

A pin (or a removal mark) whose holder is gone is released by whoever reads it (trainer/launcher/
ownership.py holder_gone, as owner.json's holder is judged: on this host its pid, else Slurm or the
heartbeat): a launcher that was SIGKILLed, then a resume with eval.sim=none, no longer keeps that
checkpoint from pruning forever.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from provision.atomic import write_json_atomic

RECORDS = "sim.json"
PINS = "sim-pins"
DONE, FAILED, ABANDONED, SKIPPED = "done", "failed", "abandoned", "skipped"


def evaluation_dir(root: Path) -> Path:
    return Path(root).parent / "evaluation"


def pin_path(root: Path, step: int) -> Path:
    return evaluation_dir(root) / PINS / f"checkpoint_step_{step}"


def _holder() -> dict[str, Any]:
    """This process as a pin's holder (ownership.py's record: host, boot id, pid, its start, Slurm job)."""
    import dataclasses

    from trainer.launcher.ownership import OwnerRecord

    return dataclasses.asdict(OwnerRecord.mine(dict(os.environ), "simulator evaluation"))


def pin(root: Path, step: int) -> None:
    path = pin_path(root, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, _holder())


def beat(root: Path, step: int) -> None:
    try:
        os.utime(pin_path(root, step))
    except OSError:
        pass


def unpin(root: Path, step: int) -> None:
    pin_path(root, step).unlink(missing_ok=True)


def pinned_steps(root: Path) -> set[int]:
    """The pinned steps whose holder may be alive; a pin whose holder is gone is released here."""
    from trainer.launcher.ownership import holder_gone

    folder = evaluation_dir(root) / PINS
    steps = set()
    for entry in folder.iterdir() if folder.is_dir() else ():
        number = entry.name.removeprefix("checkpoint_step_")
        if number.isdigit():
            if holder_gone(entry):
                entry.unlink(missing_ok=True)
                continue
            steps.add(int(number))
    return steps


def removal_mark(root: Path, step: int) -> Path:
    return Path(root) / f".removing-checkpoint_step_{step}"


@contextmanager
def removal(root: Path, step: int) -> Iterator[bool]:
    """Around the removal of checkpoint `step`: marked first, then True unless it is pinned now."""
    mark = removal_mark(root, step)
    write_json_atomic(mark, _holder())
    try:
        yield step not in pinned_steps(root)
    finally:
        mark.unlink(missing_ok=True)


def being_removed(root: Path, step: int) -> bool:
    """A removal of `step` is under way (a mark whose holder is gone is cleared: no wait on a dead rank)."""
    from trainer.launcher.ownership import holder_gone

    mark = removal_mark(root, step)
    if not mark.exists():
        return False
    if holder_gone(mark):
        mark.unlink(missing_ok=True)
        return False
    return True


def read_records(root: Path) -> dict[int, dict[str, Any]]:
    try:
        data = json.loads((evaluation_dir(root) / RECORDS).read_text())
        found = data["evaluations"]
        return {int(k): v for k, v in found.items() if isinstance(v, dict)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def write_record(root: Path, record: dict[str, Any]) -> None:
    records = read_records(root)
    records[int(record["step"])] = record
    path = evaluation_dir(root) / RECORDS
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"evaluations": {str(k): records[k] for k in sorted(records)}})


def success_rates(root: Path) -> dict[int, float]:
    rates = {}
    for step, record in read_records(root).items():
        rate = record.get("success_rate")
        if record.get("status") == DONE and isinstance(rate, int | float):
            rates[step] = float(rate)
    return rates


__all__ = [
    "ABANDONED", "DONE", "FAILED", "SKIPPED", "beat", "being_removed", "evaluation_dir", "pin", "pin_path",
    "pinned_steps", "read_records", "removal", "removal_mark", "success_rates", "unpin", "write_record",
]  # fmt: skip
