"""The latent cache's manifest: written last, by rank 0, it is the mark of a complete cache; checked against
the sources and the spec before a cache is used (store.py owns the entries it lists).

    manifest = write_manifest(base, discovery, directory, spec, extra, split=(val, frames))
    manifest = check_manifest(discovery, directory, spec)   # StaleCache naming what differs

A stale cache (a source file added, removed, resized or changed by checksum; a LeRobot video changed; other
settings than the spec's) is refused, never read.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainer.data.cache.store import (
    MANIFEST,
    CacheSpec,
    _write_bytes,
    entry_path,
    fingerprint,
    read_meta,
    source_file,
)
from trainer.data.formats.discovery import Discovery
from trainer.data.formats.furniturebench import DatasetError
from trainer.data.split import RULE, SplitError, split_record


def manifest_split(episodes: list[dict], val: float, frames: int) -> dict:
    """The held-out split (trainer/data/split.py) of the episodes a run with data.frames=`frames` uses,
    as the manifest records it: it is not part of the spec (the cache serves every split), so a
    dataset too small for it is recorded as an error here and raised by the trainer."""
    names = [e["file"] for e in episodes if e.get("status") == "used" and e.get("latent_frames", 0) >= frames]
    try:
        return split_record(names, val)
    except SplitError as exc:
        return {"val_episodes": val, "rule": RULE, "error": str(exc)}


def write_manifest(
    base: Path,
    discovery: Discovery,
    directory: Path,
    spec: CacheSpec,
    extra: dict,
    split: tuple[float, int] | None = None,
) -> dict:
    """Collect every entry's meta into manifest.json (the completion marker). Missing entries: error.
    split = (data.val_episodes, data.frames): also record the held-out split under "split"."""
    episodes = []
    for source in discovery.files:
        entry = entry_path(directory, base, source)
        meta = read_meta(entry)
        if meta is None or meta.get("spec") != spec.digest():
            raise DatasetError(
                f"{entry}: cache entry missing or unreadable after preparation (source {source})"
            )
        episodes.append({"file": source.relative_to(base).as_posix(), "entry": entry.name, **meta})
    manifest = {
        "spec": spec.to_json(),
        "spec_hash": spec.digest(),
        "episodes": episodes,
        "no_pkl": [[str(p), r] for p, r in discovery.skipped],
        **extra,
    }
    if split is not None:
        manifest["split"] = manifest_split(episodes, *split)
    _write_bytes(directory / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    return manifest


def _check_videos(root: Path, episodes: list[dict]) -> list[str]:
    """Changed or missing videos of cached LeRobot episodes (their meta's "videos" fingerprints)."""
    problems = []
    for ep in episodes:
        for rel, fp in (ep.get("videos") or {}).items():
            path = root / rel
            if not path.is_file():
                problems.append(f"{rel}: video gone since it was cached")
            elif path.stat().st_size != fp["size"]:
                problems.append(f"{rel}: size {path.stat().st_size} != {fp['size']} when cached")
            elif path.stat().st_mtime_ns != fp["mtime_ns"] and fingerprint(path)["sha256"] != fp["sha256"]:
                problems.append(f"{rel}: content changed (sha256 differs) since it was cached")
    return problems


class StaleCache(DatasetError):
    """A cache that does not match its sources or its spec; the message names what differs."""


def check_manifest(now: Discovery, directory: Path, spec: CacheSpec) -> dict:
    """The manifest when the cache is complete and current; StaleCache naming what differs otherwise."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StaleCache(
            f"{path}: unreadable manifest ({exc}); remove {directory} and prepare again"
        ) from exc
    want = spec.to_json()
    have = manifest.get("spec", {})
    differs = [f"{k}: cache {have.get(k)!r} vs config {want[k]!r}" for k in want if have.get(k) != want[k]]
    if differs:
        raise StaleCache(f"{path}: the cache was made with other settings ({'; '.join(differs)})")
    known = {e["file"]: e for e in manifest["episodes"]}
    current = {p.relative_to(now.root).as_posix(): p for p in now.files}
    problems = []
    added = sorted(set(current) - set(known))
    removed = sorted(set(known) - set(current))
    if added:
        problems.append(f"{len(added)} episode file(s) not in the cache: {', '.join(added[:3])}")
    if removed:
        problems.append(f"{len(removed)} cached episode file(s) gone: {', '.join(removed[:3])}")
    for rel, source in current.items():
        entry = known.get(rel)
        if entry is None:
            continue
        st, fp = source_file(source).stat(), entry["source"]
        if st.st_size != fp["size"]:
            problems.append(f"{rel}: size {st.st_size} != {fp['size']} when cached")
        elif st.st_mtime_ns != fp["mtime_ns"] and fingerprint(source_file(source))["sha256"] != fp["sha256"]:
            problems.append(f"{rel}: content changed (sha256 differs) since it was cached")
        if len(problems) >= 5:
            break
    problems += _check_videos(now.root, manifest["episodes"])[:5]
    if problems:
        raise StaleCache(
            f"{directory}: stale latent cache: {'; '.join(problems)}; rebuild it from the data as it is now: "
            f"rm -rf {directory} (the next run prepares it again)"
        )
    return manifest


def read_entry(entry: Path, names: list[str] | None) -> dict:
    """The arrays `names` (None: all) of one cache file a checked manifest lists; StaleCache naming it (and
    the fix) when it cannot be read (a disk fault, a truncated copy): a BadZipFile traceback before."""
    import zipfile

    import numpy as np

    try:
        with np.load(entry, allow_pickle=False) as z:
            return {name: z[name] for name in (z.files if names is None else names)}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        cache = entry.parent
        while not (cache / MANIFEST).is_file() and cache != cache.parent:  # text.npz, episodes/<...>.npz
            cache = cache.parent
        raise StaleCache(
            f"{entry}: damaged cache file ({type(exc).__name__}: {exc}); rebuild the latent cache from the "
            f"data: rm -rf {cache} (the next run prepares it again)"
        ) from None
