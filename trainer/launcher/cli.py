"""bin/train's command line: what it accepts, and an argparse error (exit 2) for anything else.

bin/train CONFIG NPROC [--env NAME | --prefix P] [--run-dir DIR] [--set key=value ...]
          [--cpu-scale | --no-cpu-scale] [--nnodes N --node-rank R --master-addr A --master-port P]
          [--require-env] [--preflight-only] [--env-checked] [--no-requeue] [--json | --json-file FILE]
          [--plan [--gpu KIND]]
          [--sbatch [FILE] [--time T] [--partition P] [--account A] [--cpus-per-task C]
                   [--gpus-per-node G] [--signal-lead S]]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import NoReturn


class UsageError(SystemExit):
    """A bad command line: argparse's message (already printed to stderr), exit status 2."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise UsageError(message)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(
        prog="bin/train",
        description=(
            "Train CONFIG on NPROC ranks per node with torchrun; auto-resumes, survives preemption."
        ),
        epilog=(
            "exit codes: 0 done, 1 failed, 2 bad usage/config, 3 preflight failed, "
            "73 run dir in use by another bin/train, 75 preempted (resume me)"
        ),
    )
    parser.add_argument("config", help="a config name from trainer/config/presets/ (e.g. furniture_train)")
    parser.add_argument("nproc", type=_positive_int, help="ranks per node (GPUs per node on a GPU machine)")
    env = parser.add_mutually_exclusive_group()
    env.add_argument("--env", metavar="NAME", help="a provisioned env under conda's envs dir")
    env.add_argument("--prefix", metavar="P", type=Path, help="a provisioned env by path")
    parser.add_argument("--run-dir", type=_folder, help="default: runs/<config> in the repo")
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
    parser.add_argument("--master-port", type=_port, help="default: $MASTER_PORT, else from the job id")
    parser.add_argument(
        "--no-requeue",
        action="store_true",
        help="under Slurm, do not requeue after a SIGUSR1 stop (SIGTERM never requeues: Slurm decides)",
    )
    parser.add_argument(
        "--require-env",
        action="store_true",
        help="fail preflight (exit 3) rather than fall back to the tool env when no provisioned env is found",
    )
    parser.add_argument(
        "--env-checked",
        action="store_true",
        help="skip bin/envcheck's compile checks (the sbatch script's step 2: step 1 ran them on this node)",
    )
    parser.add_argument(
        "--preflight-only",
        action="store_true",
        help="run the preflight (env choice, checks), then exit 0 (passed) or 3 (the sbatch script's step 1)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="stdout carries exactly one JSON object, the outcome (summary.json plus ok/exit_code); "
        "all text goes to stderr; the exit status does not change",
    )
    parser.add_argument(
        "--json-file", type=Path, metavar="FILE", help="write that JSON object to FILE (atomically)"
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the run's plan (memory per GPU, FLOPs, communication, step time and ETA lower bounds, "
        "checkpoint size; docs/plan.md) and exit without starting ranks",
    )
    parser.add_argument("--gpu", metavar="KIND", help="--plan: the GPU kind (B200, H200, H100, A100, ...)")
    _add_sbatch_options(parser)
    return parser.parse_args(argv)


def _add_sbatch_options(parser: argparse.ArgumentParser) -> None:
    """--sbatch and the options that shape the script it writes."""
    parser.add_argument(
        "--sbatch",
        nargs="?",
        const="-",
        metavar="FILE",
        help="print (or write to FILE) a ready sbatch script for this run instead of running it",
    )
    parser.add_argument("--time", type=_slurm_time, default="24:00:00", help="--sbatch: the job's time limit")
    parser.add_argument("--partition", help="--sbatch: Slurm partition")
    parser.add_argument("--account", help="--sbatch: Slurm account")
    parser.add_argument(
        "--cpus-per-task", type=_positive_int, help="--sbatch: CPUs for each node's task (default: NPROC)"
    )
    parser.add_argument(
        "--gpus-per-node",
        type=_non_negative_int,
        help="--sbatch: GPUs to request per node (default: NPROC, or none with --cpu-scale; 0: none)",
    )
    parser.add_argument(
        "--signal-lead",
        type=_positive_int,
        default=120,
        metavar="S",
        help="--sbatch: seconds before the time limit Slurm sends USR1 (save + requeue); longer than a save",
    )


def _folder(text: str) -> Path:
    if not text.strip():  # Path("") is ".": the run would fill the working directory
        raise argparse.ArgumentTypeError("is empty (an unset variable?); name the run's folder")
    return Path(text).expanduser()  # `--run-dir=~/x`: the shell leaves that ~ to us


# sbatch --time's forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or no limit
_SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|unlimited|infinite", re.IGNORECASE)


def _slurm_time(text: str) -> str:
    if not _SLURM_TIME.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Slurm time (e.g. 24:00:00, 2-00:00:00, 90)")
    return text.strip()


def _non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "must be 0 or more")


def _port(text: str) -> int:
    port = _positive_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return port


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "must be at least 1")


def _int_at_least(text: str, least: int, said: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r} {said}")
    return value
