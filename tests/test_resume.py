"""End to end on 2 CPU ranks: resume, preemption at several points, kill -9 of a rank, teardown hiccups.

Every run is `python -m trainer.launcher` (what bin/train execs) with a tiny model. Synchronisation is by
files, never by sleeps: LINGBOT_TEST_PAUSE_AT makes one rank announce itself in PAUSE_DIR/reached and
wait for PAUSE_DIR/release; the test signals the launcher, waits for the launcher's stop file (proof the
stop request is out), then releases the rank.

"Bitwise" compares, per step, the full metrics.jsonl tuple (KEYS: the losses, grad_norm, lr and the held-out
losses). These tiny runs evaluate at every checkpoint (trainer/loop/train.py _save; not in a preemption's
save): the reference at 2, 4 and 6, each chain at the same steps (kill -9's rerun resumes from checkpoint 2,
written after an evaluation). So these tests also hold test_validate.py's "training after an evaluation
continues bit for bit, also across a resume, with the same held-out losses" (that module's resumed pair was
moved here); that an evaluation leaves training as without one stays test_validate.py's.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.support.runs import (
    STEPS,
    clean_env,
    complete_steps,
    pause_env,
    release,
    seed_preflight,
    summary,
    tiny,
    wait_for,
)
from tests.support.runs import finish as finish3
from tests.support.runs import launch as launch_any

TINY = tiny(keep=2, tensorboard=True)
KEYS = ("latent_loss", "action_loss", "grad_norm", "lr", "val_latent_loss", "val_action_loss")

pytestmark = [pytest.mark.heavy, pytest.mark.slow]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("episodes") / "furniture"


@pytest.fixture(scope="module")
def base_env(tmp_path_factory) -> dict[str, str]:
    return clean_env(tmp_path_factory.mktemp("no-envs"))  # no provisioned env: the tool env


def launch(run_dir: Path, data_dir: Path, env: dict[str, str], *, extra_env=None):
    return launch_any(run_dir, data_dir, env, overrides=TINY, extra_env=extra_env)


def finish(proc) -> tuple[int, str]:
    rc, out, _ = finish3(proc)
    return rc, out


def records(run_dir: Path) -> dict[int, tuple]:
    """Per step, the KEYS of the metrics.jsonl record of the last attempt that ran it (None: absent)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: tuple(r.get(k) for k in KEYS) for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir, base_env, preflight_record) -> tuple[Path, dict]:
    """An uninterrupted run from an empty checkpoint dir, with rank 1 aborting after
    destroy_process_group (the teardown hiccup): it must still count as completed."""
    run_dir = tmp_path_factory.mktemp("reference")
    (run_dir / "checkpoints").mkdir()
    seed_preflight(run_dir, preflight_record)
    rc, out = finish(launch(run_dir, data_dir, base_env, extra_env={"LINGBOT_TEST_ABORT_AFTER_DESTROY": "1"}))
    assert rc == 0, out
    assert "fresh start: checkpoint directory" in out and "is empty" in out, out
    got = records(run_dir)
    evaluated = [step for step, r in sorted(got.items()) if r[-1] is not None]
    assert evaluated == list(range(2, STEPS + 1, 2)), got  # held-out losses at every save
    return run_dir, got


def test_uninterrupted_run_survives_teardown_abort_and_rerun_is_a_no_op(reference, data_dir, base_env):
    run_dir, by_step = reference
    s = summary(run_dir)
    assert s["status"] == "completed" and s["exit_code"] == 0
    assert s["torchrun_exit_code"] != 0  # rank 1 really aborted in teardown
    assert any("teardown" in note for note in s["notes"])
    assert (s["first_step"], s["last_step"], s["steps_requested"]) == (1, STEPS, STEPS)
    assert s["last_complete_checkpoint"]["step"] == STEPS
    assert set(s["final_losses"]) == {"loss", "latent_loss", "action_loss"}
    assert s["timing"]["steps"] >= 1 and 0 < s["timing"]["compute_share"] <= 1
    assert sorted(by_step) == list(range(1, STEPS + 1))
    assert complete_steps(run_dir) == [4, 6]  # keep=2
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))

    attempts = sorted((run_dir / "attempts").iterdir())
    metrics_before = (run_dir / "metrics.jsonl").read_text()
    rc, out = finish(launch(run_dir, data_dir, base_env))
    assert rc == 0, out
    assert "run complete" in out and "nothing to train" in out
    assert sorted((run_dir / "attempts").iterdir()) == attempts  # no torchrun started
    assert (run_dir / "metrics.jsonl").read_text() == metrics_before


