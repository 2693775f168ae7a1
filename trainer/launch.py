"""bin/train: choose the env, preflight, run torchrun, and report the outcome honestly.

    bin/train CONFIG NPROC [--env NAME | --prefix P] [--run-dir DIR] [--set key=value ...]
              [--cpu-scale | --no-cpu-scale] [--nnodes N --node-rank R --master-addr A --master-port P]
              [--sbatch [FILE] [--time T] [--partition P] [--account A]]

The same path on one node and many: torchrun (`python -m torch.distributed.run` from the env's python)
with a static rendezvous, its parameters taken from the flags, else Slurm's variables, else one node.
The env's variables are applied here (provision.envvars.job_environment), not by shell activation.

Exit codes (also in summary.json as exit_code):
     0  the requested steps are done (also: a re-run of a finished run, which trains nothing)
     1  training failed; the summary names the failing rank and its error
     2  bad command line or config (unknown config, bad --set): nothing is written
     3  preflight failed (env missing or incomplete, a check failed, run dir not writable, checkpoint
        incompatible with the config): no rank started, no checkpoint touched
    75  preempted (SIGTERM/SIGUSR1): a checkpoint was saved; run the same command again to resume
        (under Slurm the job is requeued when allowed)

Success is decided from what the ranks recorded, not from torchrun's exit status alone: a rank that
aborts in teardown after recording completion does not fail the run, and a zero exit status with a rank
that never recorded completion does not pass it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import psutil  # at import time: rank_pids runs in signal handlers, where a first import can re-enter

from provision.atomic import write_atomic
from trainer import summary as summaries
from trainer.checkpoint import resume_conflicts, scan
from trainer.config import CONFIG_DIR, ConfigError, RunConfig, load_config, parse_set
from trainer.summary import EXIT_OK, EXIT_PREEMPTED, EXIT_PREFLIGHT, EXIT_USAGE

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ENV = "lingbot-b200"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
KEEP_ATTEMPTS = 10


def say(message: str) -> None:
    print(f"[bin/train] {message}", file=sys.stderr, flush=True)


class PreflightError(Exception):
    """A reason not to start any rank; the message says what is wrong and how to fix it."""


# --- the command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bin/train",
        description="Train CONFIG on NPROC ranks per node with torchrun; auto-resumes, survives preemption.",
        epilog="exit codes: 0 done, 1 failed, 2 bad usage/config, 3 preflight failed, 75 preempted (resume me)",
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


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# --- which env -------------------------------------------------------------------------------------


@dataclass
class EnvChoice:
    prefix: Path
    python: Path
    provisioned: bool  # False: the tool environment (.venv) running this launcher
    why: str = ""


def tool_env() -> EnvChoice:
    return EnvChoice(Path(sys.prefix), Path(sys.executable), provisioned=False)


def resolve_env(name: str | None, prefix: Path | None, environ: dict[str, str]) -> EnvChoice:
    """--env/--prefix must name a complete env; without them: $CONDA_PREFIX, the default env, the tool env."""
    from provision.prefix import completeness, envs_dir, resolve_prefix

    if name is not None or prefix is not None:
        chosen = resolve_prefix(name=name, prefix=prefix)
        ok, reason = completeness(chosen)
        if not ok:
            raise PreflightError(f"env {chosen} is not usable: {reason}")
        return _provisioned(chosen, "as asked")
    skipped = []
    candidates = []
    if environ.get("CONDA_PREFIX"):
        candidates.append((Path(environ["CONDA_PREFIX"]), "$CONDA_PREFIX"))
    candidates.append((envs_dir() / DEFAULT_ENV, "the default env"))
    for candidate, label in candidates:
        ok, reason = completeness(candidate)
        if ok:
            return _provisioned(candidate, label)
        skipped.append(f"{label} {candidate}: {reason}")
    choice = tool_env()
    choice.why = "; ".join(skipped)
    return choice


def _provisioned(prefix: Path, why: str) -> EnvChoice:
    python = prefix / "bin" / "python"
    if not os.access(python, os.X_OK):
        raise PreflightError(f"env {prefix} has no {python}; re-run bin/provision")
    return EnvChoice(prefix, python, provisioned=True, why=why)


def job_environment(choice: EnvChoice, base: dict[str, str]) -> dict[str, str]:
    """What the ranks run with: the env's variables applied to `base`, and this checkout importable."""
    if choice.provisioned:
        from provision.envvars import job_environment as env_job_environment

        env = env_job_environment(choice.prefix, base)
    else:
        env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def localise_compile_caches(env: dict[str, str], scratch: Path, job: str) -> list[str]:
    """Point Triton's/Inductor's caches at a node-local copy when they live on a network filesystem.

    Ranks compiling into one cache over NFS race on its locks and renames; a per-job local directory
    seeded from the shared cache keeps the warm entries without the race. Returns what was done.
    """
    from provision.nodeinfo import filesystem_type, is_network_fs

    notes = []
    defaults = {"TRITON_CACHE_DIR": str(Path(env.get("HOME", Path.home())) / ".triton" / "cache")}
    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        shared = env.get(var) or defaults.get(var)
        if not shared:
            continue
        try:
            fstype = filesystem_type(shared)
        except (OSError, ValueError):
            continue
        if not is_network_fs(fstype):
            continue
        local = scratch / f"lingbot-{job}-{var.lower()}"
        if Path(shared).is_dir():
            shutil.copytree(shared, local, dirs_exist_ok=True, symlinks=True)
        local.mkdir(parents=True, exist_ok=True)
        env[var] = str(local)
        notes.append(f"{var} {shared} is on {fstype}: this job uses the node-local copy {local}")
    return notes


