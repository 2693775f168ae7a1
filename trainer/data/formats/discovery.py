"""Which episode files a data.path holds, in a deterministic order, and why any were not used.

    found = discover(root, task)            # Discovery: candidate files + layout + skipped folders
    summary = DatasetSummary.of(...)        # found / used / skipped (by reason): the log, summary.json

Layouts accepted for data.path (FurnitureBench's collector: `collect_data.py --out-data-path OUT
--furniture F` saves to OUT/F/<YYYY-mm-dd-HH:MM:SS>/<same>.pkl):
    OUT            a parent with one folder per furniture: OUT/<data.task>/... is used
    OUT/F          the collector's data_path: timestamped sub-folders, each with <same>.pkl
    any folder     flat *.pkl files (e.g. preprocess_data.py output, or 0.pkl 1.pkl ...)
Timestamped sub-folders and flat files may be mixed. Order: by collection timestamp (parsed from the
folder or file name), then numeric names, then the rest by name. A timestamped folder without its .pkl
(a collection saved as mp4/png only, or one killed before pickle.dump) is reported as skipped.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

TIMESTAMP_FORMAT = "%Y-%m-%d-%H:%M:%S"  # data_collector.py DataCollector.save
LAYOUT_PARENT = "furniture parent (<root>/<task>/...)"
LAYOUT_COLLECTOR = "collector data_path (<root>/<YYYY-mm-dd-HH:MM:SS>/<same>.pkl)"
LAYOUT_FLAT = "flat folder (<root>/*.pkl)"

# reasons an episode is not used (DatasetSummary.skipped keys)
SKIP_FAILED = "success is False (data.include_failed: true keeps it)"
SKIP_ERROR = "error is True (data.include_failed: true keeps it)"
SKIP_NO_PKL = "timestamped folder without its .pkl"
SKIP_OTHER_TASK = "furniture differs from data.task"
SKIP_TOO_SHORT = "shorter than one clip"


def parse_timestamp(name: str) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(name, TIMESTAMP_FORMAT)
    except ValueError:
        return None


def order_key(path: Path) -> tuple:
    """Collection timestamp first, then numeric stems (0.pkl, 1.pkl, ...), then names."""
    stamp = parse_timestamp(path.stem) or parse_timestamp(path.parent.name)
    if stamp is not None:
        return (0, stamp.isoformat(), str(path))
    if path.stem.isdigit():
        return (1, f"{int(path.stem):020d}", str(path))
    return (2, path.stem, str(path))


@dataclass
class Discovery:
    root: Path  # the folder episodes were looked for in
    layout: str
    files: list[Path]
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def discover(root: Path, task: str) -> Discovery:
    """Candidate episode files under `root` for furniture `task` (not yet opened)."""
    root = Path(root)
    base, layouts = root, []
    if (root / task).is_dir():
        base = root / task
        layouts.append(LAYOUT_PARENT)
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    if base.is_dir():
        for entry in base.iterdir():
            if entry.name.startswith("."):
                continue  # our cache, temporary files
            if entry.is_file() and entry.suffix == ".pkl":
                files.append(entry)
                if LAYOUT_FLAT not in layouts:
                    layouts.append(LAYOUT_FLAT)
            elif entry.is_dir() and parse_timestamp(entry.name) is not None:
                pkl = entry / f"{entry.name}.pkl"
                if pkl.is_file():
                    files.append(pkl)
                    if LAYOUT_COLLECTOR not in layouts:
                        layouts.append(LAYOUT_COLLECTOR)
                else:
                    skipped.append((entry, SKIP_NO_PKL))
    return Discovery(base, " + ".join(layouts) or "empty", sorted(files, key=order_key), skipped)


@dataclass
class DatasetSummary:
    """What the data path held and what training used: the log line and summary.json's `data` entry."""

    root: str
    layout: str
    found: int
    used: int
    skipped: dict[str, int]  # reason -> count
    skipped_files: list[tuple[str, str]]  # (path, reason), in discovery order
    notes: dict[str, int]  # reader adjustments (e.g. observation-failure skill dropped) -> count
    encoder: str  # video encoder name ("patch_mean" is a stand-in)
    text_encoder: str  # text encoder name ("stand-in" when no T5 folder was given)
    stand_ins: list[str]  # what in this run is not the real thing; empty when nothing is
    cameras: list[str]
    cache: str  # the cache directory used ("" without a cache)
    split: dict | None = (
        None  # the held-out split (trainer/data/split.py split_record), None without episodes
    )
    short: dict | None = None  # episodes shorter than one clip (trainer/data/short.py), None: none

    @classmethod
    def of(cls, discovery: Discovery, used: int, skipped: list[tuple[Path, str]], **fields) -> DatasetSummary:
        all_skipped = discovery.skipped + skipped
        return cls(
            root=str(discovery.root),
            layout=discovery.layout,
            found=len(discovery.files) + len(discovery.skipped),
            used=used,
            skipped=dict(Counter(reason for _, reason in all_skipped)),
            skipped_files=[(str(p), r) for p, r in all_skipped],
            **fields,
        )

    def to_json(self) -> dict:
        return {
            "root": self.root,
            "layout": self.layout,
            "found": self.found,
            "used": self.used,
            "skipped": self.skipped,
            "skipped_files": [{"path": p, "reason": r} for p, r in self.skipped_files[:100]],
            "notes": self.notes,
            "encoder": self.encoder,
            "text_encoder": self.text_encoder,
            "stand_ins": self.stand_ins,
            "cameras": self.cameras,
            "cache": self.cache,
            "split": self.split,
            "short": self.short,
        }

    def describe(self) -> str:
        why = ", ".join(f"{n} {reason}" for reason, n in self.skipped.items()) or "none"
        return (
            f"data: {self.root} ({self.layout}): {self.found} found, {self.used} used, "
            f"{self.found - self.used} skipped ({why})" + (f"; {self.short['line']}" if self.short else "")
        )
