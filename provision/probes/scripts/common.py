"""Shared by the probe scripts (copied beside them as envcheck_probe_common.py): report a result or the
real exception, verbatim; locate a compiler command the way the job resolves it; load torch with the cyclic
collector off (`collector_off`)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

RESULT_MARKER = "ENVCHECK_RESULT="


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The cyclic collector off while the probe imports torch (~0.4M objects that live as long as the probe),
    then those frozen out of its reach, as a rank does (trainer/loop/train.py): bin/train's --preflight-only
    (the Inductor and Triton probes) 11.1-11.5 -> 9.1-9.8 CPU-s, paired (docs/tests.md); under qemu, where
    the aarch64 worker's probes run, each of those CPU-seconds is ~20."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def emit(**result: Any) -> None:
    print(RESULT_MARKER + json.dumps(result), flush=True)


def chain(exc: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and all(exc is not e for e in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def error_text(exc: BaseException) -> str:
    """The exception as a user sees it, one line per link of its cause chain (Dynamo wraps Inductor's
    errors); error_detail() has the full text."""
    lines: list[str] = []
    for link in chain(exc):
        first = (str(link).strip().splitlines() or [""])[0]
        line = f"{type(link).__name__}: {first}".rstrip(": ")
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)


def error_detail(exc: BaseException) -> str:
    return "\n".join(f"{type(link).__name__}: {link}" for link in chain(exc))[:20000]


def failed(stage: str, exc: BaseException, **extra: Any) -> None:
    emit(ok=False, stage=stage, error=error_text(exc), error_detail=error_detail(exc), **extra)


def located(command: str, path: str) -> str | None:
    """A command as the job resolves it: absolute path, symlinks followed (None: not found)."""
    found = command if os.sep in command else shutil.which(command, path=path)
    return os.path.realpath(found) if found and os.path.exists(found) else None


def outside(real: str | None, prefix: str | None) -> bool:
    return bool(prefix) and (real is None or not real.startswith(os.path.realpath(str(prefix)) + os.sep))
