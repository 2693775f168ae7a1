"""`bin/evaluate TARGET --sim libero`: a checkpoint in LIBERO's simulator, through upstream's client loop.

    run_libero(target, Options(suite="libero_10", tasks=None, episodes=50, max_steps=800, workers=None,
               cameras=(), ...), say) -> (result, exit code)

First, a node whose platform the simulator env has no wheels for is refused (SimEnvError, exit 1: env.py
check_platform). In order, so that bad input is refused before any simulator is built (UsageError, one
line, exit 2):
the suite, the task list and the counts (suites.py); the checkpoint loaded as bin/serve loads it
(session.py `load_served`: the best checkpoint of a RUN_DIR, else its newest complete one) with the
--camera map; whether LIBERO's loop can drive it (7 action channels, N % 4 == 0, its camera keys);
the settings of earlier episodes in the output folder (a re-run must use the same, or name another
folder). Then the simulator env (built on first use: env.py, sim/build.sh), its GL backend, and:

Serving: in this process, on a loopback port (127.0.0.1, a free port the OS picks): bin/serve's own
PolicyServer on a thread, one model request at a time, its log in OUT/serve.log. The workers speak to it
over the websocket protocol exactly as upstream's client speaks to bin/serve (the same bytes), so what
is measured is what a deployment runs; the transport's cost is measured per episode (report.py), and a
served chunk costs less than the simulator steps it drives (bench/results/*-libero-*.md).

Episodes: K simulator workers (runner.py, worker.py in .sim/libero; K = --workers, default the cores
less one for the server, at least 1, at most the episodes to run), each episode `(task, e)` for the tasks
asked and e < --episodes. Output under OUT = RUN_DIR/evaluation/<checkpoint>/libero/<suite>/: per
episode its MP4 and record (worker.py), then results.json and success.png (report.py). An episode with
a record is not run again: a re-run (after Ctrl-C, a crash, or with more --episodes) runs the rest.

Experts (`--expert`, no TARGET, no server): the scripted experts of trainer/sim/experts/ play the
episodes through the same workers (worker.py `--expert`: the expert acts each step instead of the client
loop; a key frame every step, as the loop keeps them for N = 4), counted, filmed and reported as a
checkpoint's are; OUT defaults to runs/experts/libero/<suite>/ and results.json's checkpoint is "expert".
A TARGET with --expert, or a task without an expert, is refused (exit 2, naming the tasks with experts).

Exit: 0 every asked episode has a record; 1 some episodes errored (a crashed worker: counted apart, not
as failures; the line names how many) or the simulator env could not be built or render; 2 bad input;
130 Ctrl-C (what finished is kept, results.json written).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from provision.atomic import write_json_atomic
from trainer.evaluation.sim.report import Progress, load_records, summarise, write_results
from trainer.sim import suites

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM: scancel, `timeout`, kill


class _Terminated(Exception):
    """SIGTERM while episodes run: ended like Ctrl-C (results.json says what is kept), exit 143."""


def _raise_terminated(signum, frame) -> None:  # noqa: ANN001 - a signal handler
    raise _Terminated()


def episode_timeout(max_steps: int) -> float:
    """How long a worker may take to answer one episode before it counts as hung (its episode an error):
    10 min to build and settle the scene plus 3 s a step, ~20x what a step costs on a 2-core CPU with both
    cameras rendered in software (bench/results/2026-12-05-libero-workers.md: ~0.16 s simulated, ~0.05 s
    of policy per step)."""
    return 600.0 + 3.0 * max_steps


@dataclasses.dataclass(frozen=True)
class Options:
    suite: str = "libero_10"
    tasks: str | None = None
    episodes: int = 50
    max_steps: int = 800
    workers: int | None = None
    cameras: tuple[str, ...] = ()
    config: str = "libero"
    cpu_scale: bool = True
    sets: tuple[str, ...] = ()
    seed: int = 0
    device: str = "auto"
    out: str = "evaluation/libero"  # bin/evaluate's default: RUN_DIR/evaluation/<checkpoint>/libero/<suite>
    expert: bool = False  # the scripted experts (trainer/sim/experts/) instead of a served checkpoint


def default_workers() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


def settings_of(opts: Options, checkpoint: str, device: str, sim_env: str) -> dict:
    """What an episode's outcome depends on besides its task and number: must match to resume (the run
    config and its scale, which a reference-layout folder takes from --config; the device kind: fp32 on a
    CPU, bf16 on a GPU; the simulator env, by its locks' hash: env.py env_identity)."""
    return {"suite": opts.suite, "checkpoint": checkpoint, "max_steps": opts.max_steps, "seed": opts.seed,
            "sets": sorted(opts.sets), "cameras": sorted(opts.cameras), "config": opts.config,
            "cpu_scale": opts.cpu_scale, "device": device, "sim_env": sim_env}  # fmt: skip


