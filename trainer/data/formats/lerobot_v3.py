"""LeRobot's v3.0 layout (lerobot >= 0.4; read against huggingface/lerobot 0.4.4's lerobot_dataset.py,
utils.py and video_utils.py, never copied): many episodes per file.

    <root>/meta/info.json    codebase_version v3.0, fps, chunks_size, features,
                             data_path  "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
                             video_path "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    <root>/meta/episodes/chunk-XXX/file-XXX.parquet   one row per episode: episode_index, tasks, length,
                             data/chunk_index, data/file_index, videos/<camera>/chunk_index, file_index,
                             from_timestamp, to_timestamp (seconds into that camera's file), stats/...
    <root>/meta/tasks.parquet   task_index, the task text as the pandas index (or a `task` column)
    <root>/meta/stats.json      key -> {min, max, mean, std, count, q01, ... q99}
    <root>/data/chunk-XXX/file-XXX.parquet        the rows of consecutive episodes (episode_index column)
    <root>/videos/<camera>/chunk-XXX/file-XXX.mp4  consecutive episodes' videos, concatenated

    episodes, tasks = read_meta(root)            # episode rows in episode order; task texts by task_index
    source = episode_source(data_file, index)    # <data file>/episode_XXXXXX: the cache's per-episode source
    index = source_episode(source)               # None for a path that is not one
    table = episode_rows(parquet, episode)       # the episode's rows of its data file, checked against length
    frames = episode_frames(ds, episode, camera, video)  # its segment, checked against from/to timestamps

An episode's frames are those whose timestamps fall in [from_timestamp, to_timestamp) of its camera's file
(half a frame of tolerance each side); their count must be the episode's length and (to - from) * fps.
Every problem is a DatasetError naming the file, the episode and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from trainer.data.formats.furniturebench import DatasetError
from trainer.data.formats.video import VideoError, decode_segment

EPISODES_DIR = "meta/episodes"
_SOURCE = re.compile(r"^episode_(\d{6,})$")


def _read_parquet(path: Path, what: str, **kwargs):
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DatasetError(f"{path}: {what} missing; restore it (lerobot writes it) or re-record the dataset")
    try:
        return pq.read_table(path, **kwargs)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise DatasetError(
            f"{path}: unreadable parquet ({exc}); a dataset lerobot did not finalize "
            "(LeRobotDataset.finalize()) lacks the footers: re-record or restore it"
        ) from exc


def _schema(path: Path, what: str) -> list[str]:
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DatasetError(f"{path}: {what} missing; restore it (lerobot writes it) or re-record the dataset")
    try:
        return list(pq.read_schema(path).names)
    except (OSError, ValueError) as exc:
        raise DatasetError(
            f"{path}: unreadable parquet ({exc}); restore it or re-record the dataset"
        ) from exc


def read_meta(root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """meta/episodes/*/*.parquet rows (stats/ columns left out) by episode_index; tasks by task_index."""
    files = sorted((root / EPISODES_DIR).glob("chunk-*/file-*.parquet"))
    if not files:
        raise DatasetError(
            f"{root / EPISODES_DIR}: no chunk-*/file-*.parquet; a v3.0 dataset lists its episodes there "
            "(written by LeRobotDataset.save_episode / finalize)"
        )
    episodes: list[dict[str, Any]] = []
    for path in files:
        table = _read_parquet(path, "episodes metadata")
        for key in ("episode_index", "tasks", "length", "data/chunk_index", "data/file_index"):
            if key not in table.column_names:
                raise DatasetError(f"{path}: column {key!r} missing; the file is not what lerobot 0.4 writes")
        keep = [c for c in table.column_names if not c.startswith("stats/")]
        episodes.extend(table.select(keep).to_pylist())
    episodes.sort(key=lambda e: int(e["episode_index"]))
    task_table = _read_parquet(root / "meta/tasks.parquet", "task table")
    text = "task" if "task" in task_table.column_names else "__index_level_0__"
    if text not in task_table.column_names or "task_index" not in task_table.column_names:
        raise DatasetError(f"{root / 'meta/tasks.parquet'}: no task text or task_index column")
    rows = sorted(task_table.select([text, "task_index"]).to_pylist(), key=lambda r: int(r["task_index"]))
    return episodes, [str(r[text]) for r in rows]


def episode_source(data_file: Path, index: int) -> Path:
    return data_file / f"episode_{index:06d}"


def source_episode(source: Path) -> int | None:
    m = _SOURCE.match(source.name)
    return int(m[1]) if m and source.parent.suffix == ".parquet" else None


def episode_rows(parquet: Path, episode: dict[str, Any]):
    """The episode's rows of its data file (by the episode_index column), as many as its length."""
    index, length = int(episode["episode_index"]), int(episode["length"])
    if "episode_index" not in _schema(parquet, f"data file of episode {index} (meta/episodes lists it)"):
        raise DatasetError(f"{parquet}: column 'episode_index' missing; rewrite the dataset with lerobot")
    table = _read_parquet(parquet, "data file", filters=[("episode_index", "=", index)])
    if table.num_rows != length:
        raise DatasetError(
            f"{parquet}: {table.num_rows} rows of episode {index} but meta/episodes says length {length}; "
            "the data file and the episodes metadata disagree: restore both from the same recording"
        )
    if "frame_index" in table.column_names:
        order = np.argsort(np.asarray(table.column("frame_index").to_pylist()), kind="stable")
        table = table.take(order)
    return table


def segment(ds, episode: dict[str, Any], camera: str) -> tuple[float, float]:
    """(from, to) seconds of the episode in its camera file, checked against its length and fps."""
    index, length = int(episode["episode_index"]), int(episode["length"])
    keys = [f"videos/{camera}/{k}" for k in ("from_timestamp", "to_timestamp")]
    if any(episode.get(k) is None for k in keys):
        raise DatasetError(
            f"{ds.root / EPISODES_DIR}: episode {index}: no {keys[0]} / to_timestamp; camera {camera} has no "
            "video for it: re-record the episode or drop the camera from data.cameras"
        )
    start, end = float(episode[keys[0]]), float(episode[keys[1]])
    if abs((end - start) * ds.fps - length) > 0.5:
        raise DatasetError(
            f"{ds.root / EPISODES_DIR}: episode {index}, camera {camera}: from_timestamp {start} to "
            f"to_timestamp {end} spans {(end - start) * ds.fps:.2f} frames at {ds.fps:g} fps but the episode "
            f"has {length}: the video and the parquet disagree; restore the metadata lerobot wrote"
        )
    return start, end


def episode_frames(ds, episode: dict[str, Any], camera: str, video: Path) -> np.ndarray:
    """The episode's frames of `video` (T, H, W, 3) uint8, T checked against the episode's length."""
    start, end = segment(ds, episode, camera)
    index, length = int(episode["episode_index"]), int(episode["length"])
    half = 0.5 / ds.fps
    try:
        frames = decode_segment(video, start - half, end - half)
    except VideoError as exc:
        raise DatasetError(str(exc)) from exc
    if frames.shape[0] != length:
        raise DatasetError(
            f"{video}: {frames.shape[0]} frames between {start} s and {end} s (episode {index}, camera "
            f"{camera}) but the episode has {length} rows; the video and the parquet disagree: re-encode "
            "the camera's video file from the episodes' frames"
        )
    return frames
