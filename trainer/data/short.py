"""Episodes too short for one training clip: named, with what one clip needs and what changes it.

A clip is data.frames latent frames; the encoder turns 1 + t x (n - 1) video frames into n latent frames
(the first frame alone, then groups of t, t its temporal stride: data.actions_per_frame /
data.actions_per_video_frame for the patch_mean stand-in, 4 for the Wan2.2 VAE). An episode's video frames
are its rows 0, a, 2a, ... (a = data.actions_per_video_frame), so one clip needs 1 + a t (n - 1) rows
(recorded frames; each row one action). An episode whose latent frames are fewer than data.frames yields no
clip and is skipped (discovery.SKIP_TOO_SHORT). `short_episodes` says how many, which (the first few),
their lengths in frames, and the frames one clip needs; the data summary line and summary.json's
`data.short` carry it, and a split that leaves nothing to train on repeats the count
(`split_with_short`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.data.split import SplitError, split_record

SHOWN = 5  # episodes named in the line (summary.json lists up to 100)


def clip_frames(frames: int, temporal: int, stride: int = 1) -> int:
    """Recorded frames (rows) one clip of `frames` latent frames needs: 1 + (frames - 1) t video frames,
    every `stride`-th row (data.actions_per_video_frame)."""
    return 1 + (frames - 1) * temporal * stride


def short_episodes(cfg: Any, manifest: dict[str, Any], root: Path) -> dict[str, Any] | None:
    """summary.json's `data.short` (None when no used episode is too short), with its one `line`."""
    spec = manifest.get("spec", {})
    frames, temporal = int(cfg.data.frames), int(spec.get("temporal") or 1)
    stride = int(spec.get("actions_per_video_frame") or 1)  # recorded only when not 1 (cache.CacheSpec)
    short = [
        {
            "path": str(Path(root) / ep["file"]),
            "frames": ep.get("actions"),
            "latent_frames": ep.get("latent_frames"),
        }  # fmt: skip
        for ep in manifest.get("episodes", [])
        if ep.get("status") == "used" and ep.get("latent_frames", 0) < frames
    ]
    if not short:
        return None
    need = clip_frames(frames, temporal, stride)
    named = ", ".join(f"{Path(e['path']).name} ({e['frames']} frames)" for e in short[:SHOWN])
    more = f" and {len(short) - SHOWN} more" if len(short) > SHOWN else ""
    rate = (
        f", one video frame every {stride} recorded frames (data.actions_per_video_frame): "
        f"1 + {stride} x {temporal} x {frames - 1}"
        if stride > 1
        else f": 1 + {temporal} x {frames - 1}"
    )
    line = (
        f"{len(short)} episode(s) shorter than one clip, skipped: {named}{more}; one clip needs {need} "
        f"frames (data.frames={frames} latent frames, the encoder's temporal stride {temporal}{rate}); "
        "lower data.frames (or, with the patch_mean stand-in, data.actions_per_frame) to use them, or "
        "record longer episodes"
    )
    out = {"count": len(short), "clip_frames": need, "frames": frames, "temporal": temporal,
           "episodes": short[:100], "line": line}  # fmt: skip
    if stride > 1:  # data.actions_per_video_frame, recorded only when not the default
        out["stride"] = stride
    return out


def split_with_short(names: list[str], val: float, short: dict[str, Any] | None) -> dict[str, Any]:
    """split_record, whose SplitError also says how many episodes were too short for a clip."""
    try:
        return split_record(names, val)
    except SplitError as exc:
        if short is None:
            raise
        raise SplitError(
            f"{exc}; {short['count']} more episode(s) were found but are shorter than one clip "
            f"({short['clip_frames']} frames: data.frames={short['frames']}, temporal stride "
            f"{short['temporal']}): lower data.frames to use them"
        ) from None