# --- preflight -------------------------------------------------------------------------------------


def check_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise PreflightError(
            f"run dir {run_dir} is not writable ({exc}); pass a writable --run-dir"
        ) from None


# Checks of a provisioned env's own bookkeeping (manifest, lock, variables file, sysroot): they cannot
# apply to the tool environment, which bin/provision did not make.
TOOL_ENV_NOT_APPLICABLE = frozenset(
    {
        "env.complete",
        "env.lock",
        "variables.file",
        "variables.CC",
        "variables.CXX",
        "toolchain.sysroot",
        "node.glibc",
    }
)


def env_checks(choice: EnvChoice, env: dict[str, str]) -> list[str]:
    """bin/envcheck's fast subset (compilers, caches, node); returns notes, raises PreflightError on a FAIL."""
    from provision.check import FAIL, SKIP, WARN, run_checks

    report = run_checks(
        choice.prefix, worker=False, fast=True, env=env, compile_as_caller=not choice.provisioned
    )
    notes, failures, not_applicable, skipped = [], [], [], []  # skipped: Check objects
    for check in report.checks:
        if check.status == FAIL and not choice.provisioned and check.name in TOOL_ENV_NOT_APPLICABLE:
            not_applicable.append(check.name)
        elif check.status == FAIL:
            failures.append(
                f"{check.name}: {check.message}" + (f"\n    fix: {check.fix}" if check.fix else "")
            )
        elif check.status == WARN:
            notes.append(f"envcheck WARN {check.name}: {check.message}")
        elif check.status == SKIP and not choice.provisioned:
            skipped.append(check)
    if failures:
        raise PreflightError(f"bin/envcheck --fast failed for {choice.prefix}:\n  " + "\n  ".join(failures))
    if not_applicable:
        notes.append(f"tool environment: not applicable, skipped: {', '.join(not_applicable)}")
    by_reason: dict[str, list[str]] = {}
    for check in skipped:
        by_reason.setdefault(check.message, []).append(check.name)
    for reason, names in by_reason.items():
        notes.append(f"tool environment: envcheck skipped {', '.join(names)}: {reason}")
    return notes


# --- rendezvous ------------------------------------------------------------------------------------


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


