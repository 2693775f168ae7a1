"""LeRobot datasets as LeRobot writes them (codebase v2.0/v2.1: lerobot 0.1-0.3; v3.0: lerobot 0.4, its
layout in trainer/data/formats/lerobot_v3.py; read, checked against huggingface/lerobot, never copied):

    <root>/meta/info.json            codebase_version, fps, chunks_size, data_path / video_path templates,
                                     features: key -> {dtype (video | image | float32 ...), shape, info}
    <root>/meta/episodes.jsonl       {"episode_index", "tasks": [text, ...], "length"} per line
    <root>/meta/tasks.jsonl          {"task_index", "task"} per line
    <root>/meta/episodes_stats.jsonl {"episode_index", "stats": key -> {min, max, mean, std, count}} (v2.1)
    <root>/meta/stats.json           key -> {min, max, mean, std} (v2.0)
    <root>/data/chunk-XXX/episode_XXXXXX.parquet     one row per frame: feature columns, frame_index,
                                                     episode_index, task_index, timestamp
    <root>/videos/chunk-XXX/<camera key>/episode_XXXXXX.mp4   one video per episode and video feature

    ds = load(root)                              # LeRobotInfo; DatasetError naming the file and the fix
    is_lerobot(root)                             # meta/info.json exists (data.format: auto)
    ds.files()                                   # the episodes' sources, in episode order: v2 their
                                                 # parquet files, v3.0 <data file>/episode_XXXXXX
    ds.backing(source)                           # the file a source's rows live in (its fingerprint)
    read_episode(ds, parquet, cameras, action_map)  # frames per camera, mapped actions, task

Cameras are feature keys of dtype video (decoded with trainer/data/formats/video.py) or image (PNG/JPEG bytes
in the parquet, lossless). Actions: data.action_map lists the columns (or slices, `key[i]`, `key[i:j]`) that
fill the used action channels, in order (e.g. ["action"] or ["action[0:6]", "observation.state[6]"]).
Row i holds observation i and the action taken there (leading to observation i + 1), which is
FurnitureBench's convention once the last action is ignored (trainer/data/stream.py's time layout).
v3.0 (many episodes per file): an episode's rows are selected from its data file by episode_index, its
frames from its camera file by the from/to timestamps in meta/episodes/; the same checks apply.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainer.data.formats import lerobot_v3
from trainer.data.formats.furniturebench import DatasetError
from trainer.data.formats.video import VideoError, check_decodable, decode_video

INFO = "meta/info.json"
LAYOUT = "LeRobot {version} (meta/info.json, data/chunk-*/, videos/chunk-*/)"
LAYOUT_V3 = "LeRobot {version} (meta/info.json, meta/episodes/, data/chunk-*/file-*, videos/*/chunk-*/file-*)"
_SLICE = re.compile(r"^(?P<key>[^\[\]]+)(\[(?P<a>\d+)(:(?P<b>\d+))?\])?$")


def is_lerobot(root: Path) -> bool:
    return (Path(root) / INFO).is_file()


def _json_lines(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: unreadable JSON lines ({exc}); rewrite it with lerobot") from exc


@dataclass
class LeRobotInfo:
    root: Path
    version: str
    fps: float
    chunks_size: int
    data_path: str
    video_path: str
    features: dict[str, dict[str, Any]]
    episodes: list[dict[str, Any]]  # episodes.jsonl rows, by episode_index
    tasks: list[str]  # by task_index
    stats: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # key -> stat -> array
    stats_file: str = ""
    _by_index: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)

    @property
    def v3(self) -> bool:
        return self.version.startswith("v3")

    @property
    def layout(self) -> str:
        return (LAYOUT_V3 if self.v3 else LAYOUT).format(version=self.version)

    @property
    def episodes_file(self) -> Path:
        return self.root / (lerobot_v3.EPISODES_DIR if self.v3 else "meta/episodes.jsonl")

    def _rows(self) -> dict[int, dict[str, Any]]:
        """episode_index -> its row, built once (a v3.0 dataset may list thousands)."""
        if len(self._by_index) != len(self.episodes):
            self._by_index = {int(e["episode_index"]): e for e in self.episodes}
        return self._by_index

    def _row(self, episode: int) -> dict[str, Any]:
        if episode not in self._rows():
            raise DatasetError(f"{self.episodes_file}: episode {episode} not listed")
        return self._rows()[episode]

    def parquet(self, episode: int) -> Path:
        """The episode's data file (v3.0: shared with other episodes)."""
        if self.v3:
            row = self._row(episode)
            chunk, file = int(row["data/chunk_index"]), int(row["data/file_index"])
            return self.root / self.data_path.format(chunk_index=chunk, file_index=file)
        chunk = episode // self.chunks_size
        return self.root / self.data_path.format(episode_chunk=chunk, episode_index=episode)

    def video(self, episode: int, camera: str) -> Path:
        if self.v3:
            row = self._row(episode)
            chunk, file = row.get(f"videos/{camera}/chunk_index"), row.get(f"videos/{camera}/file_index")
            if chunk is None or file is None:
                raise DatasetError(
                    f"{self.episodes_file}: episode {episode} has no videos/{camera}/chunk_index; camera "
                    f"{camera} has no video for it: re-record it or drop the camera from data.cameras"
                )
            return self.root / self.video_path.format(
                video_key=camera, chunk_index=int(chunk), file_index=int(file)
            )
        chunk = episode // self.chunks_size
        return self.root / self.video_path.format(
            episode_chunk=chunk, video_key=camera, episode_index=episode
        )

    def files(self) -> list[Path]:
        if self.v3:
            return [lerobot_v3.episode_source(self.parquet(int(e["episode_index"])), int(e["episode_index"]))
                    for e in self.episodes]  # fmt: skip
        return [self.parquet(int(e["episode_index"])) for e in self.episodes]

    def backing(self, source: Path) -> Path:
        return source.parent if self.v3 and lerobot_v3.source_episode(source) is not None else source

    def episode_of(self, source: Path) -> dict[str, Any]:
        index = lerobot_v3.source_episode(source) if self.v3 else None
        if index in self._rows() and lerobot_v3.episode_source(self.parquet(index), index) == source:
            return self._rows()[index]  # v3.0's usual case, without a scan
        for e in self.episodes:
            index = int(e["episode_index"])
            if (
                lerobot_v3.episode_source(self.parquet(index), index) if self.v3 else self.parquet(index)
            ) == source:
                return e
        raise DatasetError(f"{source}: not an episode listed in {self.episodes_file}")

    def task_of(self, episode: dict[str, Any]) -> str:
        tasks = episode.get("tasks") or []
        if not tasks:
            raise DatasetError(
                f"{self.episodes_file}: episode {episode.get('episode_index')} has no task; "
                "record the episode with a task (LeRobotDataset.add_frame(..., task=...))"
            )
        return str(tasks[0])