def hold_output(out: Path) -> int:
    """One writer per output folder: an exclusive lock on OUT/.writer.lock, held until the command ends (its
    descriptor, returned, is closed then; a killed process releases it with its descriptors). A second
    bin/evaluate --sim on the same folder (a user beside the launcher's evaluator) is refused, exit 1."""
    import fcntl

    from trainer.sim.env import SimEnvError

    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / ".writer.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SimEnvError(
            f"{out}: another bin/evaluate --sim is writing there now; wait for it to end (a re-run then "
            "continues its episodes), or use another --plots-dir"
        ) from None
    return fd


def check_settings(out: Path, want: dict) -> None:
    path = out / "settings.json"
    if path.is_file():
        from trainer.evaluation.sim.report import read_json_or_refuse

        have = read_json_or_refuse(path, "remove it to continue the episodes with these settings")
        diff = [k for k in want if have.get(k) != want[k]]
        if diff:
            k = diff[0]
            what = (
                " (another simulator env: sim/libero's locks or manifests changed)" if k == "sim_env" else ""
            )
            raise suites.UsageError(
                f"{path}: its episodes ran with {k} {have.get(k)!r}, not {want[k]!r}{what}; use the same "
                "settings to continue them, or another --plots-dir (or remove that folder)"
            )
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, want)


def load(target: str, opts: Options, say: Callable[[str], None], resolved: tuple[str, Path] | None = None):
    """(served, checkpoint path, OUT) or UsageError; nothing about the simulator yet. `resolved`: TARGET as
    the caller resolved it (the checkpoint OUT is named after), loaded as it is even if `best` moved since."""
    from trainer.sampling.load import resolve_target
    from trainer.serving.protocol import parse_aliases
    from trainer.serving.session import load_served

    kind, path = resolved = resolved or resolve_target(target)
    served = load_served(
        target, opts.config, opts.cpu_scale, list(opts.sets), opts.device, opts.seed, say, resolved
    )
    try:
        aliases = parse_aliases(opts.cameras, served.spec.cameras)
    except ValueError as exc:
        raise suites.UsageError(str(exc)) from None
    served.spec = dataclasses.replace(served.spec, aliases=aliases)
    suites.check_served(served.spec, target)
    # the checkpoint by its resolved path (settings.json, results.json): `runs/x` and its absolute path, as
    # the launcher passes it, are one checkpoint and one output folder (each refused the other, exit 2)
    name = str(path.resolve()) if kind == "checkpoint" else f"reference-layout weights {path.resolve()}"
    return served, name, Path(opts.out)


class Serving:
    """bin/serve's PolicyServer on a thread of this process, on a free loopback port."""

    def __init__(self, served, log: Path, workers: int):
        from trainer.serving.server import Limits, PolicyServer

        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log, "a")
        # one connection per worker, never refused; never closed as idle: a worker connects before it
        # builds and settles its scene (up to episode_timeout's 10 min on a loaded node)
        limits = Limits(None, max_connections=workers + 1, idle_timeout=0)
        self.server = PolicyServer(served, limits, lambda line: print(line, file=self.log, flush=True))
        ready = threading.Event()
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.run("127.0.0.1", 0, lambda _: ready.set(), signals=False)),
            name="lingbot-serve", daemon=True,
        )  # fmt: skip
        self.thread.start()
        if not ready.wait(60) or not self.server.port:
            raise RuntimeError(f"the in-process policy server did not start (log {log})")
        self.uri = f"ws://127.0.0.1:{self.server.port}"

    def close(self) -> None:
        self.server.stop()
        self.thread.join(30)
        self.log.close()


EXPERT = "expert"  # results.json's checkpoint for the scripted experts


def check_experts(target: str | None, suite: str, tasks: list[int]) -> None:
    """--expert: no TARGET, and an expert for every task asked (UsageError naming those that have one)."""
    from trainer.sim.experts import no_expert, tasks_with_experts

    if target:
        raise suites.UsageError(
            f"--expert plays the scripted experts, not {target}: leave TARGET out (or drop --expert); "
            f"{suite} tasks with experts: {tasks_with_experts(suite)}"
        )
    missing = [t for t in tasks if t not in tasks_with_experts(suite)]
    if missing or not tasks:
        raise suites.UsageError(f"--tasks: {no_expert(suite, missing)}")


