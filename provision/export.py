"""Air-gapped installs: `bin/provision NAME --export DIR` and `bin/provision NAME --from DIR`.

Contract of an export directory (written by `export`, read by `from_dir`):

    DIR/channel/<subdir>/<file>     exactly the lock's conda packages for the platform, each verified
                                    (md5 + sha256) against the lock, indexed by py-rattler's indexer
    DIR/wheels/<file>.whl           exactly the lock's pip part, each verified (sha256)
    DIR/conda-lock.yml, environment.yml (when at hand), virtual-packages.yml (when at hand)
    DIR/lingbot-export.json         what was exported: lock sha256, platform, counts; written LAST
    DIR/README.md                   how to use it

The export is built in `DIR.partial-<pid>` and renamed to DIR at the end, so a DIR that exists is
complete. `--from DIR` is `--channel DIR/channel --pip-find-links DIR/wheels` after checking that
DIR was exported from the same lock (same sha256) and platform: the install still verifies every
file against the lock, so a tampered export is refused file by file.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.atomic import write_atomic, write_json_atomic
from provision.fetch import FetchError, fetch_verified
from provision.lockfile import LockFile

MARKER = "lingbot-export.json"
FORMAT = 1


class ExportError(RuntimeError):
    """An export that cannot be written or used; the message names the directory and the fix."""


@dataclass(frozen=True)
class ExportSources:
    channel: str  # a directory usable as --channel
    find_links: str | None  # a directory usable as --pip-find-links (None: the lock has no pip part)


def _readme(name: str, lock: LockFile, platform: str, conda: int, pip: int) -> str:
    return f"""# Offline install of `{name}` ({platform})

Exported by `bin/provision {name} --export DIR` on {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
from `{lock.path.name}` (sha256 {lock.sha256}).

- `channel/`: the {conda} locked conda packages, verified against the lock and indexed (a local conda channel)
- `wheels/`: the {pip} locked wheels of the pip part, verified against the lock

On the machine that reaches nothing, in a checkout of the same commit (the same lock):

    bin/provision {name} --from /path/to/this/dir

which is `bin/provision {name} --channel DIR/channel --pip-find-links DIR/wheels` after checking that
this directory was exported from the same lock. Every file is verified again before it is linked.
Then check the env on a worker: `bin/envcheck --env {name} --worker`.
"""


def _index(channel: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from rattler.index import index_fs

    (channel / "noarch").mkdir(parents=True, exist_ok=True)  # a channel always has noarch/
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, index_fs(channel, force=True, write_shards=False)).result()


def export(
    lock: LockFile,
    platform: str,
    name: str,
    out: Path,
    *,
    extra_files: list[Path],
    mirror: str | None,
    downloads: Path,
    progress: Callable[[str], None],
    find_links: str | None = None,
) -> dict:
    """Write the export directory `out` (see module doc); refuses an `out` that exists."""
    from provision.fetch import redirect

    out = Path(out).absolute()
    if out.exists():
        raise ExportError(f"{out} exists; choose a new directory (or remove it: rm -rf {out})")
    staging = out.with_name(f"{out.name}.partial-{os.getpid()}")
    _remove_dead_partials(out)
    shutil.rmtree(staging, ignore_errors=True)
    conda = lock.for_platform(platform, "conda")
    pip = lock.for_platform(platform, "pip")
    if not conda:
        raise ExportError(f"{lock.path} has no conda packages for {platform}; nothing to export")
    try:
        for pkg in conda:
            assert pkg.sha256 is not None
            src = fetch_verified(redirect(pkg.url, mirror), pkg.md5, pkg.sha256, downloads, progress)
            _place(src, staging / "channel" / pkg.subdir / pkg.file_name)
        for pkg in pip:
            assert pkg.sha256 is not None
            url = (Path(find_links).absolute() / pkg.file_name).as_uri() if find_links else pkg.url
            src = fetch_verified(url, None, pkg.sha256, downloads, progress)  # --pip-find-links: the mirror
            _place(src, staging / "wheels" / pkg.file_name)
        progress(f"indexing {staging / 'channel'} (py-rattler)")
        _index(staging / "channel")
        for f in [lock.path, *extra_files]:
            shutil.copy2(f, staging / f.name)
        write_atomic(staging / "README.md", _readme(name, lock, platform, len(conda), len(pip)))
        summary = {
            "format": FORMAT,
            "lock_sha256": lock.sha256,
            "lockfile": lock.path.name,
            "platform": platform,
            "env": name,
            "conda": len(conda),
            "pip": len(pip),
        }
        write_json_atomic(staging / MARKER, summary)
        os.replace(staging, out)
    except FetchError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise ExportError(f"export to {out} stopped, nothing written: {exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {**summary, "export": str(out)}


def _remove_dead_partials(out: Path) -> None:
    """A killed export's `DIR.partial-<pid>` (kill -9, a node that went down): removed when its process is
    gone. A live one is another export's, left alone."""
    for partial in out.parent.glob(f"{out.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(partial, ignore_errors=True)
        except PermissionError:  # another user's live process
            pass


def _place(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def from_dir(directory: Path, lock: LockFile, platform: str, name: str = "lingbot-b200") -> ExportSources:
    """The channel and wheel folder of an export made from `lock` for `platform`, else ExportError."""
    directory = Path(directory).absolute()
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError) as exc:
        raise ExportError(
            f"{directory} is not a complete export ({MARKER}: {exc}); make one with "
            f"`bin/provision {name} --export {directory}` on a machine that reaches the channels"
        ) from None
    if marker.get("lock_sha256") != lock.sha256 or marker.get("platform") != platform:
        raise ExportError(
            f"{directory} was exported from a lock with sha256 {str(marker.get('lock_sha256'))[:12]}... for "
            f"{marker.get('platform')}; {lock.path} has {lock.sha256[:12]}... for {platform}: export again "
            f"from this lock, or install with --lockfile {directory / str(marker.get('lockfile'))}"
        )
    wheels = directory / "wheels"
    return ExportSources(str(directory / "channel"), str(wheels) if wheels.is_dir() else None)