def load(root: Path) -> LeRobotInfo:
    """Read and check meta/ (not the episodes)."""
    root = Path(root)
    path = root / INFO
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: unreadable ({exc}); is {root} a LeRobot dataset root?") from exc
    version = str(info.get("codebase_version", ""))
    if not (version.startswith("v2") or version == "v3.0"):
        raise DatasetError(
            f"{path}: codebase_version {version!r}: only LeRobot v2.0/v2.1 and v3.0 datasets are read "
            "(lerobot 0.1-0.4 write them)"
        )
    for key in ("fps", "features", "data_path"):
        if key not in info:
            raise DatasetError(f"{path}: {key}: missing; the file is not what lerobot writes")
    if version.startswith("v3"):
        episodes, tasks = lerobot_v3.read_meta(root)
    else:
        episodes = sorted(_json_lines(root / "meta/episodes.jsonl"), key=lambda e: int(e["episode_index"]))
        task_rows = _json_lines(root / "meta/tasks.jsonl")
        tasks = [str(r["task"]) for r in sorted(task_rows, key=lambda r: int(r["task_index"]))]
    ds = LeRobotInfo(
        root=root, version=version, fps=float(info["fps"]), chunks_size=int(info.get("chunks_size", 1000)),
        data_path=str(info["data_path"]), video_path=str(info.get("video_path") or ""),
        features=dict(info["features"]), episodes=episodes, tasks=tasks,
    )  # fmt: skip
    ds.stats, ds.stats_file = _stats(root)
    return ds


