"""The rank's process around the loop: its command line, torch.distributed set-up, stop signals, test
pause points, and the collective safe point for failed writes (agree_on_failure) and their quiet record;
the record of any other failure (record_failure: the traceback goes to the attempt's rank_<R>.log, never
the terminal).

StopRequest: SIGTERM/SIGUSR1 (or the attempt's stop request) only set a flag, acted on at a safe point.
pause_point: the test hook (trainer/testhooks.py) that parks a rank until released.
"""

from __future__ import annotations

import argparse
import datetime
import errno
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist

from trainer import testhooks
from trainer.attempt import FAILED, Attempt, RankStatus
from trainer.checkpoint.checkpointer import CheckpointError, PeerStopped
from trainer.checkpoint.diskspace import OutOfSpace
from trainer.config import RunConfig

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def parse_args(argv: list[str] | None) -> tuple[Path, Path]:
    """The rank's command line: (run dir, attempt dir: --attempt-dir, else $LINGBOT_ATTEMPT_DIR)."""
    parser = argparse.ArgumentParser(description="one rank of a training run (started by torchrun)")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--attempt-dir", type=Path, help="default: $LINGBOT_ATTEMPT_DIR (its config.json)")
    args = parser.parse_args(argv)
    attempt_dir = args.attempt_dir or os.environ.get("LINGBOT_ATTEMPT_DIR")
    if not attempt_dir:
        sys.exit("trainer.loop.train needs --attempt-dir (bin/train writes its config.json there)")
    return args.run_dir.absolute(), Path(attempt_dir)


class StopRequest:
    """Set by SIGTERM/SIGUSR1 or by the attempt's stop request; acted on only at a safe point."""

    def __init__(self, attempt: Attempt | None):
        self.attempt = attempt
        self.signal_name: str | None = None
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: a second signal during a checkpoint save must not interrupt the save.
        self.signal_name = self.signal_name or signal.Signals(signum).name

    @property
    def local(self) -> bool:
        return self.signal_name is not None or (self.attempt is not None and self.attempt.stop_requested())

    def reason(self) -> str:
        """The launcher's signal when it asked (it forwards every stop to the ranks as SIGUSR1, so a SIGTERM
        to bin/train must not read as a SIGUSR1 in the records), else this rank's own."""
        asked = self.attempt.stop_reason() if self.attempt is not None else None
        if asked:
            return asked
        return f"received {self.signal_name}" if self.signal_name else "the launcher asked to stop"


def pause_point(point: str, step: int, rank: int) -> None:
    """Test hooks (trainer/testhooks.py): park or slow this rank at `point` of `step` when a test asks."""
    testhooks.sleep(point, step, rank)
    testhooks.pause(point, step, rank)


def init_distributed(collective_timeout_s: float | None = None) -> tuple[int, int, int, torch.device]:
    """The process group; `collective_timeout_s` (config hang.collective_timeout_s) bounds every wait in
    a collective (gloo) and is NCCL's watchdog timeout: the backstop behind the launcher's stall detector."""
    if "RANK" not in os.environ:
        sys.exit("trainer.loop.train is one rank of a torchrun job: run it with bin/train (or torchrun)")
    rank, world_size, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    timeout = datetime.timedelta(seconds=collective_timeout_s) if collective_timeout_s else None
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return rank, world_size, local_rank, device


# torchrun's exit barrier (torch.distributed.elastic.agent.server.api._exit_barrier, torch 2.13): every
# agent adds 1 to this key of the agents' store, the one whose add makes it nnodes sets a flag, all wait
# for the flag. The store lives in node 0's torchrun: when node 0's agent passes first and exits while
# another agent is between its add and its wait, that one prints TCPStore and exit-barrier tracebacks.
EXIT_BARRIER_COUNT = "{run_id}/torchelastic/agent/terminal_state/num_members"
LEAVE_LAST_WAIT_S = 60.0
LEAVE_LAST_GRACE_S = 2.0  # after the others' adds: their next store call, the wait, is one call away


