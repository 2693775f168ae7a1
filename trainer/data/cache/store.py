"""The latent cache: every used episode encoded once, next to the data, with a manifest that proves it.

Layout (under the discovered episode folder, so it travels with the data):
    <base>/.latents/<encoder>-<spec hash>/
        manifest.json                 written LAST (atomically) by rank 0: the cache is complete; also
                                      records the held-out split of the preparing config ("split":
                                      trainer/data/split.py; not part of the spec, every split shares it)
        text.npz                      prompt_emb (L, D), prompt_mask (L,), empty_emb, empty_mask
        episodes/<relpath>.npz        one per source file: latents__<camera> (L, C, h, w) float16 (its
                                      own size: views.view_sizes), actions (T, 8) (every row), rewards,
                                      skills, robot state / parts_poses / real-robot extras (kept),
                                      and `meta` (JSON: source fingerprint, spec hash, status
                                      used/skipped + reason, reader notes)

Rates: an episode's rows are its actions; its video frames are rows 0, a, 2a, ... (a =
data.actions_per_video_frame, upstream's frame_stride): only those rows' images are encoded (video_rows),
L = 1 + (ceil(T / a) - 1) // t latent frames (t: the encoder's temporal factor); every row's action is stored.
Each camera is encoded at its data.layout size (trainer/data/encoding/rows.py); the stream composes them.

The spec (CacheSpec) is everything the latents depend on: encoder name + config hash, text encoder name +
config hash, prompt, cameras, resolution / latent grid, temporal factor, task, include_failed, and, only
when not the default (so the default's directory and digest are those of caches made before them), the
video stride (actions_per_video_frame != 1), the layout (tshape) and a non-square view's latent_width. A
different spec is a different directory, so configs never overwrite each other's caches. Each source file is
fingerprinted by size + mtime_ns + sha256: a changed size, or a changed mtime with a different checksum,
makes the cache stale, and so does a file added or removed (a source inside a file that holds several
episodes, `<file>.parquet/episode_XXXXXX` (LeRobot v3.0), is fingerprinted by that file: source_file);
the trainer refuses a stale cache (or a
manifest whose spec disagrees with its directory) naming what differs. `prepare` is resumable: an episode
entry whose fingerprint and spec hash match is not redone, so a killed run continues where it stopped.
Every file is written atomically (provision/atomic.py): a write that runs out of space or quota leaves no
partial entry and raises OutOfSpace (checkpoint/diskspace.py) naming the entry and its size; the
manifest, written last, is then never written, so an incomplete cache is never taken for a complete one.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from provision.atomic import write_atomic
from trainer import testhooks
from trainer.checkpoint.diskspace import guard
from trainer.data.cache.location import CACHE_DIR
from trainer.data.encoding import views
from trainer.data.encoding.encoder import VideoEncoder, config_hash
from trainer.data.encoding.rows import camera_encoders, video_rows
from trainer.data.encoding.text import TextEncoder
from trainer.data.formats.discovery import SKIP_ERROR, SKIP_FAILED, SKIP_OTHER_TASK
from trainer.data.formats.furniturebench import DatasetError, Episode, episode_status, validate_episode

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
STORAGE_DTYPE = np.float16  # the reference stores bf16 latents; numpy has no bf16


@dataclass(frozen=True)
class CacheSpec:
    encoder: str
    encoder_hash: str
    text_encoder: str
    text_hash: str
    prompt: str
    cameras: tuple[str, ...]
    resolution: int  # pixels fed to the encoder (0: area pooling, no resize)
    latent_side: int
    latent_channels: int
    temporal: int
    task: str
    include_failed: bool
    version: int = FORMAT_VERSION
    source: str = (
        ""  # what else the entries depend on (LeRobot: trainer/data/cache/lerobot_entries.py spec_source)
    )
    # recorded only when not the default (so caches made before these fields keep their directory):
    actions_per_video_frame: int = 1  # video frames are rows 0, a, 2a, ... (data.actions_per_video_frame)
    layout: str = "side_by_side"  # data.layout (trainer/data/encoding/views.py): each camera's latent size
    latent_width: int = 0  # one full-size view's latent width when not latent_side (model.latent_width)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cameras"] = list(self.cameras)
        if not self.source:
            del d["source"]  # FurnitureBench caches made before the field keep their directory
        for key, default in _DEFAULTS.items():
            if d[key] == default:
                del d[key]  # likewise: a default-rate, side-by-side, square cache keeps its directory
        return d

    @property
    def stride(self) -> int:
        """Rows per video frame: the rows whose images are encoded are 0, stride, 2 stride, ..."""
        return max(1, self.actions_per_video_frame)

    def view_sizes(self) -> list[tuple[int, int]]:
        """Each camera's latent (h, w), data.cameras order (trainer/data/encoding/views.py view_sizes)."""
        model = SimpleNamespace(latent_size=self.latent_side, latent_width=self.latent_width)
        data = SimpleNamespace(cameras=list(self.cameras), layout=self.layout)
        return views.view_sizes(SimpleNamespace(model=model, data=data))


