"""LeRobot episodes into the latent cache (trainer/data/cache/store.py): the same entries, manifest and
guarantees as FurnitureBench data, plus what a LeRobot dataset adds.

    spec_source(cfg)                       # what the latents/actions depend on beyond CacheSpec's fields
    encoder = entry_encoder(cfg, ds, video)   # cache.prepare_entries' `encode` for a LeRobot dataset
    write_task_text(directory, text, ds)   # text.npz with one embedding per task (the prompt per episode)
    manifest_extra(cfg, ds)                # the manifest's "lerobot" record: tasks, fps, mapped statistics

An entry holds latents__<camera> (the rows 0, a, 2a, ... encoded, a = data.actions_per_video_frame; each
camera at its data.layout size: trainer/data/encoding/rows.py), `actions` (T, K) = the
data.action_map channels of every row, as recorded (row i: the action taken at observation i; absolute:
data.relative_poses is applied by the stream, trainer/data/stream.py), `task_index` and, in its meta,
the fingerprints of the episode's videos (a changed video makes the cache stale, as a changed parquet
does). With data.upstream_latents=read the latents come from the reference's <root>/latents/ files
(trainer/data/formats/upstream.py), not from the encoder; with write they are also written there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from trainer.data.cache.store import _npz_bytes, _write_bytes, fingerprint, source_file
from trainer.data.encoding.rows import camera_encoders, video_rows
from trainer.data.formats import upstream
from trainer.data.formats.furniturebench import DatasetError
from trainer.data.formats.lerobot import LeRobotInfo, mapped_stats, parse_action_map, read_episode

STORAGE_DTYPE = np.float16


def spec_source(cfg) -> str:
    d = cfg.data
    return json.dumps(
        {"format": "lerobot", "action_map": list(d.action_map), "upstream_latents": d.upstream_latents},
        sort_keys=True,
    )


def entry_encoder(cfg, ds: LeRobotInfo, video, text) -> Callable[..., dict[str, Any]]:
    """encode(source, entry, spec, video, on_frames) -> meta, for cache.prepare_entries."""
    cameras = list(cfg.data.cameras)
    channels = parse_action_map(ds, list(cfg.data.action_map))
    mode = cfg.data.upstream_latents
    seen: dict[tuple[str, int, int], dict[str, Any]] = {}  # v3.0: many episodes share a file; hash it once

    def file_fingerprint(path: Path) -> dict[str, Any]:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in seen:
            seen[key] = fingerprint(path)
        return seen[key]

    def encode(source: Path, entry: Path, spec, _video, on_frames=None) -> dict[str, Any]:
        episode = read_episode(ds, source, cameras if mode != "read" else [], channels)
        if mode == "read":
            latents = upstream.read_episode_latents(ds, episode.index, cameras, spec)
        else:
            latents = {}
            encoders = camera_encoders(spec.cameras, spec.view_sizes(), video)
            for cam in cameras:
                frames = video_rows(episode.images[cam], spec)
                latents[cam] = encoders[cam].encode(frames)
                if on_frames is not None:
                    on_frames(int(frames.shape[0]))
        arrays: dict[str, np.ndarray] = {f"latents__{c}": latents[c].astype(STORAGE_DTYPE) for c in cameras}
        if episode.task not in ds.tasks:
            raise DatasetError(
                f"{ds.root / ('meta/tasks.parquet' if ds.v3 else 'meta/tasks.jsonl')}: episode "
                f"{episode.index}: task {episode.task!r} not listed; {ds.episodes_file} and the task table "
                "disagree: rewrite them with lerobot"
            )
        task_index = ds.tasks.index(episode.task)
        arrays.update(actions=episode.actions, task_index=np.array(task_index))
        meta: dict[str, Any] = {
            "source": file_fingerprint(source_file(source)),
            "spec": spec.digest(),
            "notes": [],
            "status": "used",
            "latent_frames": min(int(x.shape[0]) for x in latents.values()),
            "actions": int(episode.actions.shape[0]),
            "format": "lerobot",
            "episode_index": episode.index,
            "task": episode.task,
            "task_index": task_index,
            "videos": {
                p.relative_to(ds.root).as_posix(): file_fingerprint(p) for p in episode.videos.values()
            },
        }
        if mode == "read":
            meta["notes"] = ["latents read from the reference's latents/ layout (not encoded here)"]
        arrays["meta"] = np.array(json.dumps(meta))
        _write_bytes(entry, _npz_bytes(arrays))
        if mode == "write":
            upstream.write_episode_latents(ds, episode.index, latents, text.embed(episode.task)[0], spec)
        return meta

    return encode


def write_task_text(directory: Path, text, ds: LeRobotInfo) -> None:
    """text.npz: the first task as prompt_emb (what a single-prompt reader sees), every task's embedding
    as task_emb (K, L, D) / task_mask (K, L), and the empty prompt for dropout."""
    embs, masks = zip(*(text.embed(task) for task in ds.tasks), strict=True)
    empty, empty_mask = text.embed("")
    arrays = dict(
        prompt_emb=embs[0], prompt_mask=masks[0], empty_emb=empty, empty_mask=empty_mask,
        task_emb=np.stack(embs), task_mask=np.stack(masks),
    )  # fmt: skip
    _write_bytes(directory / "text.npz", _npz_bytes(arrays))


def manifest_extra(cfg, ds: LeRobotInfo) -> dict[str, Any]:
    channels = parse_action_map(ds, list(cfg.data.action_map))
    record: dict[str, Any] = {
        "version": ds.version,
        "fps": ds.fps,
        "tasks": ds.tasks,
        "channels": [f"{k}[{i}]" for k, i in channels],
        "stats_file": ds.stats_file,
        "stats": mapped_stats(ds, channels) if ds.stats else None,
    }
    return {"lerobot": record}
