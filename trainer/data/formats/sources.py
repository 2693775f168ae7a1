"""Which kind of dataset data.path holds, its episode files, and what to do when it holds none.

    fmt = data_format(cfg, root)        # lerobot (data.format, or auto: root/meta/info.json) | furniturebench
    found = discover_source(cfg)        # trainer/data/formats/discovery.py's Discovery for either format
    ensure_dataset(cfg)                 # the episode files, generating FurnitureBench ones when allowed
    missing_episodes(cfg, root)         # why there are none (None: may be generated); the preflight's too

A LeRobot dataset's episode files are its parquet files, listed by meta/episodes.jsonl (one missing on disk
is named when read). LeRobot data is never generated.
"""

from __future__ import annotations

from pathlib import Path

from trainer.data.cache.location import dataset_lock, resolve_data_path
from trainer.data.formats.discovery import Discovery, discover
from trainer.data.formats.furniturebench import DatasetError
from trainer.data.formats.generate import generate_dataset

LEROBOT = "lerobot"
FURNITUREBENCH = "furniturebench"


def data_format(cfg, root: Path | None = None) -> str:
    from trainer.data.formats.lerobot import is_lerobot

    if cfg.data.format != "auto":
        return str(cfg.data.format)
    return LEROBOT if is_lerobot(root if root is not None else resolve_data_path(cfg)) else FURNITUREBENCH


def discover_source(cfg, root: Path | None = None) -> Discovery:
    root = root if root is not None else resolve_data_path(cfg)
    if data_format(cfg, root) == LEROBOT:
        from trainer.data.formats.lerobot import is_lerobot, load

        if not is_lerobot(root):
            return Discovery(root, "empty", [])
        ds = load(root)
        return Discovery(root, ds.layout, ds.files())
    return discover(root, cfg.data.task)


def ensure_dataset(cfg) -> list[Path]:
    """Episode files under cfg.data.path, generating FurnitureBench ones first when allowed."""
    root, task = resolve_data_path(cfg), cfg.data.task
    files = discover_source(cfg, root).files
    if files:
        return files
    if data_format(cfg, root) == LEROBOT or not cfg.data.generate_if_missing:
        raise DatasetError(missing_episodes(cfg, root) or "")
    with dataset_lock(root):
        files = discover(root, task).files  # another rank may have generated meanwhile
        if not files:
            problem = missing_episodes(cfg, root)
            if problem:
                raise DatasetError(problem)
            generate_dataset(
                root, cfg.data.generated_episodes, cfg.data.generated_length, task, cfg.train.seed
            )
            files = discover(root, task).files
    return files


def missing_episodes(cfg, root: Path) -> str | None:
    """Why `root`, which holds no episodes, cannot get them (None: they may be generated).
    The launcher's preflight asks this too (trainer/launcher/inputs.py)."""
    task = cfg.data.task
    if data_format(cfg, root) == LEROBOT:
        return (
            f"{root}: no LeRobot episodes (data.format=lerobot wants {root}/meta/info.json and "
            "meta/episodes.jsonl listing episodes); point data.path at a LeRobot dataset root"
        )
    if not cfg.data.generate_if_missing:
        return (
            f"{root}: no {task} episodes ({task}/<timestamp>/<timestamp>.pkl, <timestamp>/<timestamp>.pkl "
            f"or *.pkl; data.generate_if_missing is off); generate some with "
            f"`python -m trainer.data.formats.generate {root} --episodes N --task {task}` or fix data.path"
        )
    if root.exists() and any(p for p in root.iterdir() if not p.name.startswith(".")):
        return (
            f"{root}: the directory exists but holds no {task} episodes (looked for {task}/, "
            f"timestamped collector folders and *.pkl); point data.path elsewhere or set data.task"
        )
    return None