_DEFAULTS = {"actions_per_video_frame": 1, "layout": "side_by_side", "latent_width": 0}


def make_spec(
    cfg, video: VideoEncoder, text: TextEncoder, prompt: str | None = None, source: str = ""
) -> CacheSpec:
    """prompt/source: a LeRobot dataset's tasks (one per line) and its spec_source; data.prompt otherwise."""
    d = cfg.data
    return CacheSpec(
        source=source,
        encoder=video.name,
        encoder_hash=config_hash(video.config()),
        text_encoder=text.name,
        text_hash=config_hash(text.config()),
        prompt=d.prompt if prompt is None else prompt,
        cameras=tuple(d.cameras),
        resolution=video.resolution,
        latent_side=video.latent_side,
        latent_channels=video.channels,
        temporal=video.temporal,
        task=d.task,
        include_failed=d.include_failed,
        actions_per_video_frame=int(getattr(d, "actions_per_video_frame", 1)),
        layout=str(getattr(d, "layout", "side_by_side")),
        latent_width=video.latent_width if video.latent_width != video.latent_side else 0,
    )


def cache_dir(base: Path, spec: CacheSpec, elsewhere: str = "") -> Path:
    """<base>/.latents/<encoder>-<spec hash>; under data.cache_dir (`elsewhere`) also keyed by data path."""
    if not elsewhere:
        return Path(base) / CACHE_DIR / f"{spec.encoder}-{spec.digest()}"
    where = hashlib.sha256(str(Path(base).resolve()).encode()).hexdigest()[:8]
    return Path(elsewhere).expanduser() / CACHE_DIR / f"{spec.encoder}-{spec.digest()}-{where}"


def entry_path(directory: Path, base: Path, source: Path) -> Path:
    rel = source.relative_to(base).as_posix().replace("/", "__")
    return directory / "episodes" / f"{rel}.npz"


def source_file(source: Path) -> Path:
    """The file holding a source's bytes: the source, or the .parquet it names an episode of."""
    return (
        source.parent if source.parent.suffix == ".parquet" and source.name.startswith("episode_") else source
    )


def fingerprint(path: Path, content: bytes | None = None) -> dict[str, Any]:
    st = path.stat()
    data = path.read_bytes() if content is None else content
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": hashlib.sha256(data).hexdigest()}


def _write_bytes(path: Path, data: bytes) -> None:
    """Atomic write (a failed one leaves nothing behind); out of space or quota is OutOfSpace naming the
    entry and its size (issue 15's disk-full case)."""
    with guard(path, "latent cache", needed=len(data)):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def read_meta(entry: Path) -> dict[str, Any] | None:
    """An entry's meta, or None when it is missing or unreadable (then it is redone)."""
    try:
        with np.load(entry, allow_pickle=False) as z:
            return json.loads(str(z["meta"]))
    except (OSError, KeyError, ValueError):
        return None


def _skip_reason(data: Any, task: str, include_failed: bool) -> str | None:
    success, error, _ = episode_status(data)
    if isinstance(data, dict) and isinstance(data.get("furniture"), str) and data["furniture"] != task:
        return SKIP_OTHER_TASK
    if include_failed:
        return None
    if error is True:
        return SKIP_ERROR
    if success is False:
        return SKIP_FAILED
    return None


