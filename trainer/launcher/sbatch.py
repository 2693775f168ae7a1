"""`bin/train ... --sbatch [FILE]`: a ready Slurm batch script for the same run, submitted as written.

What the script does, and why:
- Resources: one task per node, `--cpus-per-task` (default: one per rank), and a GPU request only when
  asked (`--gpus-per-node N`; default N = NPROC for the full config, none for `--cpu-scale`): the same
  script runs on a CPU partition without GRES.
- `--output=RUN_DIR/slurm-%j.out`: slurmd opens it before the script runs, so writing the script
  creates RUN_DIR (a path that cannot be made is refused with exit 2, like a FILE in a missing dir).
- `--signal=B:USR1@LEAD`: Slurm's time-limit warning goes to the batch shell, which forwards it to the
  running srun step; srun passes it to every process of the step. bin/train turns it into a save.
- The signal rule (what Slurm means by each signal; the README's exit-code section):
    USR1  the time-limit warning, or `scancel --batch --signal=USR1`: "checkpoint and come back".
          The ranks save, bin/train exits 75 and (node 0) runs `scontrol requeue`: Restarts+1, the job
          resumes from that checkpoint.
    TERM  `scancel`, `scontrol requeue`, a preemption, the time limit itself: the ranks save within
          Slurm's KillWait, bin/train exits 75 and does NOT requeue: Slurm's own decision stands (a
          cancel stays CANCELLED; `scontrol requeue` and PreemptMode=REQUEUE requeue the job themselves).
- Preflight first, on every node, with bin/train's own rules (`bin/train ... --preflight-only`: the same
  env choice, tool-env fallback and checks as the run itself; `--require-env` makes a missing
  provisioned env a preflight failure): a broken worker fails in seconds with exit 3, before any rank.
  The training step then passes `--env-checked` (bin/train skips only the compile checks it just ran).
- Each step runs in the background and the shell waits across trapped signals, so a signal that arrives
  during preflight or training is forwarded at once (bash defers traps while a foreground job runs).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXIT_PREFLIGHT = 3
EXIT_STOPPED = 75
DEFAULT_SIGNAL_LEAD_S = 120


class SbatchPathError(Exception):
    """A path the script needs cannot be made; the message names it (bin/train exits 2)."""


class SbatchOptionError(SbatchPathError):
    """Options the script cannot honour together; the message names them (bin/train exits 2)."""


def slurm_seconds(limit: str) -> int | None:
    """sbatch --time in seconds (its forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S); None for no limit
    (unlimited, infinite, 0)."""
    text = limit.strip().lower()
    if text in ("unlimited", "infinite"):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # D-H, D-H:M, D-H:M:S
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:  # M or M:S
        hours, (minutes, seconds) = 0, (parts + [0])[:2]
    total = ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    return total or None  # 0: sbatch's "no time limit" too (a review: it was refused)


@dataclass
class SbatchRequest:
    config: str
    nproc: int
    repo_root: Path
    nnodes: int = 1
    time_limit: str = "24:00:00"
    partition: str | None = None
    account: str | None = None
    env_name: str | None = None
    prefix: Path | None = None
    require_env: bool = False
    run_dir: Path | None = None
    sets: list[str] = field(default_factory=list)
    cpu_scale: bool | None = None
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    signal_lead_s: int = DEFAULT_SIGNAL_LEAD_S
    no_requeue: bool = False
    master_addr: str | None = None
    master_port: int | None = None

    @classmethod
    def from_args(cls, args: Any, repo_root: Path) -> SbatchRequest:
        """From bin/train's parsed command line (trainer/launcher/cli.py)."""
        return cls(
            config=args.config,
            nproc=args.nproc,
            repo_root=repo_root,
            nnodes=args.nnodes or 1,
            time_limit=args.time,
            partition=args.partition,
            account=args.account,
            env_name=args.env,
            prefix=args.prefix,
            require_env=args.require_env,
            run_dir=args.run_dir,
            sets=list(args.set),
            cpu_scale=args.cpu_scale,
            cpus_per_task=args.cpus_per_task,
            gpus_per_node=args.gpus_per_node,
            signal_lead_s=args.signal_lead,
            no_requeue=args.no_requeue,
            master_addr=args.master_addr,
            master_port=args.master_port,
        )

    def resolved_run_dir(self) -> Path:
        return (
            Path(self.run_dir).absolute()
            if self.run_dir
            else self.repo_root.absolute() / "runs" / self.config
        )

    def train_args(self) -> list[str]:
        if self.env_name:
            env_args = ["--env", self.env_name]
        elif self.prefix:
            env_args = ["--prefix", str(Path(self.prefix).absolute())]
        else:
            env_args = []
        from trainer.config.load import anchored_set_item

        args = [self.config, str(self.nproc), *env_args, "--run-dir", str(self.resolved_run_dir())]
        for item in self.sets:  # the script runs from the checkout: a relative path is made the user's
            args += ["--set", anchored_set_item(item)]
        if self.cpu_scale is not None:
            args.append("--cpu-scale" if self.cpu_scale else "--no-cpu-scale")
        if self.require_env:
            args.append("--require-env")
        if self.no_requeue:
            args.append("--no-requeue")
        if self.master_addr:
            args += ["--master-addr", self.master_addr]
        if self.master_port:
            args += ["--master-port", str(self.master_port)]
        return args

    def check(self) -> None:
        """SbatchOptionError for options the script cannot honour."""
        for name, value in (("--run-dir", str(self.resolved_run_dir())), ("--partition", self.partition),
                            ("--account", self.account)):  # fmt: skip
            if value and ("\n" in value or "\r" in value):  # sbatch stops reading #SBATCH lines there
                raise SbatchOptionError(f"{name} {value!r}: a line break cannot go into an #SBATCH line")
        limit = slurm_seconds(self.time_limit)
        if limit is not None and limit <= self.signal_lead_s:
            raise SbatchOptionError(
                f"--time {self.time_limit} is not longer than --signal-lead {self.signal_lead_s} s: Slurm's "
                "time-limit warning (save and requeue) would come as the job starts; give a longer --time or "
                "a shorter --signal-lead"
            )

    def gpus(self) -> int:
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        return 0 if self.cpu_scale else self.nproc


