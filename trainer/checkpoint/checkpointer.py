"""Checkpoints with torch.distributed.checkpoint (DCP): complete and recognisable as such, or ignored.

Layout under RUN_DIR/checkpoints/:

    checkpoint_step_N/              a complete checkpoint
        .metadata, __*_*.distcp     DCP: model + optimizer state (sharded, one file per rank), LR schedule
        rng_rank<R>.pt              rank R's RNG states (torch CPU and CUDA, numpy, python)
        train_state.json            step (= data position: batches are a pure function of the step),
                                    world size, the run config
        model.safetensors           optional consolidated weights for evaluation
        COMPLETE                    JSON {step, files: {name: size}, sha256: {name: hex}, finite}, last
    best -> checkpoint_step_N       a relative symlink to the best checkpoint by checkpoint.best_by (kept
                                    out of pruning: trainer/checkpoint/best.py); not a checkpoint itself
    checkpoint_step_N.tmp-<id>/     a save in progress, or one killed mid-write: never loaded
    checkpoint_step_N.damaged-<t>/  files no longer match COMPLETE: moved aside, never deleted
(what counts as which: trainer/checkpoint/layout.py)

A save writes everything into the .tmp directory, all ranks meet at a barrier, then rank 0 writes
COMPLETE into it and renames it into place (atomic on POSIX). So kill -9 at any moment leaves the
previous complete checkpoint as the latest one. Deleting an old checkpoint removes COMPLETE first, so a
half-deleted directory is never taken for a complete one. Out of space on any rank during a save:
every rank raises at the save's agreement (OutOfSpace where it happened, PeerStopped elsewhere), the
partial directory is removed at once, earlier checkpoints are untouched. A checkpoint never carries
divergence: a save is refused on every rank (NonFiniteState) when any parameter or optimizer moment of
any rank's own shard is NaN/Inf, so pruning only ever removes older finite checkpoints.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from provision.atomic import fsync_dir
from trainer.checkpoint.diskspace import OutOfSpace, find_out_of_space, guard, short_of_room
from trainer.checkpoint.finite import FINITE_KEY, first_nonfinite
from trainer.checkpoint.layout import (  # noqa: F401 (re-exported: the layout is part of this contract)
    _DAMAGED,
    _FINAL,
    MARKER,
    SAFETENSORS,
    TRAIN_STATE,
    CheckpointInfo,
    _remove,
    checkpoint_dir,
    file_sha256,
    latest_complete,
    prune,
    resume_conflicts,
    scan,
)
from trainer.config import CheckpointConfig, ModelConfig, RunConfig


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message names it and the fix."""


class NonFiniteState(CheckpointError):
    """A save refused: a parameter or optimizer moment holds NaN/Inf on some rank (a checkpoint never
    carries divergence). Raised on every rank; `tensor` and `rank` name the first one found."""

    def __init__(self, step: int, tensor: str, rank: int):
        super().__init__(f"checkpoint step {step} refused: {tensor} holds non-finite values on rank {rank}")
        self.tensor, self.rank = tensor, rank


class PeerStopped(RuntimeError):
    """This rank stops because another rank could not save (its record says why)."""


@dataclass
class _Pending:
    step: int
    tmp: Path
    final: Path
    future: Any
    before_commit: Callable[[], None] | None
    failure: OutOfSpace | None