def run_libero(
    target: str | None, opts: Options, say: Callable[[str], None], resolved: tuple[str, Path] | None = None
) -> tuple[dict, int]:
    from trainer.sim.env import check_platform

    check_platform("libero", "evaluate this checkpoint on such a node (copy the run folder there)")
    n = suites.task_count(suites.check_suite(opts.suite))
    tasks = suites.parse_tasks(opts.tasks, n, opts.suite)
    suites.check_counts(opts.episodes, opts.max_steps, 1 if opts.workers is None else opts.workers)
    if opts.expert:
        from trainer.sim.experts import tasks_with_experts

        tasks = tasks if opts.tasks else tasks_with_experts(opts.suite)  # default: those with an expert
        check_experts(target, opts.suite, tasks)
    elif not target:
        raise suites.UsageError(
            "TARGET missing: name a RUN_DIR or checkpoint, or --expert for the scripted experts"
        )
    out = Path(opts.out)
    made = [d for d in (out, *out.parents) if not d.exists()]  # what hold_output makes: undone on bad input
    writer = hold_output(out)  # before the model's load: a second writer is refused at once, not after it
    try:
        try:
            if opts.expert:
                served, checkpoint = None, EXPERT
            else:
                assert target is not None  # refused above
                served, checkpoint, out = load(target, opts, say, resolved)
        except BaseException:
            if made:
                (out / ".writer.lock").unlink(missing_ok=True)
            for folder in made:  # innermost first; only the empty folders this command made
                try:
                    folder.rmdir()
                except OSError:
                    break
            raise
        return _run(served, checkpoint, out, tasks, opts, say)
    finally:
        os.close(writer)


def _run(served, checkpoint: str, out: Path, tasks: list[int], opts: Options, say) -> tuple[dict, int]:
    from trainer.evaluation.sim.runner import Pool
    from trainer.sim.env import choose_gl, ensure_env, env_identity, worker_env

    # where load_served put it (cpu, cuda); the experts run in the simulator's process
    device = "cpu" if served is None else next(served.model.parameters()).device.type
    check_settings(out, settings_of(opts, checkpoint, device, f"libero {env_identity('libero')}"))
    python = ensure_env("libero", say)
    gl = choose_gl(python, say)
    done = load_records(out, tasks, opts.episodes)
    jobs = [(t, e) for t in tasks for e in range(opts.episodes) if (t, e) not in done]
    workers = max(1, min(opts.workers or default_workers(), len(jobs) or 1))
    say(
        f"evaluate: LIBERO {opts.suite}, tasks {tasks}, {opts.episodes} episode(s) each, max "
        f"{opts.max_steps} steps: {len(done)} done before, {len(jobs)} to run on {workers} simulator "
        f"worker(s); out {out}"
    )
    errors: list[dict] = []
    code, start = 0, time.monotonic()
    if jobs:
        serving = None if served is None else Serving(served, out / "serve.log", workers)
        policy = ["--expert"] if serving is None else ["--uri", serving.uri]
        argv = [str(python), "-u", "-m", "trainer.evaluation.sim.worker", *policy,
                "--suite", opts.suite, "--out", str(out), "--max-steps", str(opts.max_steps),
                "--seed", str(opts.seed)]  # fmt: skip
        pool = Pool(argv, worker_env(python, gl), workers, out / "logs", episode_timeout(opts.max_steps))
        progress = Progress(opts.suite, len(tasks) * opts.episodes, len(done), say)
        main_thread = threading.current_thread() is threading.main_thread()
        before = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
        try:
            for record in pool.run(jobs):
                progress.update(record)
                if "error" in record:
                    errors.append(record)
        except KeyboardInterrupt:
            code = EXIT_INTERRUPTED
        except _Terminated:  # a review: it died with 143 and results.json still said the earlier run
            code = EXIT_TERMINATED
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, before)
            pool.stop()  # every worker ended, whatever ended the loop (a no-op after a full run)
            progress.close()
            if serving is not None:
                serving.close()
    result = summarise(
        out, opts.suite, checkpoint, tasks, opts.episodes, errors, time.monotonic() - start, {}
    )
    write_results(out, result)
    rate = result["success_rate"]
    say(
        f"evaluate: {opts.suite}: {result['successes']}/{result['episodes']} episodes succeeded"
        f"{'' if rate is None else f' ({rate:.1%})'}; {len(errors)} error(s); results {out / 'results.json'}"
    )
    if code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        how = "interrupted" if code == EXIT_INTERRUPTED else "stopped by SIGTERM"
        say(f"evaluate: {how}: {result['episodes']} episode(s) kept; run the same command to continue")
    elif errors:
        say(
            f"evaluate: {len(errors)} episode(s) did not run (simulator worker crashed; logs "
            f"{out / 'logs'}); run the same command again to retry them"
        )
        code = 1
    return result, code
