"""Which kind of dataset data.path holds, its episode files, and what to do when it holds none.

    fmt = data_format(cfg, root)        # lerobot (data.format, or auto: root/meta/info.json) | furniturebench
    found = discover_source(cfg)        # trainer/data/formats/discovery.py's Discovery for either format
    ensure_dataset(cfg, say)            # the episode files, generating FurnitureBench ones / recording the
                                        # LIBERO stand-in when allowed
    missing_episodes(cfg, root)         # why there are none (None: may be generated); the preflight's too

A LeRobot dataset's episode files are its parquet files, listed by meta/episodes.jsonl (one missing on disk
is named when read). LeRobot data is never generated, with one exception: data.dataset libero with
data.generate_if_missing on (the libero preset's CPU scale) and no dataset at data.path records a small one
in LIBERO's simulator on first use (trainer/data/formats/libero_record.py: a scripted expert's
demonstrations, written by lerobot 0.3.3's writer; announced): data.generated_episodes demos in all, round
robin over data.generated_tasks of the suite RECORDED_SUITE (empty: every task with an expert), each at most
data.generated_length actions.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainer.data.cache.location import dataset_lock, resolve_data_path
from trainer.data.formats.discovery import Discovery, discover
from trainer.data.formats.furniturebench import DatasetError
from trainer.data.formats.generate import generate_dataset

LEROBOT = "lerobot"
FURNITUREBENCH = "furniturebench"
RECORDED_SUITE = "libero_goal"  # the suite the recorded LIBERO stand-in's episodes come from


def records_libero(cfg, root: Path | None = None) -> bool:
    """Whether a missing LeRobot dataset at root is recorded in LIBERO's simulator (see the docstring)."""
    return (
        cfg.data.dataset == "libero"
        and bool(cfg.data.generate_if_missing)
        and data_format(cfg, root if root is not None else resolve_data_path(cfg)) == LEROBOT
    )


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


def ensure_dataset(cfg, say: Callable[[str], None] = print) -> list[Path]:
    """Episode files under cfg.data.path, generating FurnitureBench ones (or recording the LIBERO stand-in)
    first when allowed; `say` announces a recording (whichever rank records says it)."""
    root, task = resolve_data_path(cfg), cfg.data.task
    files = discover_source(cfg, root).files
    if files:
        return files
    if records_libero(cfg, root):
        return _record_libero(cfg, root, say)
    if data_format(cfg, root) == LEROBOT or not cfg.data.generate_if_missing:
        raise DatasetError(missing_episodes(cfg, root) or "")
    with dataset_lock(root):
        files = discover(root, task).files  # another rank may have generated meanwhile
        if not files:
            problem = missing_episodes(cfg, root)
            if problem:
                raise DatasetError(problem)
            say(
                f"data: no episodes under {root}: generating {cfg.data.generated_episodes} synthetic "
                f"FurnitureBench episodes there (data.generate_if_missing, seed train.seed={cfg.train.seed})"
            )  # never unsaid: bin/evaluate and bin/serve score and serve on them too
            generate_dataset(
                root, cfg.data.generated_episodes, cfg.data.generated_length, task, cfg.train.seed
            )
            files = discover(root, task).files
    return files


def _record_libero(cfg, root: Path, say: Callable[[str], None]) -> list[Path]:
    from trainer.data.formats.libero_record import record_dataset

    with dataset_lock(root):
        files = discover_source(cfg, root).files  # another rank (or run) may have recorded meanwhile
        if not files:
            problem = missing_episodes(cfg, root)
            if problem:
                raise DatasetError(problem)
            record_dataset(root, cfg.data.generated_episodes, cfg.data.generated_length, RECORDED_SUITE, say,
                           cfg.data.generated_tasks.replace(" ", ""))  # fmt: skip
            files = discover_source(cfg, root).files
    return files


def missing_episodes(cfg, root: Path) -> str | None:
    """Why `root`, which holds no episodes, cannot get them (None: they may be generated).
    The launcher's preflight asks this too (trainer/launcher/inputs.py)."""
    task = cfg.data.task
    if records_libero(cfg, root):
        if root.exists() and any(p for p in root.iterdir() if not p.name.startswith(".")):
            return (
                f"{root}: the directory exists but holds no LeRobot dataset (no meta/info.json) to train on "
                "or record into; remove it, or point data.path at a LeRobot LIBERO dataset"
            )
        return None
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
