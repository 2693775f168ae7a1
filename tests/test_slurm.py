"""`bin/train --sbatch` under a real Slurm: what Slurm records, what summary.json says, the loss curve.

Every job runs the batch script exactly as `bin/train ... --sbatch FILE` wrote it (options chosen on the
bin/train command line only; the file is never edited) on a private single-host Slurm 22.05
(tests/support/slurm.py). Where Slurm cannot start (not root, packages not installable) every test here
skips with the reason.

The 14 scenarios run concurrently (the fixture `outcomes` submits all of them at once; each has a driver
thread that acts on what it observes): the whole module costs about as long as its slowest scenario.
Synchronisation is by observation, never by sleeps: LINGBOT_TEST_PAUSE_AT makes one rank announce itself
in PAUSE_DIR/reached and wait for PAUSE_DIR/release; a driver signals the job, waits for the launcher's
stop file (proof the stop request reached bin/train), then releases the rank. The "slow save" scenarios
pause rank 0 inside a checkpoint save (before its commit) and hold it there for SLOW_SAVE_S after the
signal: a save that takes longer than a minute, as a 5B model's does. The drivers read Slurm's view of
their jobs from one shared observer (tests/support/slurm_watch.py: one `scontrol` per WATCH_INTERVAL_S =
0.5 s for all jobs); a wait for a file looks every FILE_POLL_S without waiting for a query. "Never
FAILED" is checked on the watch's samples and on slurmctld's job-completion log, which has a line for
every end of a run (each requeue and the final state), so a FAILED shorter than a sample is still seen.

Ranks per job (a rank costs ~4-5 CPU-s per attempt on a host whose suite is bounded by CPU): 2 where the
claim is about ranks: the 2-rank reference (`complete`), a rank's error (rank_error: rank 1 named), kill -9
of torchrun (kill9_torchrun: every orphaned rank ended), usr1_slow (rank 0 held
inside an FSDP save while rank 1 waits; the README timeline); two_nodes_usr1 is 2 nodes x 1 rank. The
others run 1 rank: their claim is Slurm's signal -> bin/train -> save -> requeue path, or the warning's
lead covering an 80 s save (time_limit_slow), or KillWait ending a longer one, with Slurm still
requeueing and the job resuming from step 2 (requeue_slow). A save with a waiting peer stays usr1_slow's;
a partial multi-rank save never counting, test_resume's kill -9 mid-checkpoint and test_hang's hang in a
save. The 1-rank reference is preflight_usr1's: its first attempt stops in preflight, before any rank,
its requeued one trains steps 1-6 from scratch (resumed_from None, asserted).

`requeue` is the one unseeded scenario: its first preflight compiles under Slurm and records the pass,
its requeued attempt reuses that record (exactly one "not rerun"); the others reuse the session's pass.

Scenarios dropped to save their launches, and where their claims are held: complete_1 (the 1-rank
reference): preflight_usr1; time_limit (Slurm's warning -> save at a step -> requeue -> resume):
time_limit_slow (the same warning path, with a slow save) and usr1_first_step and two_nodes_usr1 (USR1,
what the warning sends the batch shell, at a step); two_nodes (`--nnodes 2` COMPLETED, NumNodes 2, nnodes
and world_size 2, losses == 1 node x 2 ranks, bitwise): two_nodes_usr1, whose requeued attempt runs
2 nodes uninterrupted to COMPLETED, with those asserts; usr1 (1 rank, USR1 at step 3 -> save at 3 ->
requeue -> resume bitwise): two_nodes_usr1 (the same at step 3, 2 nodes), usr1_first_step (1 node, 1 rank)
and usr1_slow (resumed from a mid-run save); kill9_rank (kill -9 of rank 1: FAILED 1:0, failed_rank 1,
SIGKILL in the reason): rank_error (a rank's failure is FAILED 1:0 under Slurm, the same verdict code) and
test_resume's kill -9 of rank 1 (failed_rank 1, SIGKILL in the reason and the rank's error).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.support import runs
from tests.support.runs import (
    REPO,
    STEPS,
    clean_env,
    losses_by_step,
    pause_env,
    seed_preflight,
    set_args,
    tiny,
)
from tests.support.slurm import (
    PAIR_PARTITION,
    SOLO_PARTITION,
    SlurmCluster,
    SlurmUnavailable,
    parse_record,
)
from tests.support.slurm_watch import JobWatch

TINY = tiny(keep=3, tensorboard=None)
NPROC = 2
ONE_RANK = {
    "usr1_first_step",
    "requeue",
    "time_limit_slow",
    "requeue_slow",
    "scancel",
    "preflight_usr1",
    "preflight_scancel",
}
SLOW_SAVE_S = 80  # longer than KILL_WAIT_S + 20 s: under TERM, Slurm's SIGKILL comes first
TIME_LIMIT_MIN = 30  # the time-limit scenarios' --time; the driver shortens it once rank 0 is parked
JOB_TIMEOUT = 900
# Scenarios whose run dir starts without the session's recorded compile-check pass (tests/support/runs.py):
# their first preflight compiles for real, under Slurm, and records the pass; their requeued attempt
# reuses that record (a pass recorded by an earlier attempt of the same job). Every other scenario reuses
# the session's pass.
UNSEEDED = {"requeue"}
WATCH_INTERVAL_S = 0.5  # one `scontrol` for all jobs per interval (tests/support/slurm_watch.py)
FILE_POLL_S = 0.2  # a wait for a file (pause point, stop file, log line) looks this often, without scontrol
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}

pytestmark = [pytest.mark.heavy, pytest.mark.slow]


# --- the cluster and the scripts -------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        root = tmp_path_factory.mktemp("slurm")
        # torchrun's port is 20000 + job id: a block of ids of this run's own (below test_hang's 5001...),
        # so that two runs of this module on one host (several checkouts) rarely share ports
        first = 1 + 200 * (os.getpid() % 24)
        cluster = SlurmCluster.start(
            root, cpus=32, requeue_delay_s=5, pair_nodes=2, solo_nodes=1, first_job_id=first
        )
    except SlurmUnavailable as exc:
        pytest.skip(f"no Slurm here: {exc}")
    yield cluster
    cluster.stop()


@dataclass
class Scenario:
    name: str
    root: Path
    data_dir: Path
    extra_cli: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    nproc: int = NPROC
    job: str = ""
    seen_states: set[str] = field(default_factory=set)
    notes: dict = field(default_factory=dict)
    watch: JobWatch | None = None  # the module's one observer of all jobs (the fixture `outcomes`)

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def script(self) -> Path:
        return self.root / "job.sbatch"

    @property
    def pause_dir(self) -> Path:
        return self.root / "pause"

    def pause(self, point: str, rank: int = 0) -> None:
        self.env.update(pause_env(self.pause_dir, point, rank))


def job_env(scenario: Scenario, no_envs: Path) -> dict[str, str]:
    """clean_env (no provisioned env: bin/train uses the tool env, loudly) plus the scenario's variables."""
    return {**clean_env(no_envs), **scenario.env}


