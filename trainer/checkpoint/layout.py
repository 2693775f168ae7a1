"""The on-disk layout of RUN_DIR/checkpoints/ and what counts as complete, partial or damaged.

    checkpoint_step_N/                 complete: COMPLETE lists every file with its size and sha256
    checkpoint_step_N.tmp-<attempt>/   a save in progress, or one killed mid-write: never loaded
    checkpoint_step_N.damaged-<time>/  moved aside because its files do not match COMPLETE: never deleted

Reading only (no torch, no process group): the launcher's preflight and the ranks both use it; writing
is trainer/checkpoint/checkpointer.py. resume_conflicts() is the one check of whether a run may resume from a
checkpoint (world size, model, data, seed): the preflight and Checkpointer.resume both call it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer.config import RunConfig

MARKER = "COMPLETE"
TRAIN_STATE = "train_state.json"
SAFETENSORS = "model.safetensors"
_FINAL = re.compile(r"^checkpoint_step_(\d+)$")
_PARTIAL = re.compile(r"^checkpoint_step_(\d+)\.tmp-")
_DAMAGED = re.compile(r"^checkpoint_step_(\d+)\.damaged-")  # moved aside, never deleted


def file_sha256(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path

    def train_state(self) -> dict:
        return json.loads((self.path / TRAIN_STATE).read_text())


def checkpoint_dir(root: Path, step: int) -> Path:
    return Path(root) / f"checkpoint_step_{step}"


def _is_complete(path: Path, step: int) -> bool:
    """COMPLETE exists, names this step, and every file it lists is there with its recorded size."""
    try:
        marker = json.loads((path / MARKER).read_text())
        if marker.get("step") != step:
            return False
        return all((path / name).stat().st_size == size for name, size in marker["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def damage(path: Path, step: int, checksums: bool) -> str | None:
    """Why a checkpoint directory that has a COMPLETE marker does not match it (None: intact).
    checksums=False compares sizes only (cheap); True also each file's sha256 (a full read)."""
    try:
        marker = json.loads((path / MARKER).read_text())
        files, digests = marker["files"], marker.get("sha256") or {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its {MARKER} marker is unreadable ({exc})"
    if marker.get("step") != step:
        return f"its {MARKER} marker names step {marker.get('step')}"
    for name, size in sorted(files.items()):
        try:
            actual = (path / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual != size:
            return f"{name} is {actual} bytes, {MARKER} says {size}"
    for name, digest in sorted(digests.items()) if checksums else ():
        if file_sha256(path / name) != digest:
            return f"{name} does not match its sha256 in {MARKER}"
    return None


@dataclass(frozen=True)
class Damaged:
    step: int
    path: str  # where it was
    moved_to: str  # where it is now (never deleted)
    problem: str


class DamagedInPlace(OSError):
    """A damaged checkpoint that could not be moved aside (a read-only checkpoints dir): never used."""


def quarantine_damaged(root: Path) -> list[Damaged]:
    """Move aside every damaged checkpoint under `root` (checkpoint_step_N.damaged-<time>): sizes for all
    that carry a marker, sha256 for the newest intact one (the one a resume loads) until one passes."""
    root = Path(root)
    if not root.is_dir():
        return []
    moved = []

    def aside(path: Path, step: int, problem: str) -> None:
        target = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        try:
            os.replace(path, target)
        except OSError as exc:  # left where it is, a damaged checkpoint would be resumed from or counted
            raise DamagedInPlace(
                f"{path} is damaged ({problem}) and could not be moved aside ({exc.strerror or exc}); make "
                f"{root} writable, or move it aside by hand (mv {path} {target}), and run again"
            ) from None
        moved.append(Damaged(step, str(path), str(target), problem))

    for entry in sorted(root.iterdir()):
        final = _FINAL.match(entry.name)
        if final and entry.is_dir() and (entry / MARKER).exists():
            problem = damage(entry, int(final.group(1)), checksums=False)
            if problem:
                aside(entry, int(final.group(1)), problem)
    while True:
        complete, _ = scan(root)
        if not complete:
            break
        problem = damage(complete[-1].path, complete[-1].step, checksums=True)
        if problem is None:
            break
        aside(complete[-1].path, complete[-1].step, problem)
    return moved


def scan(root: Path) -> tuple[list[CheckpointInfo], str]:
    """Complete checkpoints under `root`, oldest first, and (when there are none) why: for the log."""
    root = Path(root)
    if not root.is_dir():
        return [], f"no checkpoint directory {root}"
    complete, partial = [], []
    for entry in root.iterdir():
        final = _FINAL.match(entry.name)
        if final and entry.is_dir() and _is_complete(entry, int(final.group(1))):
            complete.append(CheckpointInfo(int(final.group(1)), entry))
        elif final or _PARTIAL.match(entry.name):
            partial.append(entry.name)
    complete.sort(key=lambda c: c.step)
    if complete:
        return complete, ""
    if partial:
        return [], f"only partial checkpoints in {root} (no {MARKER} marker): {', '.join(sorted(partial))}"
    aside = sorted(entry.name for entry in root.iterdir() if ".damaged-" in entry.name)
    if aside:  # not "empty": the user should know their checkpoints are there, only not usable
        return (
            [],
            f"no usable checkpoint in {root}: every one was moved aside as damaged ({', '.join(aside)})",
        )
    return [], f"checkpoint directory {root} is empty"


def latest_complete(root: Path) -> CheckpointInfo | None:
    """The newest complete checkpoint; None (fresh start) for an absent dir, an empty one, or only
    partial ones."""
    complete, _ = scan(root)
    return complete[-1] if complete else None


# Settings a resumed run must share with its checkpoint: they change the model's shapes, the data, or
# the per-rank streams. Everything else (steps, LR, checkpoint cadence, logging) may change on resume.
_FIXED_SECTIONS = ("model", "data")
_FIXED_KEYS = ("train.seed", "train.batch_size", "train.grad_accum")
# data.* keys that say where the data and its cache are, not what it is: free on a resume, an evaluation,
# a server (data.cache_dir: the out-of-space fix moves the cache; a review found it refused the resume)
FREE_DATA_KEYS = ("path", "generate_if_missing", "latent_cache", "cache_dir")


def resume_conflicts(train_state: dict, cfg: RunConfig, world_size: int) -> list[str]:
    """Why this run may not resume from a checkpoint with `train_state`; empty when it may."""
    saved, now = train_state.get("config") or {}, cfg.to_dict()
    problems = []
    if train_state.get("world_size") != world_size:
        problems.append(f"it was written by {train_state.get('world_size')} ranks, this run has {world_size}")
    keys = [f"{s}.{k}" for s in _FIXED_SECTIONS for k in now[s] if not (s == "data" and k in FREE_DATA_KEYS)]
    for key in [*keys, *_FIXED_KEYS]:
        section, name = key.split(".")
        old, new = saved.get(section, {}).get(name), now[section][name]
        if old != new:
            problems.append(f"{key} was {old!r}, is now {new!r}")
    if problems:
        problems.append("resume with the checkpoint's settings, or start a new run with --run-dir")
    return problems


def _remove(path: Path) -> None:
    """Delete a checkpoint directory so that no moment of the deletion looks complete."""
    (path / MARKER).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def prune(
    root: Path, keep: int, keep_step: int, pin: Callable[[list[CheckpointInfo]], set[int]] | None = None
) -> None:
    """Keep the newest `keep` complete checkpoints, `keep_step`, and the pinned ones (`pin`: the best,
    trainer/checkpoint/best.py, kept when it is older); drop stale partial ones from dead attempts (the
    `checkpoint_step_N.tmp-*` folders saves make). Symlinks (the `best` pointer) are never followed or
    removed here, nor is anything else: a checkpoint the user moved aside (`checkpoint_step_6.suspect`, as
    a non-finite checkpoint's fix says) or a folder of their own stays."""
    from trainer.checkpoint import simrecords

    complete, _ = scan(root)
    pinned = pin(complete) if pin is not None else set()
    for old in complete[: max(0, len(complete) - keep)]:
        if old.step != keep_step and old.step not in pinned:
            with simrecords.removal(root, old.step) as free:  # a pin taken since is honoured (simrecords.py)
                if free:
                    _remove(old.path)
    for entry in Path(root).iterdir():
        if _PARTIAL.match(entry.name) and entry.is_dir() and not entry.is_symlink():
            _remove(entry)