def _stats(root: Path) -> tuple[dict[str, dict[str, np.ndarray]], str]:
    """The dataset's own statistics: meta/stats.json (v2.0), else aggregated episodes_stats.jsonl (v2.1)."""
    whole = root / "meta/stats.json"
    if whole.is_file():
        try:
            raw = json.loads(whole.read_text())
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{whole}: unreadable ({exc})") from exc
        return {k: {s: np.asarray(v, np.float64) for s, v in d.items()} for k, d in raw.items()}, str(whole)
    per = root / "meta/episodes_stats.jsonl"
    if not per.is_file():
        return {}, ""
    out: dict[str, dict[str, np.ndarray]] = {}
    rows = [r["stats"] for r in _json_lines(per)]
    for key in rows[0] if rows else []:
        parts = [r[key] for r in rows if key in r]
        n = np.array([float(np.asarray(p["count"]).reshape(-1)[0]) for p in parts])
        mean = np.stack([np.asarray(p["mean"], np.float64) for p in parts])
        var = np.stack([np.asarray(p["std"], np.float64) ** 2 for p in parts])
        w = (n / n.sum()).reshape(-1, *[1] * (mean.ndim - 1))
        total_mean = (w * mean).sum(0)
        total_var = (w * (var + mean**2)).sum(0) - total_mean**2
        out[key] = {
            "mean": total_mean,
            "std": np.sqrt(np.maximum(total_var, 0.0)),
            "min": np.min(np.stack([np.asarray(p["min"], np.float64) for p in parts]), 0),
            "max": np.max(np.stack([np.asarray(p["max"], np.float64) for p in parts]), 0),
        }
        for q in ("q01", "q99"):  # later lerobot releases record quantiles; aggregated by weight
            if all(q in p for p in parts):
                out[key][q] = (w * np.stack([np.asarray(p[q], np.float64) for p in parts])).sum(0)
    return out, str(per)


def check_cameras(ds: LeRobotInfo, cameras: list[str]) -> None:
    """Each of data.cameras is a video or image feature of info.json, and its codec is decodable here."""
    visual = [k for k, f in ds.features.items() if f.get("dtype") in ("video", "image")]
    for cam in cameras:
        feature = ds.features.get(cam)
        if feature is None or feature.get("dtype") not in ("video", "image"):
            raise DatasetError(
                f"{ds.root / INFO}: features: camera {cam!r} is not a video or image feature; "
                f"set data.cameras to some of {', '.join(visual) or '(none)'}"
            )
        if feature["dtype"] == "video":
            try:
                check_decodable(ds.root / INFO, str((feature.get("info") or {}).get("video.codec", "")))
            except VideoError as exc:
                raise DatasetError(f"{exc} (camera {cam})") from exc


def parse_action_map(ds: LeRobotInfo, entries: list[str]) -> list[tuple[str, int]]:
    """data.action_map -> [(column, index)] per action channel, checked against info.json's shapes."""
    out: list[tuple[str, int]] = []
    for entry in entries:
        m = _SLICE.match(entry.strip())
        if not m:
            raise DatasetError(f"data.action_map: {entry!r}: write `key`, `key[i]` or `key[i:j]`")
        key = m["key"]
        feature = ds.features.get(key)
        if feature is None or feature.get("dtype") in ("video", "image", "string"):
            numeric = [
                k for k, f in ds.features.items() if f.get("dtype") not in ("video", "image", "string")
            ]
            raise DatasetError(
                f"{ds.root / INFO}: features: {key!r} (data.action_map) is not a numeric feature; "
                f"use some of {', '.join(numeric)}"
            )
        width = int(np.prod(feature.get("shape") or [1]))
        a = int(m["a"]) if m["a"] is not None else 0
        b = int(m["b"]) if m["b"] is not None else (a + 1 if m["a"] is not None else width)
        if not 0 <= a < b <= width:
            raise DatasetError(f"data.action_map: {entry!r}: {key} has {width} values ({ds.root / INFO})")
        out.extend((key, i) for i in range(a, b))
    return out