class TrainState(Stateful):
    """What DCP saves and loads collectively: model, optimizer (both sharded), LR schedule."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler

    def state_dict(self) -> dict:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd, "lr_schedule": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        self.scheduler.load_state_dict(state["lr_schedule"])


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    """The checkpoint policy of one run and its collective save/load; every rank calls them together.

    Built from the run's CheckpointConfig (every, keep, exports, async_save) plus the last step. It
    decides when a step ends with a save (due), saves (asynchronously only mid-run), agrees with the other
    ranks whether a stop arrived during the save (then an asynchronous save is committed before the rank
    stops), and remembers the last committed checkpoint (or the one the run resumed from)."""

    def __init__(
        self,
        root: Path,
        config: CheckpointConfig,
        *,
        last_step: int,
        attempt: str,
        model_config: ModelConfig | None = None,
        device: torch.device | None = None,
        data_stats: dict | None = None,
    ) -> None:
        self.root = Path(root)
        self.config = config
        self.last_step = last_step
        self.attempt = attempt
        self.model_config = model_config  # checkpoint.export=reference writes the released config.json
        self.data_stats = (
            data_stats  # the statistics trained with, in every train_state.json (evaluate, serve)
        )
        self.device = device or torch.device("cpu")  # where the stop agreement's flag lives (nccl: cuda)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.last_committed: CheckpointInfo | None = None
        self._pending: _Pending | None = None
        self.estimate: int | None = None  # bytes of one checkpoint (for the out-of-space message)
        # rank 0, before pruning: the steps to keep out of `keep` pruning (trainer/checkpoint/best.py)
        self.pin: Callable[[list[CheckpointInfo]], set[int]] | None = None
        self._async_group = None

    @property
    def keep(self) -> int:
        return self.config.keep

    def due(self, step: int, stopping: bool) -> bool:
        """Whether `step` ends with a save: every `checkpoint.every` steps, at the last step, and when
        stopping."""
        every = self.config.every
        return stopping or step == self.last_step or (every > 0 and step % every == 0)

    def save_due(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        *,
        stopping: bool,
        stop_requested: Callable[[], bool],
        train_state: dict[str, Any],
        before_commit: Callable[[], None] | None = None,
    ) -> bool:
        """Collective, for a step where due() holds: save (asynchronous only mid-run, when
        checkpoint.async_save: a stop or the last step must be on disk before the rank exits), then agree
        whether any rank was asked to stop during the save (`stop_requested`: this rank's local flag);
        an asynchronous save is committed before stopping on it. Returns whether the run stops."""
        asynchronous = self.config.async_save and not stopping and step < self.last_step
        self.save(
            step,
            model,
            optimizer,
            scheduler,
            train_state=train_state,
            before_commit=before_commit,
            asynchronous=asynchronous,
        )
        if stopping:
            return True
        flag = torch.tensor(float(stop_requested()), device=self.device)
        dist.all_reduce(flag)  # a signal that arrived during the save stops every rank here
        if flag.item() > 0 and step < self.last_step:
            self.finish()  # commit an asynchronous save before stopping on it
        return flag.item() > 0

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        *,
        train_state: dict[str, Any],
        before_commit: Callable[[], None] | None = None,
        asynchronous: bool = False,
    ) -> CheckpointInfo | None:
        """Collective. Returns the committed checkpoint; with asynchronous=True DCP writes from a
        background thread and the checkpoint is committed by the next save() or finish() (returns None).
        Out of space on any rank: every rank raises (OutOfSpace there, PeerStopped elsewhere) and the
        partial directory is removed at once; earlier checkpoints are untouched."""
        self.finish()  # at most one save in flight: commit the previous one first
        final = checkpoint_dir(self.root, step)
        tmp = final.with_name(f"{final.name}.tmp-{self.attempt}")
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        self._refuse_nonfinite(step, tmp, first_nonfinite(model, optimizer))  # also the barrier after mkdir

        state = {"train": TrainState(model, optimizer, scheduler)}
        future = None
        failure: OutOfSpace | None = None
        try:
            with guard(tmp, "checkpoint save", self.estimate):
                if asynchronous:
                    # Its own gloo group: the background thread's collectives must not interleave.
                    self._async_group = self._async_group or dist.new_group(backend="gloo")
                    future = dcp.async_save(state, checkpoint_id=tmp, process_group=self._async_group)
                else:
                    dcp.save(state, checkpoint_id=tmp)
                torch.save(rng_state(), tmp / f"rng_rank{self.rank}.pt")
                if self.config.export_safetensors:
                    self._export_safetensors(model, tmp / SAFETENSORS)
                if self.config.export == "reference":  # collective; rank 0 writes tmp/transformer/...
                    from trainer.model import export_reference

                    export_reference(model, RunConfig(model=self.model_config or ModelConfig()), tmp)
                if self.rank == 0:
                    saved = {**train_state, "step": step, "world_size": self.world_size}
                    if self.data_stats is not None:
                        saved["data_stats"] = self.data_stats
                    (tmp / TRAIN_STATE).write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
        except BaseException as exc:  # DCP's CheckpointException (a BaseException) wraps a rank's ENOSPC
            failure = find_out_of_space(exc, "checkpoint save", tmp) or self._short_of_space(tmp)
            if failure is None:
                raise
            failure.report.needed = failure.report.needed or self.estimate
        self._pending = _Pending(step, tmp, final, future, before_commit, failure)
        return None if asynchronous and failure is None else self.finish()

    def finish(self) -> CheckpointInfo | None:
        """Commit the save in flight, if any (collective); returns it."""
        if self._pending is None:
            return None
        pending, self._pending = self._pending, None
        failure = pending.failure
        if pending.future is not None and failure is None:
            try:
                pending.future.result()  # this rank's DCP files are written
            except BaseException as exc:  # CheckpointException is a BaseException
                failure = find_out_of_space(exc, "checkpoint save", pending.tmp)
                failure = failure or self._short_of_space(pending.tmp)
                if failure is None:
                    raise
        if pending.before_commit is not None:
            pending.before_commit()
        hashes = self._own_checksums(pending.tmp) if failure is None else {}
        everyone = self._agree(failure, pending.tmp, hashes)  # every rank's files are written
        if self.rank == 0:
            try:
                with guard(pending.tmp, "checkpoint save", self.estimate):
                    self._commit(pending.tmp, pending.final, pending.step, everyone)
                self._prune(keep_step=pending.step)
            except OutOfSpace as exc:
                failure = exc
        self._agree(failure, pending.tmp, {})  # nobody goes on (or exits) before it is in place
        self.last_committed = CheckpointInfo(pending.step, pending.final)
        return self.last_committed

    def _refuse_nonfinite(self, step: int, tmp: Path, mine: str | None) -> None:
        """Collective: raise NonFiniteState on every rank when any rank's own shard is non-finite."""
        flag = torch.tensor(float(mine is not None), device=self.device)
        dist.all_reduce(flag)
        if flag.item() == 0:
            return
        found: list[Any] = [None] * self.world_size
        dist.all_gather_object(found, mine)
        if self.rank == 0:
            _remove(tmp)
        rank = next(r for r, name in enumerate(found) if name is not None)
        raise NonFiniteState(step, found[rank], rank)

    def _short_of_space(self, tmp: Path) -> OutOfSpace | None:
        """A save that failed without an errno (torch's zip writer turns a short write on a full disk into
        RuntimeError "unexpected pos"), where the filesystem or the quota (EDQUOT, which statvfs does not
        show) has no room for one checkpoint: out of space."""
        return short_of_room(tmp, "checkpoint save", self.estimate)

    def _own_checksums(self, tmp: Path) -> dict[str, str]:
        """sha256 of the files this rank wrote (its DCP shards and RNG; rank 0 also the rest)."""
        mine = (f"__{self.rank}_", f"rng_rank{self.rank}.")
        names = [p.name for p in sorted(tmp.iterdir()) if p.is_file()]
        others = (f"__{r}_" for r in range(self.world_size))
        shared = [n for n in names if not n.startswith(("__", "rng_rank"))]
        own = [n for n in names if n.startswith(mine)]
        if self.rank == 0:
            own += shared + [n for n in names if n.startswith("__") and not n.startswith(tuple(others))]
        return {name: file_sha256(tmp / name) for name in own}

    def _agree(self, failure: OutOfSpace | None, tmp: Path, hashes: dict[str, str]) -> dict[str, str]:
        """Collective: every rank learns whether any rank failed (then all raise, the partial directory is
        removed at once by rank 0) and rank 0 gets every rank's checksums."""
        report = failure.to_json() if failure is not None else None
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, (report, hashes))
        reports = [r for r, _ in gathered if r is not None]
        if reports:
            if self.rank == 0:
                _remove(tmp)
            if failure is not None:
                raise failure
            raise PeerStopped(f"another rank could not save the checkpoint: {reports[0].get('path')}")
        merged: dict[str, str] = {}
        for _, h in gathered:
            merged.update(h)
        return merged

    def _commit(self, tmp: Path, final: Path, step: int, checksums: dict[str, str]) -> None:
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        missing = sorted(set(files) - set(checksums))
        for name in missing:  # a file no rank claimed (a DCP naming change): hash it here
            checksums[name] = file_sha256(tmp / name)
        with open(tmp / MARKER, "w") as f:
            marker = {"step": step, "files": files, "sha256": checksums, FINITE_KEY: True}  # checked at save
            json.dump(marker, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        if final.exists():  # a leftover under the final name (not ours): move it aside, then replace
            aside = final.with_name(f"{final.name}.old-{self.attempt}")
            os.replace(final, aside)
            _remove(aside)
        os.replace(tmp, final)
        fsync_dir(self.root)

    def _prune(self, keep_step: int) -> None:
        prune(self.root, self.keep, keep_step, self.pin)

    def _export_safetensors(self, model: torch.nn.Module, path: Path) -> None:
        from safetensors.torch import save_file

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(model, options=options)  # collective: every rank takes part
        if self.rank == 0:
            save_file({k: torch.as_tensor(v).contiguous() for k, v in full.items()}, str(path))

    def load(self, info: CheckpointInfo, model: torch.nn.Module, optimizer, scheduler) -> dict:
        """Restore model, optimizer, LR schedule and this rank's RNG; returns the train state. Whether this
        run may resume from `info` at all (world size, model, data) is resume_conflicts(), checked by
        resume() here and by the launcher's preflight."""
        state = info.train_state()
        dcp.load({"train": TrainState(model, optimizer, scheduler)}, checkpoint_id=info.path)
        set_rng_state(torch.load(info.path / f"rng_rank{self.rank}.pt", weights_only=False))
        self.last_committed = info
        return state

    def resume(
        self, info: CheckpointInfo, model: torch.nn.Module, optimizer, scheduler, cfg: RunConfig
    ) -> dict:
        """Collective: refuse a checkpoint this run may not resume from (CheckpointError naming it and
        why), else load() it."""
        conflicts = resume_conflicts(info.train_state(), cfg, self.world_size)
        if conflicts:
            raise CheckpointError(f"cannot resume from {info.path}: " + "; ".join(conflicts))
        return self.load(info, model, optimizer, scheduler)