def torchrun_command(
    choice: EnvChoice,
    args: argparse.Namespace,
    rdzv: Rendezvous,
    run_dir: Path,
    cpu_scale: bool,
    attempt_dir: Path,
) -> list[str]:
    command = [
        str(choice.python), "-m", "torch.distributed.run",
        "--nnodes", str(rdzv.nnodes), "--node-rank", str(rdzv.node_rank), "--nproc-per-node", str(args.nproc),
        "--master-addr", rdzv.master_addr, "--master-port", str(rdzv.master_port),
        "--rdzv-id", rdzv.attempt, "--max-restarts", "0", "--log-dir", str(attempt_dir / f"node{rdzv.node_rank}"),
        "-m", "trainer.train", "--config", args.config, "--run-dir", str(run_dir),
        "--cpu-scale" if cpu_scale else "--no-cpu-scale",
    ]  # fmt: skip
    for item in args.set:
        command += ["--set", item]
    return command


# --- running torchrun ------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the launcher dies (kill -9 included), so torchrun never orphans."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Torchrun:
    """torchrun as a child in its own session; stop requests go to the ranks, not to torchrun itself
    (torchrun answers SIGTERM by signalling the ranks and SIGKILLing them 30 s later, mid-save)."""

    def __init__(self, command: list[str], env: dict[str, str], attempt_dir: Path):
        self.stop_file = attempt_dir / "stop"
        self.signals: list[str] = []
        self.stderr_tail: deque[str] = deque(maxlen=400)
        self.proc: subprocess.Popen | None = None
        for sig in FORWARDED_SIGNALS:  # before Popen: from here on a signal is a stop request
            signal.signal(sig, self.request_stop)
        self.proc = subprocess.Popen(
            command, env=env, stderr=subprocess.PIPE, text=True, errors="replace",
            start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip
        # The pump thread must never take a stop signal: the kernel may deliver a process-directed signal
        # to any thread that does not block it, and then the main thread, blocked in waitpid, would not
        # run the handler until torchrun exits. The thread inherits the mask set around its start.
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
        try:
            self._pump = threading.Thread(target=self._copy_stderr, daemon=True)
            self._pump.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)

    def _copy_stderr(self) -> None:
        # The ranks' stderr comes through torchrun: pass it on, keep the end to name a killed rank.
        for line in self.proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            self.stderr_tail.append(line)

    def request_stop(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        first = not self.signals
        self.signals.append(name)
        self.stop_file.touch()
        for pid in self.rank_pids():
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        if first:
            say(
                f"received {name}: every rank stops at its next safe point and saves a checkpoint "
                f"(further signals change nothing; even kill -9 keeps the previous checkpoint)"
            )
        else:
            say(f"received {name} again: the stop is already under way")

    def rank_pids(self) -> list[int]:
        if self.proc is None:  # not started yet: the stop file alone tells the ranks
            return []
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []
        pids = []
        for child in children:
            try:
                if "trainer.train" in " ".join(child.cmdline()):
                    pids.append(child.pid)
            except psutil.Error:
                pass
        return pids

    def wait(self) -> int:
        rc = self.proc.wait()
        for sig in FORWARDED_SIGNALS:  # the ranks are gone: what is left is writing the summary
            signal.signal(sig, _too_late)
        self._pump.join(timeout=10)
        return rc


def _too_late(signum, frame) -> None:
    say(f"received {signal.Signals(signum).name} after the ranks exited: finishing the summary")


class StopBeforeStart(Exception):
    """A stop signal that arrived before torchrun started: nothing trained, nothing to save."""


# --- the verdict -----------------------------------------------------------------------------------

_COMM_ERROR = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|Socket Timeout|timed out|DistNetworkError|"
    r"DistBackendError|NCCL communicator was aborted|ProcessGroup.*(abort|shut)|recvBytes|sendBytes|"
    r"Application timeout caused pair closure|TCPStore",
    re.IGNORECASE,
)
_SIGNAL_LINE = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID (\d+)")
_EXIT_LINE = re.compile(r"exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")


