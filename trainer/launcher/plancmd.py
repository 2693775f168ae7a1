"""`bin/train CONFIG NPROC --plan [--gpu KIND]`: the plan of the run (trainer/plan/), no rank started.

The config is the cluster one unless --cpu-scale is given (a login node has no GPU, yet the plan is for
the GPUs the job will get). GPU kinds: --gpu KIND, else the GPU found here, else every kind in the table.
World size: NPROC x (--nnodes, else $SLURM_NNODES, else 1). Text on stdout (with --json, the plan is the
JSON object's body). Exit 0, or 2 for a bad config or an unknown --gpu.
"""

from __future__ import annotations

import argparse
import os
import sys

from trainer.attempt import EXIT_OK, EXIT_USAGE
from trainer.config import ConfigError, load_config, parse_set
from trainer.launcher.console import say
from trainer.launcher.resolved import Known


def show_plan(args: argparse.Namespace, known: Known) -> int:
    from trainer.plan.estimate import make_plan
    from trainer.plan.gpus import GPU_KINDS, UnknownGpu, gpu_kind, match_device_name
    from trainer.plan.report import format_plan

    cpu_scale = bool(args.cpu_scale)
    try:
        cfg = load_config(args.config, cpu_scale=cpu_scale, overrides=parse_set(args.set))
        kinds = [gpu_kind(args.gpu)] if args.gpu else []
    except (ConfigError, UnknownGpu) as exc:
        say(f"error: {exc}")
        known.report = {"error": str(exc)}
        return EXIT_USAGE
    if not kinds and not cpu_scale:
        found = _device_name()
        kind = match_device_name(found) if found else None
        kinds = [kind] if kind is not None else list(GPU_KINDS)
    nnodes = args.nnodes or int(os.environ.get("SLURM_NNODES") or 1)
    plan = make_plan(cfg, args.nproc * nnodes, nnodes, kinds, target="cpu" if cpu_scale else "cuda")
    sys.stdout.write(format_plan(plan) + "\n")
    known.report = {"plan": plan.to_json()}
    return EXIT_OK


def _device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