def test_sigterm_during_a_step_then_during_a_checkpoint_write_resumes_bitwise(
    reference, tmp_path, data_dir, base_env, preflight_record
):
    _, expected = reference
    run_dir = tmp_path / "run"
    seed_preflight(run_dir, preflight_record)
    # Only partial checkpoints: a killed save's tmp dir and a final-named dir without COMPLETE.
    (run_dir / "checkpoints" / "checkpoint_step_4.tmp-dead").mkdir(parents=True)
    (run_dir / "checkpoints" / "checkpoint_step_2").mkdir()
    (run_dir / "checkpoints" / "checkpoint_step_2" / ".metadata").write_text("half")

    # 1. SIGTERM while rank 0 is inside step 3 (after its first micro-batch).
    pause = tmp_path / "pause1"
    proc = launch(run_dir, data_dir, base_env, extra_env=pause_env(pause, "step:3"))
    wait_for(pause, "reached", proc)
    proc.send_signal(signal.SIGTERM)
    wait_for(run_dir, "attempts/*/stop", proc)
    release(pause)
    rc, out = finish(proc)
    assert rc == 75, out
    assert "fresh start: only partial checkpoints" in out, out
    s = summary(run_dir)
    assert s["status"] == "preempted" and s["exit_code"] == 75
    assert s["last_step"] == 3 and s["last_complete_checkpoint"]["step"] == 3
    assert s["reason"] == "preempted at step 3: the launcher received SIGTERM", (
        s
    )  # not the SIGUSR1 it forwarded
    assert complete_steps(run_dir) == [2, 3]
    assert not list((run_dir / "checkpoints").glob("*.tmp-*"))  # the dead partial one was cleaned up

    # 2. Resume; SIGUSR1 then SIGTERM while rank 0 is writing checkpoint 4, before it is committed.
    pause = tmp_path / "pause2"
    earlier_stops = frozenset(run_dir.glob("attempts/*/stop"))  # the first attempt's
    proc = launch(run_dir, data_dir, base_env, extra_env=pause_env(pause, "checkpoint:4"))
    wait_for(pause, "reached", proc)
    proc.send_signal(signal.SIGUSR1)  # Slurm's --signal=B:USR1@120, as forwarded by the batch script
    wait_for(run_dir, "attempts/*/stop", proc, ignore=earlier_stops)
    proc.send_signal(signal.SIGTERM)  # a second signal during the save changes nothing
    release(pause)
    rc, out = finish(proc)
    assert rc == 75, out
    assert "resuming from" in out and "checkpoint_step_3" in out
    s = summary(run_dir)
    assert (s["status"], s["first_step"], s["last_step"]) == ("preempted", 4, 4)
    assert s["last_complete_checkpoint"]["step"] == 4
    assert complete_steps(run_dir) == [3, 4]

    # 3. Resume to the end: the loss curve is the uninterrupted run's, bit for bit.
    rc, out = finish(launch(run_dir, data_dir, base_env))
    assert rc == 0, out
    assert summary(run_dir)["status"] == "completed"
    assert records(run_dir) == expected  # held-out losses included


def test_kill9_of_one_rank_mid_checkpoint_fails_naming_it_and_keeps_the_previous_checkpoint(
    reference, tmp_path, data_dir, base_env, preflight_record
):
    _, expected = reference
    run_dir = tmp_path / "run"
    seed_preflight(run_dir, preflight_record)
    pause = tmp_path / "pause"
    proc = launch(run_dir, data_dir, base_env, extra_env=pause_env(pause, "checkpoint:4", rank=1))
    reached = json.loads(wait_for(pause, "reached", proc).read_text())
    assert reached["rank"] == 1
    os.kill(reached["pid"], signal.SIGKILL)
    rc, out = finish(proc)
    assert rc == 1, out
    s = summary(run_dir)
    assert s["status"] == "failed" and s["exit_code"] == 1
    assert s["failed_rank"] == 1, s
    assert "rank 1" in s["reason"] and "SIGKILL" in s["reason"] and "SIGKILL" in s["rank_error"], s
    assert s["last_complete_checkpoint"]["step"] == 2
    assert complete_steps(run_dir) == [2]  # the half-written checkpoint 4 is not taken for complete
    assert "FAILED: rank 1" in out

    rc, out = finish(launch(run_dir, data_dir, base_env))
    assert rc == 0, out
    assert "resuming from" in out and "checkpoint_step_2" in out
    assert records(run_dir) == expected  # held-out losses included