@dataclass
class Verdict:
    status: str
    reason: str | None = None
    failed_rank: int | None = None
    rank_error: str | None = None
    notes: list[str] = field(default_factory=list)


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def torchrun_error_files(attempt_dir: Path, nproc: int) -> dict[int, dict]:
    """Per global rank: the error file torchrun's @record wrote for an uncaught exception."""
    found = {}
    for path in attempt_dir.glob("node*/*/attempt_*/*/error.json"):
        node = int(path.parts[-5][4:]) if path.parts[-5][4:].isdigit() else 0
        data = read_json(path)
        if data and path.parent.name.isdigit():
            message = data.get("message")
            if isinstance(message, dict):
                text = message.get("message", "")
                stamp = (message.get("extraInfo") or {}).get("timestamp")
            else:
                text, stamp = str(message), None
            found[node * nproc + int(path.parent.name)] = {"error": text, "time": float(stamp or 0) or None}
    return found


def _killed_by(stderr_tail: list[str], pid: int | None) -> str | None:
    if pid is None:
        return None
    text = "".join(stderr_tail)
    for _number, name, killed in _SIGNAL_LINE.findall(text):
        if int(killed) == pid:
            return f"killed by {name}"
    for code, exited in _EXIT_LINE.findall(text):
        if int(exited) == pid and int(code) < 0:
            try:
                return f"killed by {signal.Signals(-int(code)).name}"
            except ValueError:
                return f"killed by signal {-int(code)}"
    return None


def verdict(
    world_size: int,
    nproc: int,
    attempt_dir: Path,
    run_dir: Path,
    attempt: str,
    rc: int,
    stderr_tail: list[str],
) -> Verdict:
    records = {r: read_json(attempt_dir / f"rank_{r}.json") for r in range(world_size)}
    states = {r: (rec or {}).get("status", "never started") for r, rec in records.items()}
    rank_summary = summaries.read_summary(run_dir)
    if rank_summary is not None and rank_summary.get("attempt") != attempt:
        rank_summary = None
    finished = rank_summary.get("status") if rank_summary else None
    teardown = (
        [f"torchrun exited {rc} after every rank recorded its result (a teardown hiccup, e.g. SIGABRT "
         f"after destroy_process_group): ignored"] if rc != 0 else []
    )  # fmt: skip
    if finished == summaries.COMPLETED and all(s == summaries.COMPLETED for s in states.values()):
        return Verdict(summaries.COMPLETED, notes=teardown)
    if finished == summaries.PREEMPTED and all(
        s in (summaries.COMPLETED, summaries.PREEMPTED) for s in states.values()
    ):
        return Verdict(summaries.PREEMPTED, reason=rank_summary.get("reason"), notes=teardown)

    # Failed. Name the rank that caused it: a real error beats a rank that vanished, which beats a
    # communication error (what the survivors see when a peer dies).
    errors = torchrun_error_files(attempt_dir, nproc)
    for r, rec in records.items():
        if rec and rec.get("status") == summaries.FAILED:
            errors[r] = {"error": rec.get("error", ""), "time": rec.get("time")}
    real = sorted((e["time"] or 0, r) for r, e in errors.items() if not _COMM_ERROR.search(e["error"]))
    vanished = [r for r, s in states.items() if s in ("running", "never started") and r not in errors]
    comm = sorted((e["time"] or 0, r) for r, e in errors.items() if _COMM_ERROR.search(e["error"]))
    if real:
        rank = real[0][1]
        error = errors[rank]["error"]
    elif vanished and any(states[r] == "running" for r in vanished):
        rank = next(r for r in vanished if states[r] == "running")
        pid = records[rank].get("pid")
        how = _killed_by(stderr_tail, pid) or "killed by a signal or crashed in native code"
        error = (
            f"rank {rank} (pid {pid} on {records[rank].get('host')}) died without reporting an error: {how}"
        )
    elif comm:
        rank = comm[0][1]
        error = errors[rank]["error"]
    elif all(s == "never started" for s in states.values()):
        return Verdict(
            summaries.FAILED, reason=f"torchrun exited {rc} before any rank started (its output is above)"
        )
    else:
        unfinished = ", ".join(f"rank {r}: {s}" for r, s in states.items() if s != summaries.COMPLETED)
        return Verdict(
            summaries.FAILED, reason=f"torchrun exited {rc} but not every rank finished ({unfinished})"
        )
    others = [f"rank {r}: {s}" for r, s in states.items() if r != rank]
    return Verdict(
        summaries.FAILED,
        reason=f"rank {rank} failed: {error.splitlines()[0] if error else '?'}",
        failed_rank=rank,
        rank_error=error,
        notes=[f"other ranks: {', '.join(others)}"] if others else [],
    )