def mapped_stats(ds: LeRobotInfo, channels: list[tuple[str, int]]) -> dict[str, list[float]]:
    """The dataset's statistics of the mapped action channels: stat -> one value per channel."""
    have = set.intersection(*(set(ds.stats.get(k, {})) for k, _ in channels)) if channels else set()
    have.discard("count")  # one value per feature (lerobot 0.4's stats.json), not per channel
    if not ds.stats or not {"mean", "std"} <= have:
        raise DatasetError(
            f"{ds.root / 'meta'}: no statistics of {sorted({k for k, _ in channels})} (meta/stats.json or "
            "meta/episodes_stats.jsonl); set data.normalize=fit to compute them from the episodes"
        )
    return {s: [float(np.asarray(ds.stats[k][s]).reshape(-1)[i]) for k, i in channels] for s in sorted(have)}


@dataclass
class LeRobotEpisode:
    path: Path
    index: int
    task: str
    images: dict[str, np.ndarray]  # camera -> (T, H, W, 3) uint8
    actions: np.ndarray  # (T, K) float32, the mapped channels
    videos: dict[str, Path]  # camera -> mp4 (video cameras only)


def _column(table, path: Path, key: str, info: Path):
    if key not in table.column_names:
        raise DatasetError(
            f"{path}: column {key!r} missing (info.json lists it: {info}); rewrite the episode with lerobot "
            "or remove the key from data.cameras / data.action_map"
        )
    return table.column(key)


def _decode_images(column, path: Path, key: str) -> np.ndarray:
    from PIL import Image

    frames = []
    for i, cell in enumerate(column.to_pylist()):
        data = cell.get("bytes") if isinstance(cell, dict) else None
        if not data:
            raise DatasetError(f"{path}: {key}: row {i} holds no image bytes")
        frames.append(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    return np.stack(frames)


def read_episode(
    ds: LeRobotInfo, parquet: Path, cameras: list[str], channels: list[tuple[str, int]]
) -> LeRobotEpisode:
    """One episode's frames and mapped actions, every length checked against the parquet's rows."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DatasetError(
            "pyarrow is not installed in this environment (LeRobot parquet files need it): "
            "`pip install pyarrow==21.0.0` (pyproject.toml declares it; docs/data.md: the provisioned env)"
        ) from exc
    episode = ds.episode_of(parquet)
    index = int(episode["episode_index"])
    parquet = ds.backing(parquet)
    if ds.v3:
        table = lerobot_v3.episode_rows(parquet, episode)
    elif not parquet.is_file():
        raise DatasetError(
            f"{parquet}: episode {index}'s parquet file missing (listed in meta/episodes.jsonl)"
        )
    else:
        table = pq.read_table(parquet)
    rows, info = table.num_rows, ds.root / INFO
    images: dict[str, np.ndarray] = {}
    videos: dict[str, Path] = {}
    for cam in cameras:
        if ds.features[cam]["dtype"] == "image":
            images[cam] = _decode_images(_column(table, parquet, cam, info), parquet, cam)
            continue
        videos[cam] = ds.video(index, cam)
        if not videos[cam].is_file():
            raise DatasetError(
                f"{videos[cam]}: video of episode {index}, camera {cam} missing; restore it or re-encode "
                "the episode (lerobot's encode_video_frames)"
            )
        if ds.v3:
            images[cam] = lerobot_v3.episode_frames(ds, episode, cam, videos[cam])
            continue
        try:
            images[cam] = decode_video(videos[cam])
        except VideoError as exc:
            raise DatasetError(str(exc)) from exc
        if images[cam].shape[0] != rows:
            raise DatasetError(
                f"{videos[cam]}: {images[cam].shape[0]} frames but {parquet.name} has {rows} rows; "
                "the video and the parquet disagree: re-encode the video from the episode's frames"
            )
    columns: dict[str, np.ndarray] = {}
    for key, _ in channels:
        if key not in columns:
            values = _column(table, parquet, key, info).to_pylist()
            columns[key] = np.asarray(values, np.float32).reshape(rows, -1)
    actions = np.stack([columns[k][:, i] for k, i in channels], axis=1) if channels else np.zeros((rows, 0))
    return LeRobotEpisode(parquet, index, ds.task_of(episode), images, actions.astype(np.float32), videos)
