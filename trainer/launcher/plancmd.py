"""`bin/train CONFIG NPROC --plan [--gpu KIND]`: the plan of the run (trainer/plan/), no rank started.

The config is the cluster one unless --cpu-scale is given (a login node has no GPU, yet the plan is for
the GPUs the job will get). GPU kinds: --gpu KIND, else the GPU found here, else every kind in the table.
World size: NPROC x (--nnodes, else $SLURM_NNODES, else 1). Text on stdout (with --json, the plan is the
JSON object's body). Exit 0, or 2 for a bad config (the released transformer fed stand-in encoders
included: trainer/config/standins.py) or an unknown --gpu. The plan reads no weights or data: a folder the
config names that is not on this machine (model.pretrained, data.vae_path, data.text_encoder) is said in one
line each, not refused; the run's preflight needs them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trainer.attempt import EXIT_OK, EXIT_USAGE
from trainer.config import ConfigError, load_config, parse_set
from trainer.config.standins import check_stand_ins
from trainer.launcher.console import say
from trainer.launcher.resolved import Known


def show_plan(args: argparse.Namespace, known: Known) -> int:
    from trainer.plan.estimate import make_plan
    from trainer.plan.gpus import GPU_KINDS, UnknownGpu, gpu_kind, match_device_name
    from trainer.plan.report import format_plan

    cpu_scale = bool(args.cpu_scale)
    try:
        cfg = load_config(args.config, cpu_scale=cpu_scale, overrides=parse_set(args.set))
        check_stand_ins(cfg, bool(cfg.model.pretrained), not cpu_scale, "", say)
        kinds = [gpu_kind(args.gpu)] if args.gpu else []
    except (ConfigError, UnknownGpu) as exc:
        say(f"error: {exc}")
        known.report = {"error": str(exc)}
        return EXIT_USAGE
    if not kinds and not cpu_scale:
        found = _device_name()
        kind = match_device_name(found) if found else None
        kinds = [kind] if kind is not None else list(GPU_KINDS)
    for line in absent_inputs(cfg):
        say(line)
    nnodes = args.nnodes or int(os.environ.get("SLURM_NNODES") or 1)
    plan = make_plan(cfg, args.nproc * nnodes, nnodes, kinds, target="cpu" if cpu_scale else "cuda")
    sys.stdout.write(format_plan(plan) + "\n")
    known.report = {"plan": plan.to_json()}
    return EXIT_OK


def _device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def absent_inputs(cfg) -> list[str]:
    """One line per folder the config names that is not on this machine (relative ones: the repo root's)."""
    from provision.paths import repo_root

    named = {"model.pretrained": cfg.model.pretrained, "data.vae_path": cfg.data.vae_path}
    named["data.text_encoder"] = cfg.data.text_encoder
    lines = []
    for key, value in named.items():
        path = Path(value).expanduser() if value else None
        if path is not None and not (path if path.is_absolute() else repo_root() / path).exists():
            lines.append(
                f"plan: {key}={value} is not on this machine: the plan does not need it, the run does"
            )
    return lines