def leave_last_on_node_0() -> None:
    """On node 0 of several, after a clean end: exit only once every other node's torchrun has checked
    in to the exit barrier (plus a grace), so that node 0's torchrun, which hosts the store, is the last
    to arrive and the first to leave, and no agent loses the store mid-barrier. Bounded; never raises."""
    env = os.environ
    try:
        nodes = int(env["WORLD_SIZE"]) // int(env["LOCAL_WORLD_SIZE"])
        if int(env.get("GROUP_RANK", "0")) != 0 or nodes < 2:
            return
        key = EXIT_BARRIER_COUNT.format(run_id=env["TORCHELASTIC_RUN_ID"])
        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                              timeout=datetime.timedelta(seconds=10))  # fmt: skip
        deadline = time.monotonic() + LEAVE_LAST_WAIT_S
        while time.monotonic() < deadline:
            if store.add(key, 0) >= nodes - 1:  # add 0: read the count without changing it
                time.sleep(LEAVE_LAST_GRACE_S)
                return
            time.sleep(0.05)  # polling the store with a deadline
    except (KeyError, ValueError, RuntimeError, dist.DistError):
        return


def agree_on_failure(failure: OutOfSpace | None, device: torch.device) -> None:
    """Collective safe point: when any rank holds a failure, every rank raises (its own, or PeerStopped)."""
    flag = torch.tensor(float(failure is not None), device=device)
    dist.all_reduce(flag)
    raise_if_any(failure, flag.item() > 0)


def raise_if_any(failure: OutOfSpace | None, anyone: bool) -> None:
    if failure is not None:
        raise failure
    if anyone:
        raise PeerStopped("another rank could not write (its record says why)")


# Failures a rerun repeats until the input is fixed (RankStatus.needs_fix; the launcher's last line says it)
def needs_fix(exc: BaseException) -> str | None:
    from trainer.config import ConfigError
    from trainer.data.cache.manifest import StaleCache
    from trainer.data.encoding.folders import EncoderError
    from trainer.data.formats.furniturebench import DatasetError
    from trainer.model.attention import BackendUnavailable
    from trainer.model.weights import PretrainedError

    fixes: list[tuple[type[BaseException], str]] = [
        (StaleCache, "the latent cache is rebuilt (its line says how)"),  # the data may be fine: it changed
        (DatasetError, "the data is fixed"),
        (EncoderError, "the data.* encoder settings are fixed"),
        (PretrainedError, "the model.pretrained folder (or the settings it conflicts with) is fixed"),
        (ConfigError, "the config is fixed"),
        (CheckpointError, "the checkpoint conflict is resolved"),
        (BackendUnavailable, "model.attention is changed"),
    ]
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # not transient
        return f"{exc.filename or 'the path it names'} can be written"
    return next((fix for cls, fix in fixes if isinstance(exc, cls)), None)


def record_failure(attempt: Attempt, rank: int, exc: BaseException) -> None:
    """A rank's own error: its record (the error in one line, the traceback) and the traceback in the
    attempt's rank_<R>.log; nothing on the terminal (the launcher says the one line)."""
    detail = traceback.format_exc()
    error = f"{type(exc).__name__}: {exc}"
    attempt.write_rank(RankStatus(rank, FAILED, error=error, traceback=detail, needs_fix=needs_fix(exc)))
    try:
        with open(attempt.dir / f"rank_{rank}.log", "a") as log:
            log.write(detail)
    except OSError:
        pass  # the record (file or stderr line) carries the same traceback


def record_quiet_failure(
    attempt: Attempt, rank: int, cfg: RunConfig, space: OutOfSpace | None, exc: BaseException
) -> None:
    detail = traceback.format_exc()
    error = space.line(cfg.checkpoint.keep) if space is not None else f"stopped: {exc}"
    record = RankStatus(
        rank, FAILED, error=error, traceback=detail, out_of_space=space.to_json() if space else None
    )
    attempt.write_rank(record)  # falls back to a record line on stderr when even this cannot be written
    try:
        with open(attempt.dir / f"rank_{rank}.log", "a") as log:
            log.write(detail)
    except OSError:
        pass  # the record (file or stderr line) carries the same traceback
