"""torchrun's static rendezvous and the attempt id: from the flags, else Slurm's variables, else one node."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

from trainer.launcher.errors import PreflightError


@dataclass
class Rendezvous:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    attempt: str


def first_slurm_host(nodelist: str) -> str:
    if shutil.which("scontrol"):
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
        )
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    # Without scontrol: the first host of the common forms "node07", "node[07-12,15]", "a,b".
    head = re.match(r"([^,\[]+)(?:\[([^,\]-]+))?", nodelist)
    return head.group(1) + (head.group(2) or "") if head else nodelist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendezvous(args: argparse.Namespace, environ: dict[str, str]) -> Rendezvous:
    job = environ.get("SLURM_JOB_ID")
    nnodes = args.nnodes or int(environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES") or 1)
    node_rank = args.node_rank if args.node_rank is not None else int(environ.get("SLURM_NODEID") or 0)
    if not 0 <= node_rank < nnodes:
        raise PreflightError(f"--node-rank {node_rank} is outside 0..{nnodes - 1}")
    addr = args.master_addr or environ.get("MASTER_ADDR")
    if not addr:
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
        addr = first_slurm_host(nodelist) if nodelist else ("127.0.0.1" if nnodes == 1 else None)
    if not addr:
        raise PreflightError(f"--nnodes {nnodes} outside Slurm needs --master-addr (node 0's address)")
    port = args.master_port or int(environ.get("MASTER_PORT") or 0)
    if not port:
        if job:
            port = 20000 + int(job) % 20000  # the same on every node of the job, without talking
        elif nnodes == 1:
            port = free_port()
        else:
            raise PreflightError(f"--nnodes {nnodes} outside Slurm needs --master-port")
    if environ.get("LINGBOT_ATTEMPT_ID"):
        attempt = environ["LINGBOT_ATTEMPT_ID"]
    elif job:
        # a requeue bumps the restart count; each srun in the job gets a new step id (same on every node)
        attempt = f"slurm{job}-{environ.get('SLURM_RESTART_COUNT') or 0}"
        step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
        if step and step.isdigit():
            attempt += f"-step{step}"
    elif nnodes == 1:
        attempt = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    else:
        raise PreflightError(
            "--nnodes > 1 outside Slurm: set LINGBOT_ATTEMPT_ID to the same new value on every node"
        )
    return Rendezvous(nnodes, node_rank, addr, port, attempt)
