"""Package files as the lock names them: fetched (file, http, https), verified, turned into records.

Contract: `fetch_verified` returns a local file whose hashes equal the lock's (md5 and sha256 for conda
packages, sha256 for wheels) or raises `FetchError` naming the file, both hashes and the fix; nothing
unverified is ever returned. py-rattler does not check file:// packages, so every package is checked
here before linking. `conda_records` turns the lock's conda part into py-rattler records read from the
verified archives themselves (the lock's v1 format has no noarch field, and the archive must be the
package the lock names). Downloads land in `<downloads>/<sha256>/<file>` via a partial file + rename.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from provision.lockfile import LockedPackage


class FetchError(RuntimeError):
    """A package file that is missing, unreachable or does not match the lock."""


def hash_file(path: Path) -> tuple[str, str]:
    md5, sha256 = hashlib.md5(), hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            md5.update(chunk)
            sha256.update(chunk)
    return md5.hexdigest(), sha256.hexdigest()


def redirect(url: str, mirror: str | None) -> str:
    """The package's URL on `mirror` (same subdir/filename layout as any conda channel)."""
    if not mirror:
        return url
    parts = url.rstrip("/").split("/")
    mirror = mirror if "://" in mirror else Path(mirror).expanduser().resolve().as_uri()
    return f"{mirror.rstrip('/')}/{parts[-2]}/{parts[-1]}"


def _download(url: str, path: Path, progress: Callable[[str], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".part{os.getpid()}")
    progress(f"download {url}")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise FetchError(
            f"cannot download {url}: {exc}; point --channel (conda packages) or --pip-find-links (wheels) "
            f"at a mirror that has it, or install from an export made where the channels are reachable "
            f"(--export DIR there, --from DIR here)"
        ) from None
    os.replace(partial, path)


def fetch_verified(
    url: str, md5: str | None, sha256: str, downloads: Path, progress: Callable[[str], None]
) -> Path:
    """A local file for `url` whose hashes match the lock (md5 None: a wheel, sha256 only)."""
    parsed = urllib.parse.urlparse(url)
    name = Path(urllib.parse.unquote(parsed.path)).name
    if parsed.scheme == "file":
        path = Path(urllib.request.url2pathname(parsed.path))
        if not path.is_file():
            raise FetchError(f"package file {path} does not exist (from {url}); check --channel/--from")
    elif parsed.scheme in ("http", "https"):
        path = downloads / sha256 / name
        if not path.is_file():
            _download(url, path, progress)
    else:
        raise FetchError(f"unsupported package URL {url} (file, http and https only)")
    got_md5, got_sha256 = hash_file(path)
    if got_sha256 != sha256 or (md5 is not None and got_md5 != md5):
        cached = " (and delete this cached copy)" if parsed.scheme != "file" else ""
        raise FetchError(
            f"package file {path} does not match the lock: md5 {got_md5} (lock {md5 or '-'}), sha256 "
            f"{got_sha256} (lock {sha256}); the file is corrupt or was tampered with: nothing was "
            f"installed. Replace it from a trusted channel{cached}"
        )
    return path


def conda_records(
    packages: list[LockedPackage],
    mirror: str | None,
    downloads: Path,
    progress: Callable[[str], None],
) -> list:
    """py-rattler RepoDataRecords for the lock's conda packages, each read from its verified file
    (all in one event loop: py-rattler has crashed at exit after many loops in one process)."""
    from provision.lock import run_async

    paths = []
    for i, pkg in enumerate(packages, 1):
        assert pkg.sha256 is not None  # lockfile.read_lock refuses conda entries without one
        paths.append(fetch_verified(redirect(pkg.url, mirror), pkg.md5, pkg.sha256, downloads, progress))
        progress(f"verified {i}/{len(packages)} {pkg.file_name}")
    records = run_async(_records(paths))
    for pkg, path, rec in zip(packages, paths, records, strict=True):
        if (rec.name.normalized, str(rec.version)) != (pkg.name, pkg.version) or (
            pkg.build is not None and str(rec.build) != pkg.build
        ):
            raise FetchError(
                f"package file {path} holds {rec.name.normalized} {rec.version} {rec.build}, not "
                f"{pkg.name} {pkg.version} {pkg.build} as the lock says"
            )
        assert pkg.md5 is not None
        rec.md5 = bytes.fromhex(pkg.md5)  # verified above; the archive reader leaves it unset
        rec.channel = pkg.url.rsplit("/", 2)[0]  # conda-meta names the lock's channel, not the mirror
        rec.url = path.resolve().as_uri()
    return records


async def _records(paths: list[Path]) -> list:
    import rattler

    return [await rattler.RepoDataRecord.from_package_archive(p) for p in paths]
