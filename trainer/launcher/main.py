"""bin/train: choose the env, preflight, run torchrun, and report the outcome honestly.

The same path on one node and many: torchrun (`python -m torch.distributed.run` from the env's python)
with a static rendezvous, its parameters taken from the flags, else Slurm's variables, else one node.

Exit codes (also in summary.json as exit_code):
     0  the requested steps are done (also: a re-run of a finished run, which trains nothing)
     1  training failed; the summary names the failing rank and its error (or `diverged`: NaN/Inf)
     2  bad command line or config (unknown config, bad --set): nothing is written
     3  preflight failed (env missing or incomplete, a check failed, run dir not writable, checkpoint
        incompatible with the config): no rank started, no checkpoint touched
    73  the run dir is held by another live bin/train (RUN_DIR/owner.json names it): nothing written
    75  stopped by a signal (SIGUSR1/SIGTERM/SIGINT/SIGHUP): a checkpoint was saved (or, before any
        rank started, nothing was trained); run the same command again to resume. Under Slurm, node 0
        requeues the job after SIGUSR1 only (the time-limit warning, `scancel --batch --signal=USR1`);
        after SIGTERM (scancel, scontrol requeue, preemption) Slurm's own decision stands
        (supervise.requeue_wanted is the rule)

The order: load and check the config -> preflight (run dir, rendezvous, resume compatibility, env,
envcheck) -> the attempt directory with the resolved config (config.json) -> torchrun -> the verdict
-> summary.json -> one message and the exit code.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from provision.jsonout import JsonRequest, outcome
from provision.paths import repo_root
from trainer.attempt import (
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_PREFLIGHT,
    EXIT_USAGE,
    PREFLIGHT_FAILED,
    Attempt,
    prune_attempts,
    read_summary,
)
from trainer.checkpoint.finite import nonfinite_in_checkpoint
from trainer.checkpoint.layout import resume_conflicts, scan
from trainer.config import CONFIG_DIR, ConfigError, RunConfig, check_config, parse_set, resolve_config
from trainer.config.released import PretrainedConflict, PretrainedError, apply_pretrained_config
from trainer.config.standins import check_stand_ins
from trainer.launcher import early, nodes, rundir_state, simeval, stall, supervise
from trainer.launcher.cli import UsageError, parse_args
from trainer.launcher.compile_cache import env_key_name, localise_compile_caches, write_back_compile_caches
from trainer.launcher.console import say
from trainer.launcher.envchoice import DEFAULT_ENV, gpu_count, job_environment, resolve_env
from trainer.launcher.errors import PreflightError, StopBeforeStart
from trainer.launcher.inputs import inputs_check
from trainer.launcher.ownership import claim_run_dir
from trainer.launcher.plancmd import show_plan
from trainer.launcher.preflight import check_run_dir, env_checks, plan_check, sim_platform_check, space_check
from trainer.launcher.rendezvous import bad_int_variable, rendezvous
from trainer.launcher.resolved import Known, Launch
from trainer.launcher.summaries import (
    CONFIG_ERROR_NEXT,
    next_run_line,
    preflight_failed,
    report_outcome,
    stopped_before_start,
    write_final_summary,
    write_running_summary,
)
from trainer.launcher.tempdirs import clean_stale_temp_dirs

KEEP_ATTEMPTS = 10


def default_run_dir(config: str) -> Path:
    return repo_root() / "runs" / config


def torchrun_command(launch: Launch, nproc: int, attempt: Attempt) -> list[str]:
    """torchrun with the rendezvous's flags; each rank loads the attempt's config.json and nothing else."""
    rdzv = launch.rdzv
    return [
        str(launch.choice.python), "-m", "torch.distributed.run",
        "--nnodes", str(rdzv.nnodes), "--node-rank", str(rdzv.node_rank), "--nproc-per-node", str(nproc),
        *rdzv.torchrun_flags(), "--max-restarts", "0",
        "--log-dir", str(attempt.node_log_dir(rdzv.node_rank)),
        "-m", "trainer.loop.train", "--run-dir", str(launch.run_dir), "--attempt-dir", str(attempt.dir),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """bin/train; with --json/--json-file the outcome object goes out last (provision/jsonout.py)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    request = JsonRequest.from_argv(argv)
    request.capture_stdout()
    known = Known()
    try:
        code = _launch(argv, known)
    except UsageError as exc:
        known.report, code = {"error": exc.message}, EXIT_USAGE
    body = (known.report if known.report is not None else _summary_of(known)) if request.wanted else {}
    written = not request.wanted or request.emit(outcome(code, body))
    return code if written else code or 1  # a --json-file asked for and missing (said on stderr): never 0


