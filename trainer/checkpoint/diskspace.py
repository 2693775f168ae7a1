"""Out of space or quota (ENOSPC / EDQUOT): one typed error, said in one line, for ranks and launcher.

Contract:
- `OutOfSpace(what, path, needed)` is what any writer (checkpoint save, summary, metrics/log, latent
  cache in trainer/data, ...) raises when the filesystem is full; `guard(path, what, needed)` turns an
  ENOSPC/EDQUOT OSError inside its block into one. `find_out_of_space(exc)` recognises one anywhere in an
  exception's chain, including DCP's CheckpointException (which wraps the failing rank's error).
  `short_of_room(dir, what, needed)` tells a write that failed without an errno (torch's zip writer) whether
  the filesystem or a quota was the cause: statvfs, then a posix_fallocate probe (statvfs cannot see quotas).
- `OutOfSpace.line()` is the one line the user sees: the filesystem (mount point, type), the path, the
  free space, the size it needed, and the fix (for the latent cache / dataset generation, which write beside
  the data, the fix is data.cache_dir / data.path, not checkpoint.keep / --run-dir). EDQUOT is handled
  exactly as ENOSPC everywhere; only the words differ ("quota exceeded", "raise the quota").
  `to_json` / `from_json` carry it in a rank record.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # a quota (EDQUOT, 122) is treated as a full disk
DATA_WRITES = frozenset({"latent cache", "dataset generation"})  # writes beside the data, not in the run dir


def human(n: int | None) -> str:
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _filesystem(path: Path) -> tuple[str, str, int | None]:
    """(mount point, fstype, free bytes) of the filesystem holding `path` (or its nearest parent)."""
    from provision.nodeinfo import free_bytes, mount_of

    try:
        mount = mount_of(path)
        point, fstype = mount.mount_point, mount.fstype
    except (OSError, ValueError):
        point, fstype = "?", "?"
    try:
        free: int | None = free_bytes(path)
    except OSError:
        free = None
    return point, fstype, free


@dataclass
class SpaceReport:
    what: str  # "checkpoint save", "summary write", "metrics write", "latent cache", ...
    path: str
    needed: int | None  # bytes the write needed (an estimate where the writer knows one)
    free: int | None
    mount_point: str
    fstype: str
    quota: bool  # EDQUOT (a quota) rather than ENOSPC (the filesystem itself)


class OutOfSpace(OSError):
    """A write ran out of space or quota; `report` says where and how much."""

    def __init__(
        self, what: str, path: str | os.PathLike[str], needed: int | None = None, quota: bool = False
    ):
        point, fstype, free = _filesystem(Path(path))
        self.report = SpaceReport(what, os.fspath(path), needed, free, point, fstype, quota)
        super().__init__(errno.EDQUOT if quota else errno.ENOSPC, self.line())

    @classmethod
    def of(cls, report: SpaceReport) -> OutOfSpace:
        exc = cls.__new__(cls)
        exc.report = report
        OSError.__init__(exc, errno.EDQUOT if report.quota else errno.ENOSPC, exc.line())
        return exc

    def line(self, keep: int | None = None) -> str:
        r = self.report
        limit = "quota exceeded" if r.quota else "out of space"
        free = f"{human(r.free)} free"
        if r.quota:  # statvfs does not see a quota: the filesystem may have room this user may not use
            free += " on the filesystem, none left in the quota"
        room = "free space there" + (" (or raise the quota)" if r.quota else "")
        if r.what in DATA_WRITES:  # the data's filesystem, not the run dir's: checkpoint.keep does not help
            fix = (
                f"{room}, or move the latent cache with --set data.cache_dir=DIR (or the data, data.path) "
                "to a filesystem with room"
            )
        else:
            keep_text = f" (now {keep})" if keep is not None else ""
            fix = f"{room}, lower checkpoint.keep{keep_text}, or move --run-dir to a filesystem with room"
        return (
            f"{limit} on {r.mount_point} ({r.fstype}) during the {r.what} of {r.path}: {free}, "
            f"needed {human(r.needed)}; fix: {fix}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self.report)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OutOfSpace | None:
        try:
            return cls.of(SpaceReport(**data))
        except TypeError:
            return None


def is_space_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in SPACE_ERRNOS


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack += [e for e in (current.__cause__, current.__context__) if e is not None]
        failures = getattr(current, "failures", None)  # DCP's CheckpointException: {rank: (exc, tb)}
        if isinstance(failures, dict):
            for failure in failures.values():
                inner = failure[0] if isinstance(failure, tuple) else failure
                if isinstance(inner, BaseException):
                    stack.append(inner)


def find_out_of_space(exc: BaseException, what: str, path: str | os.PathLike[str]) -> OutOfSpace | None:
    """The OutOfSpace in `exc`'s chain, or one made from an ENOSPC/EDQUOT OSError there; else None."""
    for cause in _causes(exc):
        if isinstance(cause, OutOfSpace):
            return cause
    for cause in _causes(exc):
        if is_space_error(cause):
            assert isinstance(cause, OSError)
            where = cause.filename or path
            return OutOfSpace(what, where, quota=cause.errno == errno.EDQUOT)
    return None


def short_of_room(directory: str | os.PathLike[str], what: str, needed: int | None) -> OutOfSpace | None:
    """OutOfSpace when the filesystem, or the quota, holding `directory` cannot take `needed` more bytes now.

    For a write that failed without an errno (torch's zip writer turns a short write into RuntimeError
    "unexpected pos"). statvfs first; then a reservation of `needed` bytes (posix_fallocate of a probe file,
    removed at once, no data written), which a quota refuses with EDQUOT although statvfs shows room.
    None when there is room, or when neither check can tell (no estimate, no fallocate there).
    """
    from provision.nodeinfo import free_bytes

    if needed is None:
        return None
    try:
        if free_bytes(directory) < needed:
            return OutOfSpace(what, directory, needed)
    except OSError:
        return None
    probe = Path(directory) / f".space-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, needed)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        if is_space_error(exc):
            return OutOfSpace(what, directory, needed, quota=exc.errno == errno.EDQUOT)
    return None


@contextmanager
def guard(path: str | os.PathLike[str], what: str, needed: int | None = None) -> Iterator[None]:
    """Inside the block an ENOSPC/EDQUOT OSError becomes OutOfSpace(what, path, needed)."""
    try:
        yield
    except OutOfSpace:
        raise
    except OSError as exc:
        if not is_space_error(exc):
            raise
        raise OutOfSpace(what, exc.filename or path, needed, quota=exc.errno == errno.EDQUOT) from exc
