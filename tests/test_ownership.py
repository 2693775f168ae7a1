"""One writer per run dir (trainer/launcher/ownership.py) and nodes left clean (trainer/launcher/tempdirs.py).

Fast: the stale-holder rules with fake hosts, pids, Slurm answers and heartbeat ages; taking, refusing,
releasing and taking over a record in a directory; which temporary directories a launch may remove.
Heavy (real launches of the tiny run, tests/support/runs.py):
- a launcher parked at step 2, a second `bin/train` of the same run dir is refused within seconds (exit
  73, the holder named); then the first launcher is killed with SIGKILL, and the next launch takes the run
  dir over (one line), removes the killed launcher's compile-cache copy (one line, bytes freed), and trains
  to the end (a 2-step run on 1 rank: ownership, refusal, takeover and clean-up are the launcher's);
- the same refusal with the run dir on a second mount (a tmpfs: a filesystem of its own).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.support import runs
from trainer.attempt import EXIT_BUSY
from trainer.launcher import ownership, tempdirs
from trainer.launcher.ownership import Clues, OwnerBusy, OwnerRecord, stale_reason, take_ownership

REPO = Path(__file__).resolve().parents[1]


def holder(**kw) -> OwnerRecord:
    base = {"host": "node-a", "pid": 4242, "boot_id": "boot-a", "pid_start": 1000.0, "since": 1.0e9}
    return OwnerRecord(**{**base, **kw})


def clues(**kw) -> Clues:
    base = {"host": "node-a", "boot_id": "boot-a", "heartbeat_age": 5.0, "stale_s": 150.0,
            "pid_start": lambda pid: None, "slurm_state": lambda job: None}  # fmt: skip
    return Clues(**{**base, **kw})


# --- fast ------------------------------------------------------------------------------------------


@pytest.mark.fast
def test_stale_rules_same_host_pid_and_boot():
    alive = clues(pid_start=lambda pid: 1000.0)
    assert stale_reason(holder(), alive) is None  # a live launcher on this host: never taken over
    assert "pid 4242 is not running" in str(stale_reason(holder(), clues()))
    reused = clues(pid_start=lambda pid: 2000.0)
    assert "another process" in str(stale_reason(holder(), reused))
    assert "rebooted" in str(stale_reason(holder(boot_id="boot-old"), alive))
    # a live pid on this host outlives any heartbeat age: the pid is the proof
    assert stale_reason(holder(), clues(pid_start=lambda pid: 1000.0, heartbeat_age=9999.0)) is None


@pytest.mark.fast
def test_stale_rules_other_host_heartbeat_and_slurm():
    other = holder(host="node-b", boot_id="boot-b")
    assert stale_reason(other, clues(heartbeat_age=149.0)) is None
    assert "heartbeat stopped 151 s ago (limit 150 s)" in str(stale_reason(other, clues(heartbeat_age=151.0)))
    job = holder(host="node-b", boot_id="boot-b", slurm_job_id="77", slurm_restarts=0)
    running = clues(slurm_state=lambda j: "RUNNING")
    assert stale_reason(job, running) is None
    assert "Slurm says job 77 is COMPLETED" in str(
        stale_reason(job, clues(slurm_state=lambda j: "COMPLETED"))
    )
    assert "no longer knows job 77" in str(stale_reason(job, clues(slurm_state=lambda j: "")))
    requeue = clues(slurm_job_id="77", slurm_restarts=1, slurm_state=lambda j: "RUNNING")
    assert "this is its requeue (Slurm job 77, restart 1)" in str(stale_reason(job, requeue))
    here = holder(slurm_job_id="77", slurm_restarts=0)  # on this host, its pid still alive: still taken
    alive_requeue = clues(slurm_job_id="77", slurm_restarts=2, pid_start=lambda pid: 1000.0)
    assert "this is its requeue" in str(stale_reason(here, alive_requeue))
    same_start = clues(slurm_job_id="77", slurm_restarts=0, slurm_state=lambda j: "RUNNING")
    assert stale_reason(job, same_start) is None  # the same start of the job: a live holder


@pytest.mark.fast
def test_take_refuse_release_and_take_over(tmp_path):
    run_dir = tmp_path / "run"
    owned, said = take_ownership(run_dir, {"SLURM_JOB_ID": "12"}, "bin/train x")
    assert said is None and owned.still_mine()
    with pytest.raises(OwnerBusy) as busy:
        take_ownership(run_dir, {}, "bin/train y")
    line = str(busy.value)
    assert f"host {socket.gethostname()}, pid {os.getpid()}, Slurm job 12, since " in line, line
    assert "pass another --run-dir" in line, line
    owned.release()
    assert not (run_dir / ownership.OWNER_NAME).exists()
    again, said = take_ownership(run_dir, {}, "")
    dead = clues(host=socket.gethostname(), boot_id=ownership.boot_id(), heartbeat_age=None)
    taken, said = take_ownership(run_dir, {}, "", clues=dead)  # judged: its pid is not running
    assert said is not None and f"taking it over from host {socket.gethostname()}, pid {os.getpid()}" in said
    assert taken.still_mine() and not again.still_mine()
    again.release()  # no longer its record: released without removing the new holder's
    assert taken.still_mine()
    taken.release()


@pytest.mark.fast
def test_heartbeat_refreshes_the_records_mtime(tmp_path):
    owned, _ = take_ownership(tmp_path, {"LINGBOT_OWNER_HEARTBEAT_S": "0.05"}, "")
    path = tmp_path / ownership.OWNER_NAME
    os.utime(path, (1.0, 1.0))
    deadline = time.monotonic() + 10
    while path.stat().st_mtime == 1.0 and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the file the heartbeat thread touches, with a deadline
    assert path.stat().st_mtime > 1.0
    owned.release()
    assert ownership.settings({"LINGBOT_OWNER_HEARTBEAT_S": "10"}) == (10.0, 50.0)


@pytest.mark.fast
def test_only_dead_launchers_dirs_of_this_user_and_project_are_removed(tmp_path):
    uid, boot = os.getuid(), ownership.boot_id()
    live = tmp_path / "lingbot-pid1-1-compile"
    live.mkdir()
    tempdirs.mark_launcher_dir(live)  # this process: alive
    dead = tmp_path / "lingbot-pid2-2-compile"
    (dead / "triton_cache_dir").mkdir(parents=True)
    (dead / "triton_cache_dir" / "k.bin").write_bytes(b"x" * 4096)
    tempdirs.mark_launcher_dir(dead)
    record = (dead / tempdirs.RECORD).read_text().replace(f'"pid_start": {ownership.pid_start(os.getpid())}',
                                                         '"pid_start": 1.0')  # fmt: skip
    (dead / tempdirs.RECORD).write_text(record)  # the same pid, started at another time: reused
    other_project = tmp_path / "lingbot-other"
    other_project.mkdir()
    (other_project / tempdirs.RECORD).write_text(f'{{"project": "someone-else", "pid": 1, "uid": {uid}}}')
    legacy_dead = tmp_path / "lingbot-pid9-4194304-compile"  # no record; pid above pid_max: not running
    legacy_dead.mkdir()
    legacy_live = tmp_path / f"lingbot-pid9-{os.getpid()}-compile"  # started before the dir was made
    legacy_live.mkdir()
    link = tmp_path / "lingbot-link-3-compile"
    link.symlink_to(dead)
    assert not tempdirs.stale_dir(live, uid, boot)
    assert tempdirs.stale_dir(dead, uid, boot) and tempdirs.stale_dir(legacy_dead, uid, boot)
    assert not tempdirs.stale_dir(other_project, uid, boot) and not tempdirs.stale_dir(legacy_live, uid, boot)
    assert not tempdirs.stale_dir(link, uid, boot)
    assert not tempdirs.stale_dir(dead, uid + 1, boot)  # another user's: never
    cleaned = tempdirs.clean([tmp_path])
    assert sorted(p.name for p in cleaned.dirs) == sorted([dead.name, legacy_dead.name])
    assert cleaned.bytes >= 4096 and "2 temporary dir(s)" in str(cleaned.line())
    assert live.is_dir() and other_project.is_dir() and legacy_live.is_dir() and link.is_symlink()


# --- heavy -----------------------------------------------------------------------------------------


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    out = runs.clean_env(tmp_path / "no-envs")
    scratch = tmp_path / "scratch"  # the node-local temp dir of these launches (nothing else's)
    scratch.mkdir()
    out["TMPDIR"] = str(scratch)
    return out


def bin_train(run_dir: Path, env: dict[str, str], *extra: str) -> tuple[int, str, float]:
    started = time.monotonic()
    argv = [str(REPO / "bin" / "train"), "furniture_train", "2", "--run-dir", str(run_dir), *extra]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def assert_refused(run_dir: Path, env: dict[str, str], holder_pid: int) -> None:
    rc, out, took = bin_train(run_dir, env)
    assert rc == EXIT_BUSY, out
    line = next(x for x in out.splitlines() if x.startswith("[bin/train] refused: "))
    assert f"run dir {run_dir} is in use by another bin/train (host {socket.gethostname()}, " in line, out
    assert f"pid {holder_pid}, since " in line and "pass another --run-dir" in line and "exit 73" in line, out
    assert "Traceback" not in out, out
    assert took < 60, (took, out)  # bin/train's own start-up included, at load
    print(f"\nsecond launch refused after {took:.1f} s")


@pytest.mark.heavy
def test_a_second_launch_is_refused_and_a_killed_holder_is_taken_over_and_cleaned(
    tmp_path, env, preflight_record
):
    run_dir, pause = tmp_path / "run", tmp_path / "pause"
    runs.seed_preflight(run_dir, preflight_record)
    short = {"overrides": runs.tiny(steps=2), "nproc": 1}  # all of it is the launcher's, not the ranks'
    first = runs.launch(
        run_dir, tmp_path / "episodes", env, extra_env=runs.pause_env(pause, "step:2"), **short
    )
    tree: list[psutil.Process] = []
    try:
        runs.wait_for(pause, "reached", first)  # rank 0 parked in step 2: the first launch is training
        tree = psutil.Process(first.pid).children(recursive=True)
        (copy,) = Path(env["TMPDIR"]).glob(f"lingbot-*-{first.pid}-compile")
        assert_refused(run_dir, env, first.pid)
    finally:
        os.kill(first.pid, signal.SIGKILL)  # the launcher: its finally never runs
        first.wait()
        runs.release(pause)
        for proc in tree:  # torchrun stops its ranks on the launcher's death; never leave one behind
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(tree, timeout=120)
    assert copy.is_dir()  # left behind by the killed launcher
    rc, out, _ = runs.finish(runs.launch(run_dir, tmp_path / "episodes", env, **short))
    assert rc == 0, out
    assert f"taking it over from host {socket.gethostname()}, pid {first.pid}" in out, out
    assert f"its pid {first.pid} is not running on this host" in out, out
    assert "removed 1 temporary dir(s) of launchers no longer running on this host" in out, out
    assert " MiB freed" in out and not copy.exists(), out
    assert not (run_dir / ownership.OWNER_NAME).exists()  # released after the verdict
    assert runs.summary(run_dir)["status"] == "completed"


@pytest.mark.heavy
def test_the_refusal_holds_on_a_second_mount(tmp_path, env, preflight_record):
    from tests.support.diskfull import Tmpfs

    mount = Tmpfs(tmp_path / "mnt", 64 * 2**20)
    try:
        run_dir, pause = mount.path / "run", tmp_path / "pause"
        runs.seed_preflight(run_dir, preflight_record)
        argv = [
            *runs.launcher_argv(run_dir),
            "--preflight-only",
            *runs.set_args([*runs.tiny(), f"data.path={tmp_path / 'episodes'}"]),
        ]
        first = subprocess.Popen(argv, cwd=REPO, env={**env, **runs.pause_env(pause, "preflight:0")},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        runs.wait_for(pause, "reached", first)  # the launcher holds the run dir, parked in its preflight
        assert_refused(run_dir, env, first.pid)
        runs.release(pause)
        rc, out, _ = runs.finish(first)
        assert rc == 0, out
        assert not (run_dir / ownership.OWNER_NAME).exists()
    finally:
        mount.umount()
