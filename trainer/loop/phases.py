"""Rank 0 tells the launcher's stall detector which phase it is in, through progress.json.

    phases = Phases(attempt, rank)                 # None attempt or rank != 0: every call is a no-op
    phases.enter(FIRST_STEP)                       # before the attempt's first step (it compiles)
    with phases.during(EVALUATION): ...            # the held-out losses
    with phases.during(SAVE, nbytes=estimate): ... # a checkpoint save

Each call rewrites progress.json (trainer/attempt.py Progress) with the phase, its start (time.time())
and `expect_s`, the rank's prediction of its length from what this attempt measured: an evaluation's last
duration; a save's bytes over the write speed of the last save (bytes / seconds). Nothing measured yet:
None, and the launcher applies the phases' floor (hang.phase_s). After a phase, record_step
(trainer/loop/observe.py) writes the next step's progress with phase STEP. A failed write is ignored here (the
step's own progress write reports a full disk).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager

from trainer.attempt import EVALUATION, SAVE, Attempt


class Phases:
    def __init__(self, attempt: Attempt | None, rank: int):
        self.attempt = attempt if rank == 0 else None
        self.last_s: dict[str, float] = {}
        self.save_speed: float | None = None  # bytes per second of the last save

    def expect(self, phase: str, nbytes: int | None = None) -> float | None:
        if phase == SAVE and nbytes and self.save_speed:
            return nbytes / self.save_speed
        return self.last_s.get(phase) if phase == EVALUATION else None

    def enter(self, phase: str, expect_s: float | None = None) -> None:
        if self.attempt is None:
            return
        progress = dataclasses.replace(
            self.attempt.read_progress(), phase=phase, phase_time=time.time(), expect_s=expect_s
        )
        try:
            self.attempt.write_progress(progress)
        except OSError:
            pass

    @contextmanager
    def during(self, phase: str, nbytes: int | None = None) -> Iterator[None]:
        self.enter(phase, self.expect(phase, nbytes))
        started = time.perf_counter()
        yield
        took = max(time.perf_counter() - started, 1e-3)
        self.last_s[phase] = took
        if phase == SAVE and nbytes:
            self.save_speed = nbytes / took
