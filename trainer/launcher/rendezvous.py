"""torchrun's rendezvous and the attempt id: from the flags, else Slurm's variables, else one node.

Several nodes use torchrun's static rendezvous on node 0's address and a port every node derives alike
(the flags, $MASTER_PORT, else 20000 + the Slurm job id % 20000). One node without a port given uses
`torchrun --standalone` (`master_port` None): torchrun's store binds port 0 itself, so no other process
can take the port between its choice and its use (a port picked here and bound seconds later by torchrun
was once taken meanwhile on a loaded host: EADDRINUSE, the attempt failed before any rank started).
One node meets on loopback: `--local-addr 127.0.0.1` (else torchrun advertises the node's hostname to its
ranks, and a hostname that does not resolve left them retrying to connect for 5 minutes in silence), or on
the address the user gave (--master-addr, $MASTER_ADDR), which is honoured on one node too.

The launcher watches the meeting (supervise.py): no rank started on this node within RENDEZVOUS_S is said
in one line with its likely cause (`overdue`); on one node that ends the attempt (failed, exit 1), on
several it is said once and torchrun's own join timeout decides (another node may start late)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

from trainer import testhooks
from trainer.launcher.errors import PreflightError

RENDEZVOUS_S = 60.0  # torchrun starts its ranks within seconds of meeting: a minute without one is said


@dataclass
class Rendezvous:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int | None  # None: one node, `torchrun --standalone` binds a free port itself
    attempt: str

    def torchrun_flags(self) -> list[str]:
        """How torchrun meets: --standalone on one node without a port given, else the static rendezvous."""
        if self.master_port is None:  # the store's port is torchrun's own; its address is ours
            return ["--standalone", "--local-addr", self.master_addr]
        port = str(self.master_port)
        return ["--master-addr", self.master_addr, "--master-port", port, "--rdzv-id", self.attempt]


INT_VARIABLES = ("SLURM_NODEID", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_RESTART_COUNT", "MASTER_PORT")


def bad_int_variable(environ: dict[str, str], args: argparse.Namespace) -> str | None:
    """The first of INT_VARIABLES this launch reads that is set to something other than a whole number
    (read with int(): a traceback, exit 1 and no summary before), said with its fix; None when they all
    read. --sbatch and --plan read none; an option given reads none of its variables."""
    if getattr(args, "sbatch", None) is not None or getattr(args, "plan", False):
        return None
    given = {
        "MASTER_PORT": args.master_port is not None,
        "SLURM_NODEID": args.node_rank is not None,
        "SLURM_NNODES": args.nnodes is not None,
        "SLURM_JOB_NUM_NODES": args.nnodes is not None,
    }
    for name in INT_VARIABLES:
        if given.get(name):
            continue
        value = environ.get(name)
        if value and not value.strip().isdigit():
            return f"the environment's {name}={value!r} is not a whole number; unset it or set it right"
    return None


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


def rendezvous(args: argparse.Namespace, environ: dict[str, str]) -> Rendezvous:
    job = environ.get("SLURM_JOB_ID")
    nnodes = args.nnodes or int(environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES") or 1)
    node_rank = args.node_rank if args.node_rank is not None else int(environ.get("SLURM_NODEID") or 0)
    if not 0 <= node_rank < nnodes:
        raise PreflightError(f"--node-rank {node_rank} is outside 0..{nnodes - 1}")
    addr = args.master_addr or environ.get("MASTER_ADDR")
    if not addr and nnodes == 1:
        addr = "127.0.0.1"  # one node meets on loopback, whatever its hostname resolves to
    if not addr:
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
        addr = first_slurm_host(nodelist) if nodelist else None
    if not addr:
        raise PreflightError(f"--nnodes {nnodes} outside Slurm needs --master-addr (node 0's address)")
    port: int | None = args.master_port or int(environ.get("MASTER_PORT") or 0) or None
    if port is None and nnodes > 1:
        if not job:
            raise PreflightError(f"--nnodes {nnodes} outside Slurm needs --master-port")
        port = 20000 + int(job) % 20000  # the same on every node of the job, without talking
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


def rendezvous_limit() -> float:
    return testhooks.rendezvous_s(RENDEZVOUS_S)


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return True


def overdue(rdzv: Rendezvous, waited_s: float) -> str:
    """The line for a meeting that has started no rank on this node within waited_s: its likely cause."""
    where = f"{rdzv.master_addr}" + (f":{rdzv.master_port}" if rdzv.master_port else "")
    head = f"torchrun's rendezvous at {where} has not completed in {waited_s:.0f} s (no rank started here)"
    host = socket.gethostname()
    if not _resolves(rdzv.master_addr):
        cause = (
            f"{rdzv.master_addr!r} (--master-addr / MASTER_ADDR) does not resolve on this node; "
            + ("unset it (one node meets on 127.0.0.1) or give an address of this node"
               if rdzv.nnodes == 1 else "give node 0's resolvable name or IP address")
        )  # fmt: skip
    elif rdzv.nnodes == 1:
        cause = f"its store at {where} does not answer (is it an address of this node, {host!r}?)"
    elif not _resolves(host):
        cause = f"this node's hostname {host!r} does not resolve (torchrun advertises it to the other nodes)"
    else:
        cause = (
            f"another of the {rdzv.nnodes} nodes has not joined yet, or node 0's {where} is not reachable "
            "from here (a firewall, a wrong address)"
        )
    return f"{head}: likely cause: {cause}"