def directives(req: SbatchRequest) -> list[str]:
    """The #SBATCH options (module docstring)."""
    out = [
        f"--job-name=lingbot-{req.config}",
        f"--nodes={req.nnodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={req.cpus_per_task or req.nproc}",
    ]
    if req.gpus():
        out.append(f"--gpus-per-node={req.gpus()}")
    out += [
        f"--time={req.time_limit}",
        f"--signal=B:USR1@{req.signal_lead_s}",
        "--requeue",
        "--open-mode=append",
        f"--output={req.resolved_run_dir()}/slurm-%j.out",
    ]
    if req.partition:
        out.append(f"--partition={req.partition}")
    if req.account:
        out.append(f"--account={req.account}")
    return out


def render_sbatch(req: SbatchRequest) -> str:
    repo_root = Path(req.repo_root).absolute()
    train_args = req.train_args()
    header = "\n".join(f"#SBATCH {d}" for d in directives(req))
    q = shlex.quote
    train = " ".join(q(a) for a in ["bin/train", *train_args])
    # one comment line whatever the values hold: a newline would end it, and sbatch stops reading #SBATCH
    # directives at the first line that is not a comment
    generated_by = shlex.join(train_args).replace("\r", "\\r").replace("\n", "\\n")
    requeue = "" if req.no_requeue else 'if [ "$stop" = USR1 ]; then scontrol requeue "$SLURM_JOB_ID"; fi\n  '
    return f"""#!/usr/bin/env bash
# Generated by: bin/train {generated_by} --sbatch
# Submit as is: sbatch <this file>. Exit codes: 0 done, 1 failed, 3 preflight failed, 75 stopped with a
# checkpoint saved (USR1: bin/train requeued the job; TERM: Slurm's cancel or requeue stands).
{header}
set -uo pipefail
cd {q(str(repo_root))} || exit {EXIT_PREFLIGHT}

step_pid=""
stop=""
# Forward Slurm's signals to the running srun step (srun passes them to every process of the step).
trap 'stop=USR1; [ -z "$step_pid" ] || kill -USR1 "$step_pid" 2>/dev/null' USR1
trap 'stop=TERM; [ -z "$step_pid" ] || kill -TERM "$step_pid" 2>/dev/null' TERM

# run_step CMD...: one task per node in the background, waited for across trapped signals.
# (No --kill-on-bad-exit: a node exiting 75 first must not kill node 0 before it writes the summary.)
run_step() {{
  srun --ntasks-per-node=1 "$@" &
  step_pid=$!
  local status
  while true; do
    wait "$step_pid"
    status=$?
    kill -0 "$step_pid" 2>/dev/null || break  # still running: wait was interrupted by a trapped signal
  done
  step_pid=""
  return "$status"
}}

# A signal between the steps: nothing ran that could save; USR1 still means "come back later".
stopped_between_steps() {{
  echo "received $stop before training started: stopping (exit {EXIT_STOPPED})" >&2
  {requeue}exit {EXIT_STOPPED}
}}

# Preflight on every node with bin/train's own rules (env choice, compilers, run dir), before any rank.
run_step {train} --preflight-only
status=$?
if [ "$status" -ne 0 ]; then
  # (75: stopped during preflight; after a signal, srun's status is the signal's, not a failed check)
  if [ "$status" -ne {EXIT_STOPPED} ] && [ -z "$stop" ]; then
    echo "preflight failed on a worker (exit $status): see above" >&2
  fi
  exit "$status"
fi
[ -z "$stop" ] || stopped_between_steps

# The same command; --env-checked: the compile checks just passed on these nodes (not run twice).
run_step {train} --env-checked
exit $?
"""


def write_sbatch(req: SbatchRequest, target: str) -> tuple[str, Path | None]:
    """The script, with RUN_DIR made (slurmd opens --output there before the script runs) and, for a
    FILE target, the file written atomically. Raises SbatchPathError naming a path that cannot be made
    (SbatchOptionError: options it cannot honour), before anything is made."""
    from provision.atomic import write_atomic

    req.check()
    path = None if target == "-" else Path(target)
    if path is not None and not path.parent.is_dir():
        raise SbatchPathError(f"--sbatch {path}: directory {path.parent} does not exist; create it first")
    run_dir = req.resolved_run_dir()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SbatchPathError(
            f"run dir {run_dir} cannot be created ({exc.strerror}): Slurm opens its output file "
            f"{run_dir}/slurm-<job>.out there before the script runs; pass a --run-dir you can write"
        ) from None
    script = render_sbatch(req)
    if path is None:
        return script, None
    try:
        write_atomic(path, script, mode=0o755)
    except OSError as exc:
        raise SbatchPathError(f"--sbatch {path}: cannot write it ({exc.strerror})") from None
    return script, path