def requeue(environ: dict[str, str]) -> str:
    """Ask Slurm to requeue this job (it then restarts from the checkpoint just saved)."""
    job = environ["SLURM_JOB_ID"]
    if not shutil.which("scontrol"):
        return "not requeued: scontrol not found"
    out = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    if out.returncode == 0:
        return f"requeued Slurm job {job}"
    return f"not requeued: scontrol requeue {job} said: {(out.stderr or out.stdout).strip()}"


# --- main ------------------------------------------------------------------------------------------


def default_run_dir(config: str) -> Path:
    return REPO_ROOT / "runs" / config


def preflight_failed(run_dir: Path, cfg: RunConfig, message: str, started: float) -> int:
    """Say why, and record it in summary.json (no checkpoint or attempt is touched: not progress)."""
    say(f"preflight failed: {message}")
    previous = summaries.read_summary(run_dir)
    if previous and previous.get("status") == summaries.PREFLIGHT_FAILED:
        previous = previous.get("previous")  # keep the last run that trained, not a chain of failures
    complete, _ = scan(run_dir / "checkpoints")
    try:
        summaries.write_summary(
            run_dir,
            summaries.make_summary(
                summaries.PREFLIGHT_FAILED,
                steps_requested=cfg.train.steps,
                reason=message,
                last_complete_checkpoint=_ckpt_json(complete[-1]) if complete else None,
                wall_time_s=time.perf_counter() - started,
                previous_status=previous.get("status") if previous else None,
                previous=previous,  # the last real run's outcome (losses, steps) is kept, not overwritten
                config=cfg.name,
            ),
        )
    except OSError as exc:
        say(f"could not write the summary: {exc}")
    return EXIT_PREFLIGHT


