"""Prepare the latent cache once, offline: `python -m trainer.data.cache.prepare --config furniture_train`.

    python -m trainer.data.cache.prepare --config furniture_train [--cpu-scale] \
        [--set data.path=/data/one_leg ...]
    torchrun --nproc-per-node 8 -m trainer.data.cache.prepare --config furniture_train     # one share per GPU

Discovers the episodes under data.path (trainer/data/formats/discovery.py), encodes every used one with
data.encoder and the prompt with data.text_encoder, and writes the cache next to the data
(trainer/data/cache/store.py). Under torchrun each rank encodes episodes i % WORLD_SIZE == RANK on its own
GPU, then rank 0 writes the text embeddings and the manifest. Resumable: run it again after a kill and
finished episodes are kept. bin/train calls `ensure_cache` (below) itself when the cache is missing: rank 0
prepares, the other ranks wait for its outcome (a broadcast on a gloo group with a long timeout, so a long
preparation does not trip NCCL's watchdog). A preparation that fails on rank 0 fails on every rank: out of
space or quota is OutOfSpace everywhere (the trainer stops all ranks at its safe point and
the launcher says it in one line), never a rank left waiting on a barrier rank 0 will not reach.

Stand-ins (patch_mean, the stand-in text embedding) are announced loudly in the log and recorded in the
manifest and in the run's summary.json (DatasetSummary.stand_ins).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.checkpoint.diskspace import OutOfSpace, SpaceReport, find_out_of_space
from trainer.data.cache.manifest import StaleCache, check_manifest, write_manifest
from trainer.data.cache.store import (
    MANIFEST,
    PreparationStopped,
    cache_dir,
    make_spec,
    prepare_entries,
    write_text,
)
from trainer.data.encoding.encoder import VideoEncoder, make_encoder
from trainer.data.encoding.text import TextEncoder, make_text_encoder
from trainer.data.formats.discovery import Discovery
from trainer.data.formats.furniturebench import CAMERAS, DatasetError
from trainer.data.formats.sources import LEROBOT, data_format, discover_source

STAND_IN_BANNER = "!" * 100


def check_data_config(cfg) -> None:
    """data.cameras: 1-3 distinct views of color_image1/2/3 (FurnitureBench; LeRobot: checked in _setup)."""
    cams = list(cfg.data.cameras)
    if data_format(cfg, data_root(cfg)) == LEROBOT:
        return
    if not 1 <= len(cams) <= 3 or len(set(cams)) != len(cams) or not set(cams) <= set(CAMERAS):
        raise DatasetError(
            f"data.cameras={cams!r}: choose 1-3 distinct views of {', '.join(CAMERAS)} "
            "(e.g. --set data.cameras=color_image2,color_image1)"
        )


def stand_ins(video: VideoEncoder, text: TextEncoder) -> list[str]:
    out = []
    if video.stand_in:
        out.append(
            f"video encoder {video.name} (weights-free stand-in; data.encoder=wan_vae + data.vae_path)"
        )
    if text.stand_in:
        out.append("text embedding stand-in (no T5 weights; set data.text_encoder to the T5 folder)")
    return out


def announce(log: Callable[[str], None], items: list[str]) -> None:
    if items:
        log(STAND_IN_BANNER)
        for item in items:
            log(f"STAND-IN IN USE: {item}")
        log(
            "these latents/embeddings are NOT LingBot-VA's real inputs; "
            "do not compare this run's losses to a real one"
        )
        log(STAND_IN_BANNER)


@dataclass
class Prepared:
    directory: Path
    discovery: Discovery
    video: VideoEncoder
    text: TextEncoder
    encoded: int  # episodes encoded by this rank in this call
    kept: int  # episodes of this rank already in the cache (resume)
    frames: int  # camera frames encoded by this rank
    seconds: float

    @property
    def frames_per_s(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def data_root(cfg) -> Path:
    from trainer.data.cache.location import resolve_data_path

    return resolve_data_path(cfg)


def _setup(cfg) -> tuple[Discovery, VideoEncoder, TextEncoder, Any, Any]:
    """(episodes found, video encoder, text encoder, cache spec, the LeRobot dataset's meta or None)."""
    check_data_config(cfg)
    root = data_root(cfg)
    found = discover_source(cfg, root)
    video, text = make_encoder(cfg), make_text_encoder(cfg)
    if data_format(cfg, root) != LEROBOT or not found.files:
        return found, video, text, make_spec(cfg, video, text), None
    from trainer.data.cache.lerobot_entries import spec_source
    from trainer.data.formats import lerobot

    ds = lerobot.load(root)
    if cfg.data.upstream_latents != "read":
        lerobot.check_cameras(ds, list(cfg.data.cameras))
    lerobot.parse_action_map(ds, list(cfg.data.action_map))
    return found, video, text, make_spec(cfg, video, text, "\n".join(ds.tasks), spec_source(cfg)), ds


def prepare(
    cfg,
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], None] = lambda: None,
    log: Callable[[str], None] = print,
    should_stop: Callable[[], bool] | None = None,
) -> Prepared:
    """Encode this rank's share, wait for every rank, then rank 0 writes text.npz and the manifest.
    should_stop: asked between episodes (PreparationStopped; one process only: bin/train's rank 0)."""
    found, video, text, spec, ds = _setup(cfg)
    directory = cache_dir(found.root, spec, cfg.data.cache_dir)
    encode = None
    if ds is not None:
        from trainer.data.cache.lerobot_entries import entry_encoder

        encode = entry_encoder(cfg, ds, video, text)
    if rank == 0:
        announce(log, stand_ins(video, text))
        log(f"prepare: {len(found.files)} episode files under {found.root} ({found.layout}) -> {directory}")
    frames = [0]
    started = time.perf_counter()
    encoded, kept = prepare_entries(
        found.root,
        found.files,
        directory,
        spec,
        video,
        rank,
        world_size,
        log,
        on_frames=lambda n: frames.__setitem__(0, frames[0] + n),
        encode=encode,
        should_stop=should_stop,
    )
    seconds = time.perf_counter() - started
    barrier()
    if rank == 0:
        extra = {"stand_ins": stand_ins(video, text), "layout": found.layout, "root": str(found.root)}
        if ds is None:
            write_text(directory, text, cfg.data.prompt)
        else:
            from trainer.data.cache.lerobot_entries import manifest_extra, write_task_text

            write_task_text(directory, text, ds)
            extra.update(manifest_extra(cfg, ds))
        write_manifest(
            found.root, found, directory, spec, extra, split=(cfg.data.val_episodes, cfg.data.frames)
        )
        log(f"prepare: cache complete: {directory / MANIFEST}")
    barrier()
    return Prepared(directory, found, video, text, encoded, kept, frames[0], seconds)