def _summary_of(known: Known) -> dict[str, Any]:
    """summary.json as this invocation left it (every path that reaches here wrote it)."""
    if known.run_dir is None:
        return {}
    summary = read_summary(known.run_dir)
    return summary.to_json(stamp=False) if summary is not None else {}


def _launch(argv: list[str], known: Known) -> int:
    started = time.perf_counter()
    args = parse_args(argv)

    def stop_before_start(signum: int, frame: FrameType | None) -> None:
        raise StopBeforeStart(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop_before_start) for sig in supervise.FORWARDED_SIGNALS}
    try:
        came_early = early.pending()  # arrived before our handlers: recorded by bin/train or launch.py
        if came_early:
            raise StopBeforeStart(came_early)
        return _main(args, started, known)
    except StopBeforeStart as exc:
        known.report = stopped_before_start(known.run_dir, known.cfg, args.config, str(exc), started)
        say(f"received {exc} before any rank started: stopping; nothing was trained (exit {EXIT_PREEMPTED}); "
            + next_run_line(known.run_dir, known.cfg))  # fmt: skip
        environ = dict(os.environ)
        if environ.get("SLURM_JOB_ID") and int(environ.get("SLURM_NODEID") or 0) == 0:
            say(supervise.slurm_after_stop([str(exc)], environ, args.no_requeue))
        return EXIT_PREEMPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if known.owner is not None:  # after the verdict (and an early stop's summary) is written
            known.owner.release()


def _load(args: argparse.Namespace, gpus: int) -> tuple[RunConfig, bool, PretrainedError | None]:
    """The checked config (ConfigError, PretrainedConflict: exit 2), whether its cpu_scale block applies,
    and a model.pretrained folder that cannot be read (judged in the preflight: exit 3)."""
    # On a machine without a GPU the config's cpu_scale block applies unless asked otherwise.
    cpu_scale = args.cpu_scale if args.cpu_scale is not None else (args.sbatch is None and gpus == 0)
    cfg, sources = resolve_config(args.config, cpu_scale=cpu_scale, overrides=parse_set(args.set))
    try:  # the dimensions come from its config.json; only a value the user set can conflict
        apply_pretrained_config(cfg, sources)
    except PretrainedConflict as exc:
        raise ConfigError(str(exc)) from exc
    except PretrainedError as exc:
        check_stand_ins(cfg, bool(cfg.model.pretrained), not cpu_scale, "", say)
        return cfg, cpu_scale, exc
    check_stand_ins(cfg, bool(cfg.model.pretrained), not cpu_scale, "", say)  # after config.json's dims
    try:
        check_config(cfg, sources)
    except ConfigError as exc:  # a dimension from config.json that this trainer cannot build
        return cfg, cpu_scale, PretrainedError(f"{cfg.model.pretrained}: {exc}")
    return cfg, cpu_scale, None


def _main(args: argparse.Namespace, started: float, known: Known) -> int:
    if args.plan:
        return show_plan(args, known)
    environ = dict(os.environ)
    gpus = 0 if args.sbatch is not None else gpu_count()
    try:
        bad = bad_int_variable(environ, args)
        if bad:
            raise ConfigError(bad)
        cfg, cpu_scale, unusable_weights = _load(args, gpus)
    except ConfigError as exc:
        say(f"error: {exc}; {CONFIG_ERROR_NEXT}")
        known.report = {"error": str(exc)}
        return EXIT_USAGE
    if args.sbatch is not None:
        return write_sbatch(args, known)
    config_file = CONFIG_DIR / f"{args.config}.yaml"
    if cpu_scale and args.cpu_scale is None:
        say(
            f"no GPU found: running the cpu_scale variant of {config_file} ({cfg.train.steps} steps, "
            f"dim {cfg.model.dim}, depth {cfg.model.depth}); --no-cpu-scale runs the full config"
        )
    elif cpu_scale:
        say(f"--cpu-scale: running the cpu_scale variant of {config_file}")
    run_dir = (args.run_dir or default_run_dir(args.config)).absolute()
    known.run_dir, known.cfg = run_dir, cfg
    refused = claim_run_dir(run_dir, args.node_rank, environ, known)  # before anything is written there
    if refused is not None:
        return refused
    for note in clean_stale_temp_dirs(environ):  # a killed launcher's node-local compile copy
        say(note)

    node_rank = args.node_rank if args.node_rank is not None else int(environ.get("SLURM_NODEID") or 0)
    try:
        damaged = rundir_state.quarantine(run_dir, node_rank)
        world_size = rendezvous(args, environ).nnodes * args.nproc
        done = rundir_state.finished(run_dir, cfg, world_size, started)  # a finished run stays finished
    except PreflightError as exc:
        return preflight_failed(run_dir, cfg, str(exc), started)
    if done is not None:
        return done

    try:
        check_run_dir(run_dir)
    except PreflightError as exc:  # nothing can be written: the run dir itself is the problem
        say(f"preflight failed: {exc}; the next run fails the same way until the run dir is usable")
        known.report = {"status": PREFLIGHT_FAILED, "error": str(exc)}
        return EXIT_PREFLIGHT
    try:
        if unusable_weights is not None:
            raise PreflightError(str(unusable_weights))
        launch = _preflight(args, cfg, run_dir, environ, gpus, cpu_scale)
        if args.preflight_only:
            say(f"preflight passed on {socket.gethostname()} (--preflight-only: no rank started)")
            known.report = {"preflight": "passed", "host": socket.gethostname(), "config": cfg.name}
            return EXIT_OK
        launch.damaged = damaged or None
        attempt = _prepare_attempt(launch, args.nproc, environ)
    except (PreflightError, OSError, ValueError) as exc:
        return preflight_failed(run_dir, cfg, str(exc), started)
    return _run(launch, attempt, args, environ, started, known)