def generate_script(scenario: Scenario, env: dict[str, str]) -> None:
    argv = [str(REPO / "bin" / "train"), "furniture_train", str(scenario.nproc), "--cpu-scale"]
    argv += ["--run-dir", str(scenario.run_dir), "--cpus-per-task", "2"]
    argv += set_args([*TINY, f"data.path={scenario.data_dir}"])
    argv += [*scenario.extra_cli, "--sbatch", str(scenario.script)]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{argv}: {done.stderr}"


# --- observing a job -------------------------------------------------------------------------------


def observe(cluster: SlurmCluster, sc: Scenario, fresh: bool = True) -> dict[str, str]:
    """Slurm's record of the scenario's job (the shared JobWatch: one `scontrol` per WATCH_INTERVAL_S for
    all jobs), every state seen added: from a query newer than this call (which paces the caller's loop),
    or, not `fresh`, the newest there is, without waiting."""
    assert sc.watch is not None, sc.name
    record = sc.watch.job(sc.job) if fresh else sc.watch.latest(sc.job)
    sc.seen_states |= sc.watch.states(sc.job)
    return record


def poll(cluster: SlurmCluster, sc: Scenario, ready: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait for `ready()` (a file: looked at every FILE_POLL_S) while recording every JobState Slurm shows;
    fail if the job ends first (the record is read before `ready()`: a job that ended after it came is no
    failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = observe(cluster, sc, fresh=False).get("JobState", "?")
        if ready():
            return
        if state in FINAL:
            raise AssertionError(f"{sc.name}: job {sc.job} ended {state} before {what}:\n{slurm_output(sc)}")
        time.sleep(FILE_POLL_S)  # polling for a file, with a deadline
    raise AssertionError(f"{sc.name}: timed out waiting for {what}:\n{slurm_output(sc)}")


def wait_final(cluster: SlurmCluster, sc: Scenario, restarts_at_least: int = 0) -> dict[str, str]:
    """Slurm's record once the job is in a final state (and has been requeued as often as asked)."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        record = observe(cluster, sc)  # waits for the next query (every WATCH_INTERVAL_S)
        if record.get("JobState") in FINAL and int(record.get("Restarts", 0)) >= restarts_at_least:
            return record
    raise AssertionError(f"{sc.name}: job {sc.job} not final after {JOB_TIMEOUT} s:\n{slurm_output(sc)}")


def reached(sc: Scenario) -> dict | None:
    return runs.reached(sc.pause_dir)


def reached_pid(sc: Scenario) -> int:
    found = reached(sc)
    assert found is not None, sc.name
    return int(found["pid"])


def stop_files(sc: Scenario) -> list[Path]:
    return sorted((sc.run_dir / "attempts").glob("*/stop"))


def release(sc: Scenario) -> None:
    runs.release(sc.pause_dir)


def slurm_log(sc: Scenario) -> str:
    """The job's whole log (every attempt appends to slurm-<job>.out): what the assertions search."""
    return "\n".join(p.read_text(errors="replace") for p in sorted(sc.run_dir.glob("slurm-*.out")))


def tail(text: str, chars: int = 6000) -> str:
    """The end of a log, for a failure message (never for an assertion: a requeued job's log is long,
    and a line of an earlier attempt is far from its end)."""
    return text[-chars:]


def slurm_output(sc: Scenario) -> str:
    return tail(slurm_log(sc))


def summary(sc: Scenario) -> dict:
    return runs.summary(sc.run_dir)


def ends(sc: Scenario, runs_ended: int) -> list[str]:
    """The JobState slurmctld wrote to its job-completion log (jobcomp/filetxt) at each end of the job's
    runs: one line per requeue (written as PENDING) and one for the final state; waits (with a deadline)
    until there are `runs_ended` lines. Unlike the watch's states (sampled every WATCH_INTERVAL_S), this
    holds every end: a FAILED that lasted less than an interval is in it."""
    assert sc.watch is not None, sc.name
    path = sc.watch.cluster.root / "jobcomp.txt"
    deadline = time.monotonic() + 60
    while True:
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        found = [r.get("JobState", "?") for r in map(parse_record, lines) if r.get("JobId") == sc.job]
        if len(found) >= runs_ended or time.monotonic() > deadline:
            return found
        time.sleep(0.5)  # polling slurmctld's log, with a deadline


def assert_never_failed(sc: Scenario, record: dict[str, str]) -> None:
    """No run of the job ended FAILED: none sampled by the watch, and none in the job-completion log,
    which holds every end (checked: one line per requeue plus the final one)."""
    assert "FAILED" not in sc.seen_states, (sc.seen_states, slurm_output(sc))
    found = ends(sc, int(record["Restarts"]) + 1)
    assert len(found) == int(record["Restarts"]) + 1 and "FAILED" not in found, (found, record)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- the drivers: one per scenario, run concurrently -----------------------------------------------


def drive_complete(cluster: SlurmCluster, sc: Scenario) -> dict:
    return wait_final(cluster, sc)


def drive_rank_error(cluster: SlurmCluster, sc: Scenario) -> dict:
    return wait_final(cluster, sc)


def drive_kill9_torchrun(cluster: SlurmCluster, sc: Scenario) -> dict:
    poll(cluster, sc, lambda: reached(sc) is not None, JOB_TIMEOUT, "rank 0 to pause at step 3")
    torchrun = psutil.Process(reached_pid(sc)).parent()
    assert torchrun is not None and "torch.distributed.run" in " ".join(torchrun.cmdline()), torchrun
    ranks = [p.pid for p in torchrun.children() if "trainer.loop.train" in " ".join(p.cmdline())]
    sc.notes["ranks"] = ranks
    torchrun.send_signal(signal.SIGKILL)
    release(sc)  # an orphaned rank 0 would now train on and claim completion
    record = wait_final(cluster, sc)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(alive(p) for p in ranks):
        time.sleep(0.2)  # polling the process table with a deadline
    sc.notes["ranks_alive"] = [p for p in ranks if alive(p)]
    return record


def drive_stop(how: list[str], slow: bool = False, time_limit_lead_s: int | None = None):
    """Pause rank 0 (at a step, or inside a save), stop the job with `how` (or with Slurm's time-limit
    warning: see shorten_time_limit), wait for the launcher's stop file, release (after SLOW_SAVE_S for a
    slow save), then wait for the final state."""

    def drive(cluster: SlurmCluster, sc: Scenario) -> dict:
        poll(cluster, sc, lambda: reached(sc) is not None, JOB_TIMEOUT, "rank 0 to pause")
        signalled = time.monotonic()
        if time_limit_lead_s is not None:
            shorten_time_limit(cluster, sc, time_limit_lead_s)
        elif how:
            cluster.run([*how, sc.job])
        poll(cluster, sc, lambda: bool(stop_files(sc)), 300, "bin/train's stop file")
        if time_limit_lead_s is not None:
            # the warning came (Slurm chose the moment): the requeued attempt runs under the submitted limit
            sc.notes["shortened_to_warning_s"] = time.monotonic() - signalled
            signalled = time.monotonic()
            cluster.run(["scontrol", "update", f"JobId={sc.job}", f"TimeLimit={TIME_LIMIT_MIN}"])
        sc.notes["signal_to_stop_file_s"] = time.monotonic() - signalled
        if slow:
            while time.monotonic() - signalled < SLOW_SAVE_S:
                time.sleep(0.5)  # the test-only slow save: rank 0 holds its save for SLOW_SAVE_S
        released = time.monotonic()
        release(sc)
        restarts = 0 if how[:1] == ["scancel"] and "--batch" not in how else 1
        sc.notes["timeline"] = timeline(cluster, sc, signalled, released)
        return wait_final(cluster, sc, restarts_at_least=restarts)

    return drive


def run_time_s(record: dict[str, str]) -> int:
    """Slurm's RunTime=[D-]HH:MM:SS in seconds."""
    days, _, clock = record["RunTime"].rpartition("-")
    h, m, sec = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


def shorten_time_limit(cluster: SlurmCluster, sc: Scenario, lead_s: int) -> None:
    """Make Slurm's own time-limit warning come now that rank 0 is parked: set the running job's limit
    (whole minutes) to the first that leaves at most lead_s + 60 s. slurmctld sends the script's
    --signal=B:USR1@lead when the time left drops to lead_s, at its next time-limit check (about every
    30 s): within ~90 s, with at least lead_s - 30 s left before the limit itself. A short --time
    instead makes the warning land wherever a loaded host happens to be; at load average 20 every
    attempt was still in its preflight when it came, and none ever reached a step."""
    limit_min = -(-(run_time_s(observe(cluster, sc)) + lead_s) // 60)
    cluster.run(["scontrol", "update", f"JobId={sc.job}", f"TimeLimit={limit_min}"])


def timeline(cluster: SlurmCluster, sc: Scenario, signalled: float, released: float) -> dict[str, float]:
    """Seconds after the signal of: the save released, a new complete checkpoint, Slurm's requeue
    (Restarts >= 1), the requeued attempt's start, the final state. The files are looked at every
    FILE_POLL_S; the Slurm events come from the newest query (at most WATCH_INTERVAL_S + a query late)."""
    before = set(sc.run_dir.glob("checkpoints/*/COMPLETE"))
    events = {"released": released - signalled}
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        record = observe(cluster, sc, fresh=False)
        now = time.monotonic() - signalled
        state = record.get("JobState", "?")
        if "saved" not in events and set(sc.run_dir.glob("checkpoints/*/COMPLETE")) - before:
            events["saved"] = now
        if "requeued" not in events and int(record.get("Restarts", 0)) >= 1:
            events["requeued"] = now
        if "resumed" not in events and list(sc.run_dir.glob(f"attempts/slurm{sc.job}-1*/rank_0.json")):
            events["resumed"] = now
        if state in FINAL:
            events["final"] = now
            return events
        time.sleep(FILE_POLL_S)  # polling for files and the watch's records, with a deadline
    return events


def drive_preflight_stop(how: list[str]):
    def drive(cluster: SlurmCluster, sc: Scenario) -> dict:
        poll(cluster, sc, lambda: reached(sc) is not None, JOB_TIMEOUT, "bin/train to pause in preflight")
        cluster.run([*how, sc.job])
        # the stop must reach bin/train while it waits in preflight: its stop note is the proof
        poll(cluster, sc, lambda: "before any rank started" in slurm_log(sc), 120, "the stop in preflight")
        release(sc)
        restarts = 1 if "--batch" in how else 0
        return wait_final(cluster, sc, restarts_at_least=restarts)

    return drive


def scenarios(root: Path, data_dir: Path) -> list[tuple[Scenario, Callable]]:
    def sc(name: str, *cli: str) -> Scenario:
        return Scenario(name, root / name, data_dir, list(cli), nproc=1 if name in ONE_RANK else NPROC)

    out = []
    out.append((sc("complete"), drive_complete))
    s = sc("rank_error")
    s.pause("step:2", rank=1)
    s.env["LINGBOT_TEST_PAUSE_DIR"] = str(s.root / "missing-dir")  # rank 1 raises FileNotFoundError there
    out.append((s, drive_rank_error))
    s = sc("kill9_torchrun")
    s.pause("step:3")
    out.append((s, drive_kill9_torchrun))
    for slow in (False, True):
        suffix = "_slow" if slow else ""
        point = "checkpoint:4" if slow else "step:3"
        if slow:  # at a step: two_nodes_usr1 and usr1_first_step (the docstring)
            s = sc("usr1_slow")
            s.pause(point)
            out.append(
                (s, drive_stop(["scancel", "--batch", "--signal=USR1"], slow))
            )  # Slurm's own time-limit warning: only with the slow save (its lead must cover it)
            # The warning comes --signal-lead s before the limit (slurmctld checks about every 30 s):
            # 200 s for an 80 s save (lead > save + the check's jitter + exit).
            lead = 200
            s = sc("time_limit_slow", "--time", str(TIME_LIMIT_MIN), "--signal-lead", str(lead))
            s.pause(point)
            out.append((s, drive_stop([], slow, time_limit_lead_s=lead)))
        s = sc(f"requeue{suffix}", *(["--partition", SOLO_PARTITION] if slow else []))
        if slow:  # its save outlasts KillWait: Slurm starts nothing else on a node while a job completes,
            s.env["MASTER_ADDR"] = "127.0.0.1"  # so on a node of its own (not in DNS, as the pair nodes)
        s.pause(point)
        out.append((s, drive_stop(["scontrol", "requeue"], slow)))
    # the path of the time-limit warning that lands while the ranks start: a stop at an attempt's first
    # step (saved at step 1; the resumed attempt then prints more than 6 KB after the stop line)
    s = sc("usr1_first_step")
    s.pause("step:1")
    out.append((s, drive_stop(["scancel", "--batch", "--signal=USR1"])))
    s = sc("scancel")
    s.pause("step:3")
    out.append((s, drive_stop(["scancel"])))
    # Two nodes (two slurmd on this host, partition PAIR_PARTITION) x 1 rank: the same world size as
    # `complete`, so the same losses. Their node names are not in DNS: MASTER_ADDR is 127.0.0.1.
    s = sc("two_nodes_usr1", "--nnodes", "2", "--partition", PAIR_PARTITION)
    s.nproc, s.env["MASTER_ADDR"] = 1, "127.0.0.1"
    s.pause("step:3")
    out.append((s, drive_stop(["scancel", "--batch", "--signal=USR1"])))
    # its first attempt stops before any rank starts, its requeued one trains from step 1: the 1-rank
    # jobs' uninterrupted reference (`references`)
    s = sc("preflight_usr1")
    s.pause("preflight:0")
    out.append((s, drive_preflight_stop(["scancel", "--batch", "--signal=USR1"])))
    s = sc("preflight_scancel")
    s.pause("preflight:0")
    out.append((s, drive_preflight_stop(["scancel"])))
    return out


@dataclass
class Outcome:
    scenario: Scenario
    future: Future

    def record(self) -> dict[str, str]:
        return self.future.result(timeout=JOB_TIMEOUT + 600)


@pytest.fixture(scope="module")
def outcomes(slurm, tmp_path_factory, preflight_record):
    started = time.monotonic()
    root = tmp_path_factory.mktemp("scenarios")
    no_envs = root / "no-envs"
    no_envs.mkdir()
    planned = scenarios(root, root / "episodes")
    pool = ThreadPoolExecutor(max_workers=len(planned))
    found: dict[str, Outcome] = {}
    envs = {}
    for scenario, _ in planned:
        scenario.root.mkdir(parents=True, exist_ok=True)
        if scenario.name not in UNSEEDED:
            seed_preflight(scenario.run_dir, preflight_record)
        envs[scenario.name] = job_env(scenario, no_envs)
    # every script first (bin/train --sbatch, a few at once), then every job at once
    with ThreadPoolExecutor(max_workers=4) as writers:
        list(writers.map(lambda p: generate_script(p[0], envs[p[0].name]), planned))
    watch = JobWatch(slurm, interval=WATCH_INTERVAL_S)
    for scenario, drive in planned:
        scenario.watch = watch
        scenario.job = slurm.sbatch(scenario.script, env=envs[scenario.name])
        found[scenario.name] = Outcome(scenario, pool.submit(drive, slurm, scenario))
    yield found
    pool.shutdown(wait=True, cancel_futures=True)
    watch.stop()
    print(f"\ntest_slurm: {len(planned)} scenarios, {time.monotonic() - started:.0f} s wall")


def outcome(outcomes, name: str) -> tuple[Scenario, dict[str, str]]:
    found = outcomes[name]
    return found.scenario, found.record()


def assert_requeued_and_completed(sc: Scenario, record: dict[str, str], reference: dict) -> dict:
    log = slurm_log(sc)
    out = tail(log)
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", (record, out)
    assert int(record["Restarts"]) >= 1, (record, out)
    assert_never_failed(sc, record)
    result = summary(sc)
    assert result["status"] == "completed" and result["exit_code"] == 0, result
    assert result["resumed_from"] is not None, result
    losses = losses_by_step(sc.run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1)), losses
    assert losses == reference, (losses, reference)  # after the resume: exactly the uninterrupted run's
    assert "SignalException" not in log, out
    return result


def completed_losses(outcomes, name: str) -> dict:
    sc, record = outcome(outcomes, name)
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", (record, slurm_output(sc))
    return losses_by_step(sc.run_dir)


@pytest.fixture(scope="module")
def reference(outcomes) -> dict:
    """The uninterrupted 2-rank run's losses (the `complete` scenario)."""
    return completed_losses(outcomes, "complete")


@pytest.fixture(scope="module")
def references(outcomes, reference) -> dict[int, dict]:
    """Per rank count, the uninterrupted run's losses (1 rank: `preflight_usr1`, whose first attempt
    stopped in its preflight, before any rank: its requeued attempt trained every step from scratch)."""
    one = completed_losses(outcomes, "preflight_usr1")
    sc, _ = outcome(outcomes, "preflight_usr1")
    assert summary(sc)["resumed_from"] is None, summary(sc)  # no checkpoint before the training attempt
    assert sorted(one) == sorted(reference) and one != reference, (one, reference)  # another world size
    return {NPROC: reference, 1: one}


# --- the tests -------------------------------------------------------------------------------------


def test_run_to_completion(outcomes, reference):
    sc, record = outcome(outcomes, "complete")
    assert int(record["Restarts"]) == 0, record
    result = summary(sc)
    assert result["status"] == "completed" and result["exit_code"] == 0, result
    assert sorted(reference) == list(range(1, STEPS + 1))
    log = slurm_log(sc)
    assert "no provisioned env found; running in the tool environment" in log, tail(log)


def test_generated_script_is_submittable_as_written(tmp_path, slurm):
    """CPU partition by default (no GPU request), CPUs per task set, a GPU request when asked, and a
    --sbatch path or run dir that cannot be made is refused with exit 2. (Placed after the first scenario
    test: its bin/train runs overlap the other scenarios' jobs instead of delaying their start.)"""
    sc = Scenario("gen", tmp_path, tmp_path / "episodes")
    env = job_env(sc, tmp_path)
    generate_script(sc, env)
    text = sc.script.read_text()
    assert text.endswith("\n") and "--gpus-per-node" not in text and "#SBATCH --cpus-per-task=2" in text
    assert (sc.run_dir).is_dir()  # --output's directory exists before Slurm opens it
    subprocess.run(["bash", "-n", str(sc.script)], check=True)
    sc.extra_cli = ["--gpus-per-node", "2"]
    generate_script(sc, env)
    assert "#SBATCH --gpus-per-node=2" in sc.script.read_text()
    test_only = slurm.run(["sbatch", "--test-only", str(sc.script)], check=False)
    assert test_only.returncode == 0, test_only.stderr  # the GPU request is schedulable here
    for bad in (["--sbatch", str(tmp_path / "missing" / "dir" / "job.sbatch")],
                ["--run-dir", "/proc/no/such/run", "--sbatch", str(tmp_path / "x.sbatch")]):  # fmt: skip
        done = subprocess.run(
            [str(REPO / "bin" / "train"), "furniture_train", "2", "--cpu-scale", *bad],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, (bad, done.stderr)
        assert "Traceback" not in done.stderr and "exit 2" not in done.stdout, done.stderr


def test_the_compile_checks_run_once_per_node_and_env(outcomes):
    """The unseeded scenario (`requeue`) compiled in its first preflight, under Slurm, and recorded the
    pass, which its requeued attempt reused (one "not rerun" line in the job's log, the second attempt's);
    a seeded one reused the session's pass (same node, boot, env, variables, check code) from its first
    preflight instead of compiling again."""
    for name in ("requeue", "complete", "rank_error", "usr1_first_step"):
        sc, record = outcome(outcomes, name)
        log = slurm_log(sc)
        preflights = log.split("\n[bin/train] preflight passed")  # each attempt's preflight step ends so
        first_reused = "passed on this node" in preflights[0] and ": not rerun" in preflights[0]
        assert first_reused == (name not in UNSEEDED), (name, tail(log))
        if name in UNSEEDED:
            assert int(record["Restarts"]) >= 1 and len(preflights) >= 3, (record, tail(log))
            assert log.count(": not rerun") == 1 and ": not rerun" in preflights[1], (name, tail(log))
        assert (sc.run_dir / "preflight").is_dir(), name


def test_a_rank_runtime_error_fails_the_job_naming_the_rank(outcomes):
    sc, record = outcome(outcomes, "rank_error")
    assert record["JobState"] == "FAILED" and record["ExitCode"] == "1:0", (record, slurm_output(sc))
    result = summary(sc)
    assert result["status"] == "failed" and result["failed_rank"] == 1, result
    assert "FileNotFoundError" in result["reason"], result


def test_kill9_of_torchrun_fails_and_leaves_no_rank_running(outcomes):
    sc, record = outcome(outcomes, "kill9_torchrun")
    assert record["JobState"] == "FAILED" and record["ExitCode"] == "1:0", (record, slurm_output(sc))
    assert sc.notes["ranks"] and sc.notes["ranks_alive"] == [], sc.notes
    result = summary(sc)
    assert result["status"] == "failed", result
    assert "torchrun" in result["reason"], result


@pytest.mark.parametrize(
    "name",
    [
        "usr1_first_step",
        "requeue",
        "usr1_slow",
        "time_limit_slow",
        "requeue_slow",
    ],
)
def test_a_stop_is_saved_requeued_resumed_and_completed(outcomes, references, name):
    sc, record = outcome(outcomes, name)
    assert sc.nproc == (1 if name in ONE_RANK else NPROC), sc.nproc
    result = assert_requeued_and_completed(sc, record, references[sc.nproc])
    log = slurm_log(sc)
    out = tail(log)
    if name == "requeue_slow":
        # KillWait (60 s here) ends a save that takes longer: Slurm requeues anyway, the job resumes
        # from the previous complete checkpoint and still completes.
        assert result["resumed_from"] == 2, result
    elif name == "usr1_first_step":
        assert result["resumed_from"] == 1 and "stopping at step 1 " in log, (result, out)
    else:
        # the save at the stop completed: the requeued attempt resumes from it (said by the attempt that
        # stopped: anywhere in the log, which every attempt appends to)
        step = 4 if name.endswith("_slow") else 3
        assert result["resumed_from"] == step and f"stopping at step {step} " in log, (result, out)


def test_two_nodes_complete_and_a_usr1_on_both_is_saved_requeued_and_resumed(outcomes, reference):
    """`--nnodes 2` on two slurmd, and `scancel --batch --signal=USR1` (srun passes it to the task on
    every node): both launchers stop, node 0 waits for node 1's report, requeues, and the requeued job
    (again 2 nodes x 1 rank, uninterrupted to the end) resumes from step 3 and COMPLETES with the
    uninterrupted 1 node x 2 ranks run's losses, bitwise."""
    sc, record = outcome(outcomes, "two_nodes_usr1")
    assert record["NumNodes"] == "2", record
    result = assert_requeued_and_completed(sc, record, reference)
    assert result["nnodes"] == 2 and result["world_size"] == 2, result
    log = slurm_log(sc)
    assert result["resumed_from"] == 3 and "stopping at step 3 " in log, (result, tail(log))
    assert log.count("[bin/train] received SIGUSR1") >= 2, tail(log)  # one line per node's launcher
    stopped = sorted(sc.run_dir.glob("attempts/*/node1.outcome.json"))[0]
    node1 = json.loads(stopped.read_text())
    assert node1["status"] == "preempted" and node1["exit_code"] == 75, node1
    assert node1["signals"][:1] == ["SIGUSR1"], node1


def test_plain_scancel_is_a_cancel_not_a_requeue(outcomes, slurm):
    sc, record = outcome(outcomes, "scancel")
    out = slurm_log(sc)
    assert record["JobState"] == "CANCELLED" and int(record["Restarts"]) == 0, (record, out)
    # bin/train saved and exited after the cancel; nothing it did afterwards may requeue the job
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "[bin/train] preempted" not in out:
        time.sleep(0.5)  # polling the job's log with a deadline
        out = slurm_log(sc)
    assert "[bin/train] preempted" in out, tail(out)
    again = slurm.job(sc.job)
    assert again["JobState"] == "CANCELLED" and int(again["Restarts"]) == 0, (again, tail(out))
    result = summary(sc)
    assert result["status"] == "preempted" and result["last_complete_checkpoint"]["step"] == 3, result
    after = out.split("[bin/train] preempted", 1)[1]
    assert "requeue" not in after.lower() or "not requeued" in after, tail(out)


@pytest.mark.parametrize("name,state", [("preflight_usr1", "COMPLETED"), ("preflight_scancel", "CANCELLED")])
def test_a_stop_during_preflight_is_never_a_failure(outcomes, name, state):
    sc, record = outcome(outcomes, name)
    log = slurm_log(sc)
    out = tail(log)
    assert record["JobState"] == state, (record, out)
    assert_never_failed(sc, record)
    assert "envcheck could not run" not in log, out
    if state == "COMPLETED":
        assert int(record["Restarts"]) >= 1 and record["ExitCode"] == "0:0", record
        assert summary(sc)["status"] == "completed"
    else:
        assert int(record["Restarts"]) == 0, record


def test_timeline_of_a_preemption_with_a_slow_save(outcomes, reference):
    """signal -> saved -> requeued -> resumed -> completed, for the README (printed; asserted ordered)."""
    sc, record = outcome(outcomes, "usr1_slow")
    assert_requeued_and_completed(sc, record, reference)
    t = sc.notes["timeline"]
    print(
        f"\ntimeline usr1_slow (s after the signal): stop file {sc.notes['signal_to_stop_file_s']:.1f}, {t}"
    )
    order = ["released", "saved", "requeued", "resumed", "final"]
    assert all(k in t for k in order), t
    assert [t[k] for k in order] == sorted(t[k] for k in order), t
    assert t["released"] >= SLOW_SAVE_S, t