def _long_group(world_size: int):
    """A gloo group over every rank that tolerates a preparation of hours; None with one rank."""
    import torch.distributed as dist

    if world_size == 1 or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=12))


def _outcome(failure: BaseException | None) -> tuple[str, Any] | None:
    """What the other ranks are told of rank 0's preparation: None (done), a space report, or an error."""
    if failure is None:
        return None
    space = find_out_of_space(failure, "latent cache", "?")
    if space is not None:
        return ("space", space.to_json())
    if isinstance(failure, PreparationStopped):
        return ("stopped", str(failure))
    return ("error", f"{type(failure).__name__}: {failure}")


def _agree(group, rank: int, failure: BaseException | None) -> None:
    """Every rank, always: rank 0 says how its preparation went; when it failed, every rank raises.

    Out of space on rank 0 becomes OutOfSpace on every rank (the trainer's safe point then stops them all
    and the launcher says it in one line); a stop, PreparationStopped on every rank (the trainer records
    the attempt as stopped); another failure is a DatasetError naming rank 0's error.
    """
    if group is not None:
        import torch.distributed as dist

        box = [_outcome(failure) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=group)
        said = box[0]
    else:
        said = None
    if failure is not None:
        raise failure
    if said is None:
        return
    kind, detail = said
    if kind == "space":
        raise OutOfSpace.of(SpaceReport(**detail))
    if kind == "stopped":
        raise PreparationStopped(detail)
    raise DatasetError(f"rank 0 could not prepare the latent cache: {detail}")