def encode_episode_entry(
    source: Path,
    entry: Path,
    spec: CacheSpec,
    video: VideoEncoder,
    on_frames: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Read, check, encode and write one episode's entry; returns its meta."""
    import pickle

    content = source.read_bytes()
    fp = fingerprint(source, content)
    try:
        data = pickle.loads(content)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError, IndexError) as exc:
        raise DatasetError(
            f"{source}: <file>: not a readable episode pickle ({type(exc).__name__}: {exc})"
        ) from exc
    meta: dict[str, Any] = {"source": fp, "spec": spec.digest(), "notes": []}
    reason = _skip_reason(data, spec.task, spec.include_failed)
    arrays: dict[str, np.ndarray] = {}
    if reason is not None:
        meta.update(status="skipped", reason=reason)
    else:
        episode: Episode = validate_episode(data, source, spec.cameras)
        encoders = camera_encoders(spec.cameras, spec.view_sizes(), video)
        for cam in spec.cameras:
            frames = video_rows(episode.images[cam], spec)
            arrays[f"latents__{cam}"] = encoders[cam].encode(frames).astype(STORAGE_DTYPE)
            if on_frames is not None:
                on_frames(int(frames.shape[0]))
        arrays.update(actions=episode.actions, rewards=episode.rewards, skills=episode.skills)
        for key, value in episode.robot_state.items():
            arrays[f"robot_state__{key}"] = value
        if episode.parts_poses is not None:
            arrays["parts_poses"] = episode.parts_poses
        for key, value in episode.extras.items():
            arrays[f"extra__{key}"] = value
        lengths = {arrays[f"latents__{c}"].shape[0] for c in spec.cameras}
        meta.update(
            status="used",
            latent_frames=min(lengths),
            actions=episode.num_actions,
            format=episode.format,
            success=episode.success,
            error=episode.error,
            error_description=episode.error_description,
            notes=episode.notes,
        )
    arrays["meta"] = np.array(json.dumps(meta))
    _write_bytes(entry, _npz_bytes(arrays))
    return meta


class PreparationStopped(Exception):
    """A stop (SIGUSR1/SIGTERM, the attempt's stop request) seen between two episodes of a preparation:
    what was encoded is kept, and the next preparation continues from it."""


def prepare_entries(
    base: Path,
    files: list[Path],
    directory: Path,
    spec: CacheSpec,
    video: VideoEncoder,
    rank: int = 0,
    world_size: int = 1,
    log: Callable[[str], None] = print,
    on_frames: Callable[[int], None] | None = None,
    encode: Callable[..., dict[str, Any]] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[int, int]:
    """Encode this rank's share (i % world_size == rank) of `files`; returns (encoded, kept from before).
    encode: the entry writer (encode_episode_entry; a LeRobot dataset's: lerobot_entries.entry_encoder).
    should_stop: asked before each episode; PreparationStopped when it says so (an episode is whole or
    absent: each entry is written atomically)."""
    encode = encode or encode_episode_entry
    encoded = kept = 0
    share = len(range(rank, len(files), world_size))
    for i, source in enumerate(files):
        if i % world_size != rank:
            continue
        if should_stop is not None and should_stop():
            raise PreparationStopped(
                f"{encoded + kept} of {share} episode(s) of {directory} encoded and kept ({kept} from "
                "before); the next attempt's preparation continues from them"
            )
        entry = entry_path(directory, base, source)
        meta = read_meta(entry) if entry.is_file() else None
        st = source_file(source).stat()
        if (
            meta is not None
            and meta.get("spec") == spec.digest()
            and meta["source"]["size"] == st.st_size
            and meta["source"]["mtime_ns"] == st.st_mtime_ns
        ):
            kept += 1
            continue
        meta = encode(source, entry, spec, video, on_frames)
        encoded += 1
        status = meta["status"] if meta["status"] == "used" else f"skipped: {meta['reason']}"
        log(f"prepare[rank {rank}]: {source.relative_to(base)}: {status}")
        testhooks.pause("prepare", encoded, rank)  # test hook: off unless set
    return encoded, kept


def write_text(directory: Path, text: TextEncoder, prompt: str) -> None:
    emb, mask = text.embed(prompt)
    empty, empty_mask = text.embed("")
    _write_bytes(
        directory / "text.npz",
        _npz_bytes(dict(prompt_emb=emb, prompt_mask=mask, empty_emb=empty, empty_mask=empty_mask)),
    )
