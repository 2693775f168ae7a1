"""Decode a LeRobot episode video into RGB frames, with PyAV (the FFmpeg bindings LeRobot itself uses).

    frames = decode_video(path)      # (T, H, W, 3) uint8, every frame in presentation order
    frames = decode_segment(path, start, end)  # the frames whose timestamps t satisfy start <= t < end
                                               # (LeRobot v3.0: many episodes per file)

Why PyAV: its pip wheels bundle an FFmpeg with libdav1d and libaom (AV1, LeRobot's default codec,
`libsvtav1` at encode time), H.264 and HEVC decoders, so nothing depends on the system's ffmpeg; lerobot
0.3.x writes its videos with it. torchcodec would need a system FFmpeg of a matching major version.
Every problem is a VideoError naming the file and the fix: a missing file, a file FFmpeg cannot open, a
codec this FFmpeg build has no decoder for, a corrupt stream.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class VideoError(ValueError):
    """A video that cannot be decoded; the message names the file and the fix."""


def _av():
    try:
        import av
    except ImportError as exc:
        raise VideoError(
            "PyAV is not installed in this environment (LeRobot videos need it): `pip install av==15.1.0` "
            "(environment.yml and conda-lock.yml list it: an env provisioned from an older lock lacks it; "
            "reprovision with `bin/provision lingbot-b200`)"
        ) from exc
    return av


def decoders() -> set[str]:
    """Names of the codecs the installed PyAV/FFmpeg can decode."""
    return set(_av().codecs_available)


def decode_video(path: Path) -> np.ndarray:
    """Every frame of the first video stream of `path` as (T, H, W, 3) uint8 RGB."""
    return decode_segment(path, None, None)


def decode_segment(path: Path, start: float | None, end: float | None) -> np.ndarray:
    """The frames of the first video stream with start <= timestamp < end (None: unbounded), RGB uint8.
    Seeks to the keyframe at or before `start`, then decodes forward (the file may hold hours)."""
    av = _av()
    path = Path(path)
    if not path.is_file():
        raise VideoError(f"{path}: video file missing")
    try:
        container = av.open(str(path))
    except av.error.FFmpegError as exc:
        raise VideoError(f"{path}: not a video FFmpeg can open ({exc}); re-encode or re-record it") from exc
    with container:
        if not container.streams.video:
            raise VideoError(f"{path}: holds no video stream")
        stream = container.streams.video[0]
        codec = stream.codec_context.name
        if codec is None or stream.codec_context.codec is None or not stream.codec_context.codec.is_decoder:
            raise VideoError(_no_decoder(path, str(codec)))
        frames = []
        try:
            if start is not None and start > 0 and stream.time_base is not None:
                container.seek(int(start / stream.time_base), stream=stream, backward=True)
            for frame in container.decode(stream):
                t = frame.time
                if t is not None and start is not None and t < start:
                    continue
                if t is not None and end is not None and t >= end:
                    break
                frames.append(frame.to_ndarray(format="rgb24"))
        except av.error.FFmpegError as exc:
            raise VideoError(f"{path}: decoding {codec} failed ({exc}); the file may be truncated") from exc
    if not frames:
        where = "" if start is None and end is None else f" between {start} s and {end} s"
        raise VideoError(f"{path}: no frames decoded{where}; the file is shorter than its metadata says")
    return np.stack(frames)


def _no_decoder(path: Path, codec: str) -> str:
    return (
        f"{path}: codec {codec!r}: the installed PyAV's FFmpeg has no decoder for it; re-encode the videos "
        "to AV1 or H.264 (e.g. `ffmpeg -i in.mp4 -c:v libsvtav1 -pix_fmt yuv420p out.mp4`) or install "
        "a PyAV wheel built with it"
    )


def check_decodable(path: Path, codec: str) -> None:
    """VideoError when info.json's `video.codec` has no decoder here (before decoding anything)."""
    if codec and codec not in decoders():
        raise VideoError(_no_decoder(path, codec))