def _prepare_on_rank0(
    cfg, found: Discovery, directory: Path, log: Callable[[str], None], should_stop: Callable[[], bool] | None
) -> None:
    others = sorted(p.name for p in directory.parent.glob("*") if p != directory and (p / MANIFEST).is_file())
    if others:
        log(f"data: caches made with other settings exist ({', '.join(others)}); preparing {directory.name}")
    log(f"data: no latent cache at {directory}: preparing it now (python -m trainer.data.cache.prepare)")
    from trainer.data.cache.location import dataset_lock

    with dataset_lock(found.root):
        if not (directory / MANIFEST).is_file():
            prepare(cfg, 0, 1, log=log, should_stop=should_stop)


def ensure_cache(
    cfg, rank: int, world_size: int, log: Callable[[str], None] = print, should_stop=None
) -> tuple[Path, dict]:
    """(cache directory, manifest) of a complete, current cache; prepared on rank 0 when missing.
    should_stop (rank 0's; bin/train's stop request): asked between episodes; a stop is PreparationStopped
    on every rank, what was encoded kept for the next attempt.

    A present but stale or mismatched cache is refused (StaleCache naming what differs); run prepare.
    A preparation that fails on rank 0 (out of space, a bad episode) fails on every rank, never a hang:
    every rank reaches the same agreement whatever rank 0's preparation did.
    """
    found, video, text, spec, _ = _setup(cfg)
    directory = cache_dir(found.root, spec, cfg.data.cache_dir)
    group = _long_group(world_size)
    failure: BaseException | None = None
    if rank == 0 and not (directory / MANIFEST).is_file():  # the decision to prepare is rank 0's alone
        try:
            _prepare_on_rank0(cfg, found, directory, log, should_stop)
        except Exception as exc:  # told to every rank below, then raised here too
            failure = exc
    _agree(group, rank, failure)
    return directory, check_manifest(found, directory, spec)


def _init_distributed() -> tuple[int, int, Callable[[], None]]:
    if "RANK" not in os.environ:
        return 0, 1, lambda: None
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=12))  # only barriers go through it
    return rank, world, lambda: dist.barrier()


def main(argv: list[str] | None = None) -> int:
    from trainer.config import ConfigError, load_config, parse_set

    parser = argparse.ArgumentParser(
        prog="python -m trainer.data.cache.prepare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config", default="furniture_train")
    parser.add_argument("--cpu-scale", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, cpu_scale=args.cpu_scale, overrides=parse_set(args.set))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from trainer.data.formats.multiroot import data_roots, for_root

    roots = data_roots(cfg)
    rank, world, barrier = _init_distributed()
    for one in [for_root(cfg, root) for root in roots] if len(roots) > 1 else [cfg]:
        code = _prepare_main(one, rank, world, barrier)
        if code:
            return code
    return 0


def _prepare_main(cfg, rank: int, world: int, barrier: Callable[[], None]) -> int:
    """One root's preparation: its exit status (1 with one line on stderr when it failed)."""

    def log(line: str) -> None:
        print(line if world == 1 else f"[rank {rank}] {line}", flush=True)

    try:
        result = prepare(cfg, rank, world, barrier, log)
        manifest_dir = result.directory
        if rank == 0:
            found, _, _, spec, _ = _setup(cfg)
            check_manifest(found, manifest_dir, spec)
    except OutOfSpace as exc:  # the cache is the only thing prepare writes: one line, no traceback
        print(f"prepare: {exc.line()}", file=sys.stderr)
        return 1
    except (DatasetError, StaleCache, ValueError) as exc:
        print(f"prepare: {exc}", file=sys.stderr)
        return 1
    log(
        f"prepare: rank {rank}: {result.encoded} episodes encoded, {result.kept} already cached; "
        f"{result.frames} frames in {result.seconds:.1f} s ({result.frames_per_s:.1f} frames/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
