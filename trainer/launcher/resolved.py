"""What the launcher has resolved so far (shared by main.py and summaries.py; no behaviour)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import RunConfig
from trainer.launcher.envchoice import EnvChoice
from trainer.launcher.rendezvous import Rendezvous


@dataclass
class Known:
    """What is resolved so far: for the summary of an early stop, and for --json."""

    run_dir: Path | None = None
    cfg: RunConfig | None = None
    report: dict[str, Any] | None = None  # the --json object's body where summary.json does not apply
    owner: Any = None  # trainer.launcher.ownership.Ownership while this launcher holds the run dir


@dataclass
class Launch:
    """Everything preflight resolved: what torchrun runs with."""

    cfg: RunConfig
    run_dir: Path
    rdzv: Rendezvous
    world_size: int
    choice: EnvChoice
    env: dict[str, str]
    cpu_scale: bool
    damaged: list[dict[str, Any]] | None = None  # checkpoints moved aside by this launch