def _preflight(
    args: argparse.Namespace,
    cfg: RunConfig,
    run_dir: Path,
    environ: dict[str, str],
    gpus: int,
    cpu_scale: bool,
) -> Launch:
    """Rendezvous, resume compatibility, the env and its checks; PreflightError when a rank must not start."""
    rdzv = rendezvous(args, environ)
    world_size = rdzv.nnodes * args.nproc
    if gpus and args.nproc > gpus:
        raise PreflightError(f"NPROC {args.nproc} is more than the {gpus} GPUs on this node")
    complete, _ = scan(run_dir / "checkpoints")
    resumes = None  # (the checkpoint, the data.path it was trained on): no new episodes made for it
    if complete:
        state = complete[-1].train_state()
        resumes = (complete[-1].path, str((state.get("config") or {}).get("data", {}).get("path")))
        conflicts = resume_conflicts(state, cfg, world_size)
        if conflicts:
            raise PreflightError(f"cannot resume from {complete[-1].path}: " + "; ".join(conflicts))
        bad = nonfinite_in_checkpoint(complete[-1])  # written by an older version or by hand
        if bad:
            raise PreflightError(
                f"cannot resume from {complete[-1].path}: {bad} (a diverged run's state); move it aside "
                "to resume from an earlier one, or start a new run with --run-dir"
            )
    for note in inputs_check(cfg, resumes):  # the data and the weights, as far as judged without reading them
        say(note)
    if args.preflight_only:
        supervise.test_pause("preflight")  # test hook: a stop signal while bin/train is in preflight
    choice = resolve_env(args.env, args.prefix, environ)
    if not choice.provisioned and args.require_env:
        raise PreflightError(
            f"--require-env: no provisioned env found ({choice.why}); provision one with "
            f"bin/provision {DEFAULT_ENV}, or name it with --env/--prefix"
        )
    if not choice.provisioned:
        say(f"no provisioned env found; running in the tool environment {choice.prefix} "
            f"(provision one with bin/provision {DEFAULT_ENV})")  # fmt: skip
        if choice.why:
            say(f"  looked at: {choice.why}")
    else:
        say(f"env {choice.prefix} ({choice.why})")
    env = job_environment(choice, environ)
    if args.env_checked:
        say("env checks: skipped (--env-checked: the job's --preflight-only step ran them on this node)")
    else:
        for note in env_checks(choice, env, run_dir):  # a recorded pass on this node: preflight.py
            say(note)
    if rdzv.node_rank == 0:
        sim_platform_check(cfg)  # the evaluator's simulator env (eval.sim) runs on node 0
        for note in space_check(run_dir, cfg, world_size):
            say(note)
    if gpus and not cpu_scale:
        for note in plan_check(cfg, world_size, rdzv.nnodes):  # refuses a run predicted not to fit
            say(note)
    return Launch(cfg, run_dir, rdzv, world_size, choice, env, cpu_scale)