def _ckpt_json(info) -> dict:
    return {"step": info.step, "path": str(info.path)}


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    known: dict = {}  # run_dir and cfg, once resolved: for the summary of an early stop

    def stop_before_start(signum, frame):
        raise StopBeforeStart(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop_before_start) for sig in FORWARDED_SIGNALS}
    try:
        return _main(args, started, known)
    except StopBeforeStart as exc:
        say(f"received {exc} before any rank started: stopping; nothing was trained (exit {EXIT_PREEMPTED})")
        if "cfg" in known and known["run_dir"].is_dir():
            summaries.write_summary(
                known["run_dir"],
                summaries.make_summary(
                    summaries.PREEMPTED,
                    steps_requested=known["cfg"].train.steps,
                    reason=f"received {exc} before any rank started",
                    wall_time_s=time.perf_counter() - started,
                    config=known["cfg"].name,
                ),
            )
        return EXIT_PREEMPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(args: argparse.Namespace, started: float, known: dict) -> int:
    environ = dict(os.environ)
    gpus = 0 if args.sbatch is not None else gpu_count()
    # On a machine without a GPU the config's cpu_scale block applies unless asked otherwise.
    cpu_scale = args.cpu_scale if args.cpu_scale is not None else (args.sbatch is None and gpus == 0)
    try:
        cfg = load_config(args.config, cpu_scale=cpu_scale, overrides=parse_set(args.set))
    except ConfigError as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    if args.sbatch is not None:
        return write_sbatch(args)
    config_file = CONFIG_DIR / f"{args.config}.yaml"
    if cpu_scale and args.cpu_scale is None:
        say(f"no GPU found: running the cpu_scale variant of {config_file} ({cfg.train.steps} steps, "
            f"dim {cfg.model.dim}, depth {cfg.model.depth}); --no-cpu-scale runs the full config")  # fmt: skip
    elif cpu_scale:
        say(f"--cpu-scale: running the cpu_scale variant of {config_file}")
    run_dir = (args.run_dir or default_run_dir(args.config)).absolute()
    known.update(run_dir=run_dir, cfg=cfg)

    # A finished run stays finished: say so, train nothing.
    complete, _ = scan(run_dir / "checkpoints")
    if complete and complete[-1].step >= cfg.train.steps:
        say(
            f"run complete: {complete[-1].path} is step {complete[-1].step} of {cfg.train.steps}; nothing to train "
            f"(summary: {summaries.summary_path(run_dir)}; raise train.steps with --set to train further)"
        )
        return EXIT_OK

    try:
        check_run_dir(run_dir)
    except PreflightError as exc:
        say(f"preflight failed: {exc}")
        return EXIT_PREFLIGHT
    try:
        rdzv = rendezvous(args, environ)
        world_size = rdzv.nnodes * args.nproc
        if gpus and args.nproc > gpus:
            raise PreflightError(f"NPROC {args.nproc} is more than the {gpus} GPUs on this node")
        if complete:
            conflicts = resume_conflicts(complete[-1].train_state(), cfg, world_size)
            if conflicts:
                raise PreflightError(f"cannot resume from {complete[-1].path}: " + "; ".join(conflicts))
        choice = resolve_env(args.env, args.prefix, environ)
        if not choice.provisioned:
            say(f"no provisioned env found; running in the tool environment {choice.prefix} "
                f"(provision one with bin/provision {DEFAULT_ENV})")  # fmt: skip
            if choice.why:
                say(f"  looked at: {choice.why}")
        else:
            say(f"env {choice.prefix} ({choice.why})")
        env = job_environment(choice, environ)
        for note in env_checks(choice, env):
            say(note)
    except (PreflightError, OSError, ValueError) as exc:
        return preflight_failed(run_dir, cfg, str(exc), started)

    try:  # what can still go wrong before a rank starts is a preflight failure, with a summary
        job = environ.get("SLURM_JOB_ID") or f"pid{os.getpid()}"
        scratch = Path(environ.get("SLURM_TMPDIR") or environ.get("TMPDIR") or tempfile.gettempdir())
        for note in localise_compile_caches(env, scratch, job):
            say(note)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))

        attempt_dir = run_dir / "attempts" / rdzv.attempt
        if rdzv.node_rank == 0 and attempt_dir.exists() and any(attempt_dir.iterdir()):
            # its stop file and rank records belong to another launch: reusing them would forge the verdict
            raise PreflightError(
                f"attempt {rdzv.attempt} already ran in {attempt_dir}; set LINGBOT_ATTEMPT_ID to a new value "
                f"(under Slurm: run bin/train once per srun step)"
            )
        attempt_dir.mkdir(parents=True, exist_ok=True)
    except (PreflightError, OSError) as exc:
        return preflight_failed(run_dir, cfg, str(exc), started)
    _prune_attempts(run_dir / "attempts", keep=KEEP_ATTEMPTS)
    env["LINGBOT_ATTEMPT_DIR"] = str(attempt_dir)
    command = torchrun_command(choice, args, rdzv, run_dir, cpu_scale, attempt_dir)
    say(f"run dir {run_dir}; attempt {rdzv.attempt}; {rdzv.nnodes} node(s) x {args.nproc} rank(s)")
    say("$ " + shlex.join(command))

    torchrun = Torchrun(command, env, attempt_dir)
    rc = torchrun.wait()
    result = verdict(
        world_size, args.nproc, attempt_dir, run_dir, rdzv.attempt, rc, list(torchrun.stderr_tail)
    )
    if torchrun.signals and result.status == summaries.COMPLETED:
        result.notes.append(f"{', '.join(torchrun.signals)} arrived after the last step: the run is complete")
    exit_code = summaries.EXIT_CODES[result.status]
    if rdzv.node_rank == 0:
        write_final_summary(
            run_dir, cfg, rdzv, world_size, choice, result, rc, exit_code, started, attempt_dir
        )
    for note in result.notes:
        say(note)
    if result.status == summaries.COMPLETED:
        say(f"completed {cfg.train.steps} steps; summary {summaries.summary_path(run_dir)}")
    elif result.status == summaries.PREEMPTED:
        say(f"preempted ({result.reason}); run the same command again to resume (exit {EXIT_PREEMPTED})")
        if environ.get("SLURM_JOB_ID") and rdzv.node_rank == 0 and not args.no_requeue:
            say(requeue(environ))
    else:
        say(f"FAILED: {result.reason}")
        if result.rank_error and result.rank_error.strip() != (result.reason or "").strip():
            say("error of that rank:\n" + result.rank_error.rstrip())
        say(
            f"summary {summaries.summary_path(run_dir)}; the next run resumes from the last complete checkpoint"
        )
    return exit_code


