"""bin/train's command line: what it accepts, and an argparse error (exit 2) for anything else.

bin/train CONFIG NPROC [--env NAME | --prefix P] [--run-dir DIR] [--set key=value ...]
          [--cpu-scale | --no-cpu-scale] [--nnodes N --node-rank R --master-addr A --master-port P]
          [--sbatch [FILE] [--time T] [--partition P] [--account A]]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bin/train",
        description=(
            "Train CONFIG on NPROC ranks per node with torchrun; auto-resumes, survives preemption."
        ),
        epilog=(
            "exit codes: 0 done, 1 failed, 2 bad usage/config, 3 preflight failed, 75 preempted (resume me)"
        ),
    )
    parser.add_argument("config", help="a config name from trainer/configs/ (e.g. furniture_train)")
    parser.add_argument("nproc", type=_positive_int, help="ranks per node (GPUs per node on a GPU machine)")
    env = parser.add_mutually_exclusive_group()
    env.add_argument("--env", metavar="NAME", help="a provisioned env under conda's envs dir")
    env.add_argument("--prefix", metavar="P", type=Path, help="a provisioned env by path")
    parser.add_argument("--run-dir", type=Path, help="default: runs/<config> in the repo")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field"
    )
    parser.add_argument(
        "--cpu-scale",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="use the config's cpu_scale block (default: only when no GPU is found)",
    )
    parser.add_argument("--nnodes", type=_positive_int, help="default: $SLURM_NNODES, else 1")
    parser.add_argument("--node-rank", type=int, help="default: $SLURM_NODEID, else 0")
    parser.add_argument("--master-addr", help="default: $MASTER_ADDR, else the job's first Slurm node")
    parser.add_argument("--master-port", type=int, help="default: $MASTER_PORT, else derived from the job id")
    parser.add_argument(
        "--no-requeue", action="store_true", help="under Slurm, do not requeue when preempted"
    )
    parser.add_argument(
        "--sbatch",
        nargs="?",
        const="-",
        metavar="FILE",
        help="print (or write to FILE) a ready sbatch script for this run instead of running it",
    )
    parser.add_argument("--time", default="24:00:00", help="--sbatch: the job's time limit")
    parser.add_argument("--partition", help="--sbatch: Slurm partition")
    parser.add_argument("--account", help="--sbatch: Slurm account")
    return parser.parse_args(argv)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value