def _prepare_attempt(launch: Launch, nproc: int, environ: dict[str, str]) -> Attempt:
    """Compile caches, thread count, and the attempt directory holding the resolved config."""
    env, rdzv = launch.env, launch.rdzv
    job = environ.get("SLURM_JOB_ID") or f"pid{os.getpid()}"
    scratch = Path(environ.get("SLURM_TMPDIR") or environ.get("TMPDIR") or tempfile.gettempdir())
    env_name = env_key_name(launch.choice.prefix, launch.choice.provisioned)
    for note in localise_compile_caches(env, scratch, job, env_name):
        say(note)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))

    attempt = Attempt.of_run(launch.run_dir, rdzv.attempt)
    if rdzv.node_rank == 0 and attempt.used():
        # its stop file and rank records belong to another launch: reusing them would forge the verdict
        raise PreflightError(
            f"attempt {rdzv.attempt} already ran in {attempt.dir}; set LINGBOT_ATTEMPT_ID to a new value "
            f"(under Slurm: run bin/train once per srun step)"
        )
    attempt.dir.mkdir(parents=True, exist_ok=True)
    attempt.write_config(launch.cfg)  # every node writes the same bytes: the config it checked
    if rdzv.node_rank == 0:  # before any rank starts: a run that dies in any way never leaves `completed`
        write_running_summary(launch, attempt)
    return attempt


def _run(
    launch: Launch,
    attempt: Attempt,
    args: argparse.Namespace,
    environ: dict[str, str],
    started: float,
    known: Known,
) -> int:
    prune_attempts(launch.run_dir, keep=KEEP_ATTEMPTS)
    launch.env["LINGBOT_ATTEMPT_DIR"] = str(attempt.dir)
    command = torchrun_command(launch, args.nproc, attempt)
    rdzv = launch.rdzv
    say(f"run dir {launch.run_dir}; attempt {rdzv.attempt}; {rdzv.nnodes} node(s) x {args.nproc} rank(s)")
    say("$ " + shlex.join(command))

    policy = stall.resolve_policy(launch.cfg.hang, environ)
    detector = stall.StallDetector(launch.cfg.hang, attempt, rdzv.node_rank, launch.world_size, policy)
    log = attempt.output_log(rdzv.node_rank)
    torchrun = supervise.Torchrun(command, launch.env, attempt, detector, log=log)
    torchrun.meeting = rdzv  # no rank within a minute: said with its likely cause (one node: failed)
    torchrun.sidecar = simeval.SimEval.start(
        launch, attempt
    )  # eval.sim: checkpoints evaluated beside the ranks
    rc = torchrun.wait()
    requeue_hang = torchrun.hung is not None and stall.settle(
        torchrun.hung, launch.run_dir, attempt, environ, args.no_requeue
    )
    result, signals = nodes.judge(launch, args.nproc, attempt, torchrun, rc)  # node 0: every node's
    exit_code = EXIT_CODES[result.status]
    assert exit_code is not None
    if torchrun.sidecar is not None:  # before the summary: it carries the evaluations' records
        torchrun.sidecar.finish(wait=exit_code == 0)
    if rdzv.node_rank == 0 and not write_final_summary(launch, attempt, result, rc, exit_code, started):
        exit_code = EXIT_FAILED  # the outcome is not on disk: never report success
        known.report = {"status": result.status, "reason": result.reason, "summary_written": False}
    elif rdzv.node_rank != 0:  # node 0 writes summary.json; this node reports its own verdict
        known.report = {"status": result.status, "reason": result.reason, "node_rank": rdzv.node_rank,
                        "attempt": attempt.id, "failed_rank": result.failed_rank}  # fmt: skip
    for note in write_back_compile_caches(launch.env):  # also after a stop: the requeue needs them
        say(note)
    report_outcome(launch, attempt, result, args.no_requeue, environ, signals)
    if torchrun.hung is not None and torchrun.hung.policy == "requeue" and rdzv.node_rank == 0:
        say(supervise.requeue(environ) if requeue_hang else str(torchrun.hung.requeue))
    return exit_code


def write_sbatch(args: argparse.Namespace, known: Known) -> int:
    from trainer.launcher.sbatch import SbatchPathError, SbatchRequest
    from trainer.launcher.sbatch import write_sbatch as write_script

    try:
        script, path = write_script(SbatchRequest.from_args(args, repo_root()), args.sbatch)
    except SbatchPathError as exc:
        say(f"error: {exc}")
        known.report = {"error": str(exc)}
        return EXIT_USAGE
    if path is None:
        if args.json:  # stdout is the JSON object's: the script travels inside it
            known.report = {"sbatch": None, "script": script}
        else:
            sys.stdout.write(script)
    else:
        say(f"wrote {path}; submit it with: sbatch {path}")
        known.report = {"sbatch": str(path)}
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
