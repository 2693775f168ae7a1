"""A hung rank is said, with where every rank is, and ends the attempt (trainer/launcher/stall.py).

Fast: the limit's arithmetic and how it follows rank 0's phase (start-up, first step, step, save,
evaluation), rank 0's phase reports, py-spy's dump parsed, the config rule, the requeue policy's memory.
Heavy (real 2-rank runs of a tiny model through `python -m trainer.launcher`, what bin/train execs):
- a rank stopped with SIGSTOP after step 3: the stall line, py-spy stacks of both ranks (the stopped one
  and the one waiting in a collective), exit 1, a `hung` summary, no process left; the time from the
  stall to the verdict is measured and bounded, and the stall line comes within the limit, 10 x the
  median step (at least hang.floor_s);
- a hang inside a checkpoint save (rank 1 parked before its commit, never released);
- a slow but live save (a test hook sleeps inside the first save, longer than a step's limit, shorter
  than hang.phase_s) is not a hang; torchrun's agent is stopped meanwhile (SIGSTOP): the ranks finish,
  and the launcher ends torchrun, names it, and the verdict is completed (exit 0), not a hang;
- under the test Slurm (tests/support/slurm.py), hang.policy=auto requeues the job after the first
  hang, and the second hang at the same step fails for good (1 rank: the claim is the policy's).
Synchronisation is by observing files with deadlines, never by sleeps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.support.runs import pause_env, seed_preflight
from trainer.attempt import EVALUATION, FIRST_STEP, SAVE, STEP, Attempt, Progress, read_hangs
from trainer.config import ConfigError, HangConfig, RunConfig, check_config
from trainer.launcher import stall
from trainer.loop.phases import Phases
from trainer.outcomes import Hung

REPO = Path(__file__).resolve().parents[1]
STEPS = 8
FLOOR_S = 8  # a plain step's limit here: 10 x the tiny model's median step is below it
PHASE_S = 30  # a save's or an evaluation's floor (the slow save below stays under it)
TINY = [
    "model.dim=48", "model.heads=2", "model.depth=2", "model.latent_size=8", "model.attn_block=16",
    "data.frames=4", "data.generated_episodes=4", "data.generated_length=20",
    "train.grad_accum=2", f"train.steps={STEPS}", "train.warmup_steps=2",
    "checkpoint.every=2", "checkpoint.keep=3", "log.tensorboard=false",
    f"hang.floor_s={FLOOR_S}", f"hang.phase_s={PHASE_S}", "hang.start_s=500", "hang.collective_timeout_s=600",
    "hang.policy=auto",
]  # fmt: skip
TIMEOUT = 400
VERDICT_AFTER_FIRE_S = 60  # the stacks, the kill and the summary, at load average ~20 on 2 cores


# --- fast ------------------------------------------------------------------------------------------


@pytest.mark.fast
def test_the_limit_is_a_multiple_of_the_median_step_with_a_floor_and_a_ceiling():
    clock = stall.StallClock(HangConfig(step_factor=10, floor_s=30, start_s=45, warm_up_steps=1), started=0)
    assert clock.limit() == 45 and not clock.stalled(44) and clock.stalled(46)  # before any step
    for step, t in [(1, 50.0), (2, 52.0), (3, 54.0), (4, 56.0), (5, 106.0)]:  # step 1 compiled; 5 saved
        clock.observe(step, t)
    assert clock.median() == 2.0 and clock.limit() == 30  # 10 x 2 s is below the floor
    clock.observe(6, 106.0 + 2.0)
    slow = stall.StallClock(HangConfig(step_factor=10, floor_s=30, collective_timeout_s=100), started=0.0)
    for step in range(1, 6):
        slow.observe(step, step * 20.0)
    assert slow.limit() == 90.0  # 10 x 20 s = 200 s, capped at 0.9 x the collective timeout
    assert stall.duration(250) == "4 min 10 s" and stall.duration(6.3) == "6.3 s"


@pytest.mark.fast
def test_the_limit_follows_rank_0s_phase():
    cfg = HangConfig(step_factor=10, floor_s=60, start_s=1500, phase_s=300, warm_up_steps=1)
    clock = stall.StallClock(cfg, started=0.0)
    assert clock.phase_name() == "start-up" and clock.limit() == 1500
    clock.observe(None, 30.0, FIRST_STEP, 1.0)
    assert clock.limit() == 1500 and clock.stalled_for(100.0) == 70.0  # counted from the phase's start
    clock.observe(1, 200.0, STEP, 200.0)  # the compiled first step: 170 s from its phase's start
    assert clock.median() is None and clock.limit() == 1620  # 10 x 170 s, capped at 0.9 x 1800 s
    for step, t in [(2, 203.0), (3, 206.0), (4, 209.0)]:
        clock.observe(step, t, STEP, t)
    assert clock.median() == 3.0 and clock.limit() == 60  # 10 x 3 s is below the floor
    clock.observe(4, 210.0, SAVE, 210.0, expect_s=None)  # the first save: nothing measured yet
    assert clock.phase_name() == SAVE and clock.limit() == 300 and clock.stalled_for(215.0) == 5.0
    clock.observe(4, 400.0, SAVE, 400.0, expect_s=2.0)  # a small checkpoint: the phases' floor
    assert clock.limit() == 300
    clock.observe(4, 410.0, SAVE, 410.0, expect_s=50.0)  # bytes / the write speed of the last save
    assert clock.limit() == 500
    clock.observe(4, 420.0, EVALUATION, 420.0, expect_s=45.0)
    assert clock.limit() == 450  # 10 x its last duration
    clock.observe(5, 425.0, STEP, 425.0)
    assert clock.phase_name() == STEP and clock.limit() == 60 and not clock.stalled(484.0)
    assert clock.stalled(486.0)
    resumed = stall.StallClock(cfg, started=0.0)  # a requeued attempt: its first step took 4 s
    resumed.observe(None, 10.0, FIRST_STEP, 10.0)
    resumed.observe(3, 14.0, STEP, 14.0)
    assert resumed.median() is None and resumed.limit() == 60  # 10 x 4 s, at least the floor
    slow = stall.StallClock(dataclasses.replace(cfg, collective_timeout_s=1000), started=0.0)
    slow.observe(3, 1.0, SAVE, 1.0, expect_s=500)
    assert slow.limit() == 900  # never past 0.9 x the backend's timeout


@pytest.mark.fast
def test_rank_0_reports_its_phases_with_predicted_lengths(tmp_path):
    attempt = Attempt(tmp_path)
    attempt.write_progress(Progress(first_step=1, last_step=3, phase=STEP))
    phases = Phases(attempt, rank=0)
    with phases.during(SAVE, nbytes=1000):
        seen = attempt.read_progress()
    assert seen.phase == SAVE and seen.expect_s is None and seen.last_step == 3  # the first: unmeasured
    assert phases.save_speed is not None and phases.expect(SAVE, 2000) == pytest.approx(
        2000 / phases.save_speed
    )
    with phases.during(EVALUATION):
        assert attempt.read_progress().expect_s is None
    first = phases.last_s[EVALUATION]
    with phases.during(EVALUATION):
        assert attempt.read_progress().expect_s == pytest.approx(first)  # its last duration
    Phases(attempt, rank=1).enter(FIRST_STEP)  # only rank 0 writes
    assert attempt.read_progress().phase == EVALUATION


@pytest.mark.fast
def test_the_collective_timeout_must_outlast_the_floor():
    cfg = RunConfig()
    cfg.hang.collective_timeout_s = cfg.hang.start_s
    with pytest.raises(
        ConfigError,
        match=r"collective_timeout_s=.* must be longer than max\(hang.floor_s, hang.start_s, hang.phase_s\)",
    ):
        check_config(cfg)
    cfg.hang.collective_timeout_s, cfg.hang.policy = 10 * cfg.hang.floor_s, "retry"
    with pytest.raises(ConfigError, match="hang.policy must be one of auto, fail, requeue"):
        check_config(cfg)


@pytest.mark.fast
def test_innermost_frame_is_the_main_threads_first_frame():
    dump = (
        "Process 12: python -m trainer.loop.train\nPython v3.11.9 (/usr/bin/python3.11)\n\n"
        'Thread 13 (idle): "pt_elastic"\n    sleep (time.py:1)\n'
        'Thread 12 (idle): "MainThread"\n    wait (torch/distributed/x.py:7)\n'
        "    loop (trainer/loop/train.py:9)\n"
    )
    assert stall.innermost_frame(dump) == "wait (torch/distributed/x.py:7)"
    unnamed = (
        "Process 48: python -c ...\nPython v3.11.7\n\n"
        "Thread 48 (idle)\n    here (<string>:4)\n    <module> (<string>:5)\n"
    )
    assert stall.innermost_frame(unnamed) == "here (<string>:4)"  # no thread names: the TID == PID thread
    assert stall.resolve_policy(HangConfig(), {"SLURM_JOB_ID": "7"}) == "requeue"
    assert stall.resolve_policy(HangConfig(), {}) == "fail"


@pytest.mark.fast
def test_a_second_hang_at_the_same_step_is_not_requeued(tmp_path):
    def hang(attempt_id: str, step: int) -> tuple[bool, Hung]:
        attempt = Attempt.of_run(tmp_path, attempt_id)
        attempt.dir.mkdir(parents=True)
        record = Hung(0, "no step", step, [0, 1], 50.0, 40.0, 1.0, {}, {}, policy="requeue")
        return stall.settle(record, tmp_path, attempt, {"SLURM_JOB_ID": "7"}, no_requeue=False), record

    assert hang("a1", 3)[0]
    assert hang("a2", 5)[0]  # another step: requeued again
    again, record = hang("a3", 3)
    assert not again and "second hang after step 3 (attempt a1" in str(record.requeue)
    assert [h["step"] for h in read_hangs(tmp_path)] == [3, 5, 3]


# --- heavy: real runs ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("episodes") / "furniture"


@pytest.fixture(scope="module")
def base_env(tmp_path_factory) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LINGBOT_", "SLURM_", "CONDA_PREFIX"))}
    env["CONDA_ENVS_PATH"] = str(tmp_path_factory.mktemp("no-envs"))  # no provisioned env: the tool env
    env["OMP_NUM_THREADS"] = "1"
    return env


class Run:
    """A launcher with its output read line by line, each line stamped with when it arrived."""

    def __init__(
        self, run_dir: Path, data_dir: Path, env: dict[str, str], extra_env: dict[str, str], record: Path
    ):
        seed_preflight(run_dir, record)  # the session's compile-check pass (tests/support/runs.py)
        argv = [sys.executable, "-m", "trainer.launcher", "furniture_train", "2", "--run-dir", str(run_dir)]
        for item in [*TINY, f"data.path={data_dir}"]:
            argv += ["--set", item]
        self.run_dir = run_dir
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env={**env, **extra_env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    @property
    def output(self) -> str:
        return "".join(line for _, line in self.lines)

    def finish(self) -> tuple[int, float]:
        try:
            rc = self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"launcher still running after {TIMEOUT} s:\n{self.output}") from None
        ended = time.monotonic()
        self._reader.join(timeout=30)
        return rc, ended

    def until(self, condition, what: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if condition():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"launcher exited {self.proc.returncode} before {what}:\n{self.output}")
            time.sleep(0.02)  # polling for an event, with a deadline: not a sleep standing in for one
        raise AssertionError(f"timed out waiting for {what}:\n{self.output}")

    def line_time(self, text: str) -> float:
        return next(t for t, line in self.lines if text in line)

    def attempt(self) -> Attempt:
        (found,) = (self.run_dir / "attempts").iterdir()
        return Attempt(found)


def progress_step(run: Run) -> int:
    attempts = run.run_dir / "attempts"
    if not attempts.is_dir() or not any(attempts.iterdir()):
        return 0
    return run.attempt().read_progress().last_step or 0


def all_gone(pids: list[int]) -> list[int]:
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def check_hung(run: Run, rc: int, last_step: int) -> dict:
    out = run.output
    assert rc == 1, out
    assert "Traceback" not in out, out
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["exit_code"] == 1, summary
    hung = summary["hung"]
    assert hung["last_step"] == last_step and hung["silent_ranks"] == [0, 1], hung
    line = f"no step for {stall.duration(hung['stalled_s'])}"
    # "(median step X)" once the launcher has timed a step after the warm-up, else "(limit X)": on a
    # loaded host its first poll may already see the last step before the hang (then no step was timed)
    assert re.search(re.escape(line) + r" \((median step|limit) [^)]+\)", out), out
    assert f"ranks 0, 1 silent since step {last_step}" in out, out
    assert summary["reason"] == f"hung: {hung['line']}", summary
    assert sorted(hung["stack_files"]) == ["0", "1"], hung
    # the waiting rank sits in a torch.distributed collective
    assert "torch/distributed" in Path(hung["stack_files"]["0"]).read_text(), hung
    assert hung["stalled_s"] - hung["limit_s"] < 5 * stall.POLL_S + 2, hung  # fired promptly
    return summary


@pytest.mark.heavy
def test_a_stopped_rank_is_said_with_both_stacks_and_ends_the_attempt(
    tmp_path, data_dir, base_env, preflight_record
):
    run = Run(tmp_path / "run", data_dir, base_env, {}, preflight_record)
    run.until(lambda: progress_step(run) >= 3, "step 3 in progress.json")
    rank1 = run.attempt().read_rank(1)
    assert rank1 is not None
    os.kill(rank1.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    tree = [p.pid for p in psutil.Process(run.proc.pid).children(recursive=True)]
    rc, ended = run.finish()
    summary = check_hung(run, rc, last_step=progress_step(run))
    hung = summary["hung"]
    assert hung["stopped_ranks"] == [1] and f"rank 1 (pid {rank1.pid})" in hung["line"], hung
    stopped_stack = Path(hung["stack_files"]["1"]).read_text()
    assert "Thread" in stopped_stack and "MainThread" in stopped_stack, stopped_stack  # read while stopped
    assert hung["innermost"]["1"] in stopped_stack, hung
    assert not all_gone(tree), f"left running: {all_gone(tree)}"
    fired = run.line_time("no step for ")
    assert ended - fired < VERDICT_AFTER_FIRE_S, (ended - fired, run.output)
    # the limit is 10 x the median step (at least the floor), and the line came within it of the stop: the
    # launcher says it when it sees the stall, before it takes the stacks (said after them, on a 2-core AMD
    # EPYC at load ~9, it came 31.1 s after the stop: 26.7 s counted when seen, limit 26.5 s, then the dumps)
    assert hung["limit_s"] == pytest.approx(max(FLOOR_S, 10 * hung["median_step_s"]), abs=0.01), hung
    assert fired - stopped_at < hung["limit_s"] + 5 * stall.POLL_S + 2, (fired - stopped_at, hung)
    print(
        f"\nSIGSTOP -> stall line {fired - stopped_at:.1f} s (limit {hung['limit_s']} s, stalled "
        f"{hung['stalled_s']} s); stall line -> launcher exit {ended - fired:.1f} s; load {os.getloadavg()}"
    )


@pytest.mark.heavy
def test_a_hang_inside_a_checkpoint_save_is_said_and_no_partial_checkpoint_counts(
    tmp_path, data_dir, base_env, preflight_record
):
    pause = tmp_path / "pause"
    pause.mkdir()
    hook = {"LINGBOT_TEST_PAUSE_AT": "checkpoint:4", "LINGBOT_TEST_PAUSE_RANK": "1",
            "LINGBOT_TEST_PAUSE_DIR": str(pause)}  # fmt: skip
    run = Run(tmp_path / "run", data_dir, base_env, hook, preflight_record)
    rc, _ = run.finish()  # rank 1 is never released: it hangs in its save of step 4
    summary = check_hung(run, rc, last_step=3)
    assert (pause / "reached").exists()
    assert "pause (trainer/testhooks.py" in summary["hung"]["innermost"]["1"], summary["hung"]
    assert summary["hung"]["stopped_ranks"] == [], summary["hung"]
    assert summary["last_complete_checkpoint"]["step"] == 2, summary


@pytest.mark.heavy
def test_a_slow_save_is_not_a_hang_and_a_torchrun_that_outlives_its_ranks_is_ended(
    tmp_path, data_dir, base_env, preflight_record
):
    slow_s = FLOOR_S * 2  # far beyond a plain step's limit, within a first save's (PHASE_S)
    hook = {"LINGBOT_TEST_SLEEP_AT": f"checkpoint:2:1:{slow_s}"}
    run = Run(tmp_path / "run", data_dir, base_env, hook, preflight_record)
    run.until(lambda: progress_step(run) >= 3, "step 3 in progress.json")
    (agent,) = [p for p in psutil.Process(run.proc.pid).children() if "torch.distributed.run" in p.cmdline()]
    agent.suspend()  # SIGSTOP torchrun's agent: the ranks train on and finish, torchrun never exits
    rc, _ = run.finish()
    out = run.output
    assert rc == 0 and "no step for" not in out, out
    assert f"after every rank reported completion (step {STEPS}, checkpoint " in out, out
    assert "ended it; the work is done" in out and "Traceback" not in out, out
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["hung"] is None, summary
    assert summary["last_complete_checkpoint"]["step"] == STEPS, summary
    assert not psutil.pid_exists(agent.pid) or agent.status() == psutil.STATUS_ZOMBIE


# --- heavy: under the test Slurm ------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    from tests.support.slurm import SlurmCluster, SlurmUnavailable

    try:
        # its own job ids (and so torchrun ports) beside test_slurm's cluster, which may run at once
        root = tmp_path_factory.mktemp("slurm")
        cluster = SlurmCluster.start(root, cpus=8, requeue_delay_s=5, first_job_id=5001)
    except SlurmUnavailable as exc:
        pytest.skip(f"no Slurm here: {exc}")
    yield cluster
    cluster.stop()


@pytest.mark.heavy
def test_under_slurm_a_hang_requeues_once_and_the_same_hang_again_fails_for_good(
    tmp_path, base_env, slurm, preflight_record
):
    run_dir, pause = tmp_path / "run", tmp_path / "pause"
    seed_preflight(run_dir, preflight_record)  # both attempts reuse the session's compile checks
    script = tmp_path / "job.sbatch"
    argv = [str(REPO / "bin" / "train"), "furniture_train", "1", "--cpu-scale", "--run-dir", str(run_dir)]
    argv += [arg for item in [*TINY, f"data.path={tmp_path / 'episodes'}"] for arg in ("--set", item)]
    argv += ["--cpus-per-task", "1", "--sbatch", str(script)]
    # the one rank parks at step 4 in every attempt and is never released: a deterministic hang
    env = {**base_env, **pause_env(pause, "step:4", rank=0)}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    job = slurm.sbatch(script, env=env)
    record = slurm.wait(
        job, lambda j: j.get("JobState") in {"COMPLETED", "FAILED", "CANCELLED"} and int(j["Restarts"]) >= 1,
        timeout=1500, what="the requeued job's end",
    )  # fmt: skip
    log = "\n".join(p.read_text(errors="replace") for p in sorted(run_dir.glob("slurm-*.out")))
    out = log[-6000:]
    assert [record[k] for k in ("JobState", "ExitCode", "Restarts")] == ["FAILED", "1:0", "1"], (record, out)
    # the requeue is said however scontrol ends (it may end with the job's processes: supervise.requeue)
    asked = f"requeued Slurm job {job}" in log or f"requeue of Slurm job {job} asked" in log
    assert log.count("ranks 0 silent since step 3") >= 2 and asked, out
    assert log.count(": not rerun") == 2 and "Traceback" not in log, out  # the seed, in both attempts
    result = json.loads((run_dir / "summary.json").read_text())
    assert result["status"] == "failed" and result["resumed_from"] == 2, result
    assert "second hang after step 3" in result["hung"]["requeue"], result["hung"]
    assert [h["step"] for h in read_hangs(run_dir)] == [3, 3]