def write_final_summary(
    run_dir, cfg, rdzv, world_size, choice, result: Verdict, rc, exit_code, started, attempt_dir
) -> None:
    """summary.json as the launcher sees the outcome: rank 0's summary (if this attempt wrote one) plus
    the verdict, the exit code, torchrun's exit status and the launcher's wall time."""
    base = summaries.read_summary(run_dir)
    if base is None or base.get("attempt") != rdzv.attempt:  # rank 0 did not get to write one
        progress = read_json(attempt_dir / "progress.json") or {}
        complete, _ = scan(run_dir / "checkpoints")
        base = {
            "first_step": progress.get("first_step"),
            "last_step": progress.get("last_step"),
            "resumed_from": progress.get("resumed_from"),
            "final_losses": progress.get("final_losses"),
            "last_complete_checkpoint": _ckpt_json(complete[-1]) if complete else None,
        }
    base.pop("written_at", None)
    for key in ("status", "exit_code", "reason", "steps_requested", "failed_rank", "rank_error"):
        base.pop(key, None)
    summaries.write_summary(
        run_dir,
        summaries.make_summary(
            result.status,
            steps_requested=cfg.train.steps,
            reason=result.reason,
            exit_code=exit_code,
            **{
                **base,
                "failed_rank": result.failed_rank,
                "rank_error": result.rank_error,
                "wall_time_s": time.perf_counter() - started,
                "torchrun_exit_code": rc,
                "notes": result.notes,
                "attempt": rdzv.attempt,
                "nnodes": rdzv.nnodes,
                "world_size": world_size,
                "env": {"prefix": str(choice.prefix), "provisioned": choice.provisioned},
                "config": cfg.name,
            },
        ),
    )


def _prune_attempts(root: Path, keep: int) -> None:
    attempts = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for old in attempts[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def write_sbatch(args: argparse.Namespace) -> int:
    from trainer.sbatch import render_sbatch

    script = render_sbatch(
        config=args.config,
        nproc=args.nproc,
        nnodes=args.nnodes or 1,
        time_limit=args.time,
        partition=args.partition,
        account=args.account,
        env_name=args.env,
        prefix=args.prefix,
        run_dir=args.run_dir,
        sets=args.set,
        cpu_scale=args.cpu_scale,
        repo_root=REPO_ROOT,
    )
    if args.sbatch == "-":
        sys.stdout.write(script)
        return EXIT_OK
    path = Path(args.sbatch)
    write_atomic(path, script, mode=0o755)
    say(f"wrote {path}; submit it with: sbatch {path}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
