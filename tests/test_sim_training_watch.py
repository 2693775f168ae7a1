"""The simulator evaluation during training, without a run or a simulator: the eval.* rules, the pins and
best-by-sim that retention and checkpoints/best follow, and the launcher's watcher (trainer/launcher/
simeval.py) driving a stand-in evaluator command (a shell script in place of bin/evaluate's python: what is
tested is the watcher's bookkeeping, not the evaluation; tests/test_sim_training.py runs the real one)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import time
from pathlib import Path

import pytest

from trainer.checkpoint import simrecords
from trainer.checkpoint.best import BestPin, best_by_of
from trainer.checkpoint.layout import CheckpointInfo, prune, scan
from trainer.checkpoint.size import estimate_bytes, model_size
from trainer.config import apply_overrides, load_config, parse_set
from trainer.config.rules import violations
from trainer.launcher import simeval
from trainer.launcher.errors import PreflightError
from trainer.launcher.preflight import space_check

pytestmark = pytest.mark.fast


def _cfg(*sets: str):
    cfg = load_config("libero", cpu_scale=True)
    apply_overrides(cfg, parse_set(list(sets)), "--set")
    return cfg


def test_rules_judge_the_eval_keys():
    assert not violations(_cfg("eval.sim=libero", "eval.sim_every=20"))
    bad = violations(_cfg("eval.sim=libero", "eval.sim_every=15"))  # checkpoint.every is 10 at cpu scale
    assert len(bad) == 1 and "eval.sim_every=15" in bad[0] and "multiple of checkpoint.every" in bad[0]
    assert not violations(_cfg("eval.sim_every=15"))  # off: nothing to line up
    (line,) = violations(_cfg("eval.best_by=sim"))
    assert "eval.best_by='sim'" in line and "eval.sim set" in line
    (line,) = violations(_cfg("eval.sim_tasks=1-"))
    assert "eval.sim_tasks" in line
    assert not violations(_cfg("eval.sim_tasks=0-2,5", "eval.sim_device=cuda:7"))
    full = load_config("libero", cpu_scale=False).eval
    assert (full.sim, full.sim_every, full.sim_episodes) == ("libero", 200, 50)
    assert load_config("furniture_train", cpu_scale=False).eval.sim == "none"


def _checkpoint(root: Path, step: int) -> CheckpointInfo:
    path = root / f"checkpoint_step_{step}"
    path.mkdir(parents=True)
    (path / "train_state.json").write_text(json.dumps({"step": step}))
    files = {p.name: p.stat().st_size for p in path.iterdir()}
    (path / "COMPLETE").write_text(json.dumps({"step": step, "files": files}))
    return CheckpointInfo(step, path)


def test_retention_keeps_a_pinned_checkpoint_and_best_by_sim(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    for step in (2, 4, 6, 8):
        _checkpoint(root, step)
    simrecords.pin(root, 2)
    for step, rate in ((4, 0.5), (6, 0.75), (8, 0.75)):
        simrecords.write_record(root, {"step": step, "status": "done", "success_rate": rate})
    simrecords.write_record(root, {"step": 2, "status": "abandoned", "success_rate": None})
    assert best_by_of(_cfg("eval.sim=libero", "eval.sim_every=10", "eval.best_by=sim")) == "sim"
    prune(root, keep=1, keep_step=8, pin=BestPin(root, "sim"))
    assert [c.step for c in scan(root)[0]] == [2, 6, 8]  # pinned, best (earliest of the highest), newest
    assert os.readlink(root / "best") == "checkpoint_step_6"
    simrecords.unpin(root, 2)
    prune(root, keep=1, keep_step=8, pin=BestPin(root, "sim"))
    assert [c.step for c in scan(root)[0]] == [6, 8]


FAKE_EVALUATOR = """#!/bin/sh
# stand-in for `python -m trainer.evaluation.cli CKPT --sim libero ... --plots-dir OUT ...`
# SIGINT ends it at once, as it ends bin/evaluate's python (KeyboardInterrupt); with $STUBBORN present
# it ignores SIGINT (so does its sleep: an ignored signal is inherited): the SIGKILL after the grace ends it
if [ -f "$STUBBORN" ]; then trap '' INT; else trap 'exit 130' INT; fi
out=""; prev=""
for a in "$@"; do [ "$prev" = "--plots-dir" ] && out="$a"; prev="$a"; done
echo "$@" > "$out/argv"
if [ -f "$HOLD" ]; then touch "$out/holding"; while [ -f "$HOLD" ]; do sleep 0.05; done; fi
[ -d "$3" ] || exit 1  # the checkpoint went away while it was read
[ -f "$EXIT_WITH" ] && exit "$(cat "$EXIT_WITH")"  # a run with errored episodes (1) or bad input (2)
printf '{"success_rate": 0.5, "episodes": 2, "successes": 1, "requested": 2, "missing": 0, "out": "%s"}' \
  "$out" > "$out/results.json"
"""


def _watcher(tmp_path: Path, *sets: str) -> simeval.SimEval:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_EVALUATOR)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    cfg = _cfg("eval.sim=libero", "eval.sim_every=2", "eval.sim_tasks=0", "eval.sim_episodes=2", *sets)
    env = {**os.environ, "HOLD": str(tmp_path / "hold"), "EXIT_WITH": str(tmp_path / "exit-with"),
           "STUBBORN": str(tmp_path / "stubborn")}  # fmt: skip
    return simeval.SimEval(cfg, tmp_path / "run", str(fake), env, tmp_path / "stop")


def _drive(sim: simeval.SimEval) -> None:
    """Poll until nothing runs (the fake evaluator ends on its own unless held)."""
    sim.poll()
    while sim.current is not None:
        sim.current.proc.wait(timeout=60)
        sim.poll()


def test_watcher_evaluates_due_checkpoints_and_publishes(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    sim = _watcher(tmp_path, "eval.best_by=sim")
    _checkpoint(root, 1)
    _checkpoint(root, 2)
    _drive(sim)
    records = simrecords.read_records(root)
    assert list(records) == [2] and records[2]["status"] == "done" and records[2]["success_rate"] == 0.5
    out = tmp_path / "run" / "evaluation" / "checkpoint_step_2" / "libero" / "libero_10"
    argv = (out / "argv").read_text().split()
    assert argv[:4] == ["-m", "trainer.evaluation.cli", str(root / "checkpoint_step_2"), "--sim"]
    assert argv[argv.index("--tasks") + 1] == "0" and argv[argv.index("--episodes") + 1] == "2"
    (line,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert line["record"] == "sim" and line["step"] == 2 and line["sim/success_rate"] == 0.5
    assert os.readlink(root / "best") == "checkpoint_step_2"
    assert not simrecords.pinned_steps(root)
    sim.publisher.close()
    assert list((tmp_path / "run" / "tensorboard").glob("*.sim"))


def test_watcher_records_a_pruned_and_a_removed_checkpoint(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    sim = _watcher(tmp_path)
    (tmp_path / "hold").touch()
    for step in (2, 4, 6):
        _checkpoint(root, step)
    sim.poll()  # step 2 runs (held), 4 and 6 queued
    assert sim.current is not None and simrecords.pinned_steps(root) == {2}
    shutil.rmtree(root / "checkpoint_step_4")  # checkpoint.keep pruned it before its turn
    shutil.rmtree(root / "checkpoint_step_2")  # gone while evaluated (by hand: the pin keeps it from prune)
    (tmp_path / "hold").unlink()
    _drive(sim)
    records = simrecords.read_records(root)
    assert {s: r["status"] for s, r in records.items()} == {2: "abandoned", 4: "skipped", 6: "done"}
    assert "removed while evaluated" in records[2]["reason"] and records[2]["success_rate"] is None
    _checkpoint(root, 10)  # 8 was saved and pruned between two polls: said, not silently lost
    _drive(sim)
    records = simrecords.read_records(root)
    assert records[8]["status"] == "skipped" and records[10]["status"] == "done"


def test_stop_abandons_the_running_evaluation_and_the_queue(tmp_path, monkeypatch):
    """The evaluator ends on abandon()'s SIGINT, also when the launcher ignores SIGINT (started with `&` from
    a non-interactive shell): the child's dispositions are reset before its exec."""
    monkeypatch.setattr(simeval, "ABANDON_GRACE_S", 5.0)  # not met: it ends on the SIGINT
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _stop_abandons(tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_abandons(tmp_path: Path) -> None:
    root = tmp_path / "run" / "checkpoints"
    sim = _watcher(tmp_path)
    (tmp_path / "hold").touch()
    _checkpoint(root, 2)
    _checkpoint(root, 4)
    sim.poll()
    out = tmp_path / "run" / "evaluation" / "checkpoint_step_2" / "libero" / "libero_10"
    deadline = time.monotonic() + 60
    while not (out / "holding").exists():  # the evaluator is inside its evaluation
        assert sim.current is not None and sim.current.proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)  # polling for an event, with a deadline
    proc = sim.current.proc
    (tmp_path / "stop").touch()  # the attempt's stop file: a stop signal reached the launcher
    sim.poll()
    assert proc.poll() == 130 and sim.current is None  # SIGINT ended it, as it ends bin/evaluate
    records = simrecords.read_records(root)
    assert {s: r["status"] for s, r in records.items()} == {2: "abandoned", 4: "abandoned"}
    assert records[2]["success_rate"] is None and not (out / "results.json").exists()
    assert not simrecords.pinned_steps(root)


@pytest.mark.parametrize("wait", [True, False])
def test_finish_waits_within_its_bound_or_abandons(tmp_path, monkeypatch, wait):
    """Past the bound the evaluation is abandoned; one that ignores SIGINT is killed after the grace (here
    0.5 s instead of ABANDON_GRACE_S's 20) and leaves no process behind."""
    monkeypatch.setattr(simeval, "ABANDON_GRACE_S", 0.5)
    root = tmp_path / "run" / "checkpoints"
    sim = _watcher(tmp_path, f"eval.sim_wait_s={60 if wait else 0}")
    _checkpoint(root, 2)
    (tmp_path / "hold").touch()
    if not wait:
        (tmp_path / "stubborn").touch()
    sim.poll()
    out = tmp_path / "run" / "evaluation" / "checkpoint_step_2" / "libero" / "libero_10"
    deadline = time.monotonic() + 60
    while not (out / "holding").exists():  # past its trap line: SIGINT now meets what the test set up
        assert sim.current is not None and sim.current.proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)  # polling for an event, with a deadline
    proc = sim.current.proc
    if wait:
        (tmp_path / "hold").unlink()  # the evaluator finishes while the launcher waits for it
    sim.finish(wait=True)  # a completed run
    status = simrecords.read_records(root)[2]["status"]
    assert status == ("done" if wait else "abandoned")
    assert proc.returncode == (0 if wait else -signal.SIGKILL)


def test_preflight_counts_the_checkpoint_under_evaluation_and_the_best_by_sim(tmp_path, monkeypatch):
    cfg = _cfg("checkpoint.keep=2", "eval.sim=libero", "eval.best_by=sim", "checkpoint.validate=false")
    one = estimate_bytes(cfg, model_size(cfg), 1)
    monkeypatch.setattr("provision.nodeinfo.free_bytes", lambda path: int(one * 4.5))  # 4 fit, not 5
    want = r"3 checkpoints and the best one by success rate and the one under simulator evaluation \(5\)"
    with pytest.raises(PreflightError, match=want):
        space_check(tmp_path, cfg, 1)


def test_a_resumed_run_evaluates_again_what_was_abandoned_not_what_finished(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    for step in (2, 4, 6):
        _checkpoint(root, step)
    simrecords.write_record(root, {"step": 2, "status": "done", "success_rate": 0.5})
    simrecords.write_record(root, {"step": 4, "status": "abandoned", "reason": "a stop signal"})
    settings = simeval.evaluator_settings(_watcher(tmp_path).ev)  # bad input, with the settings of now
    simrecords.write_record(root, {"step": 6, "status": "failed", "settings": settings})
    sim = _watcher(tmp_path)
    _drive(sim)
    records = simrecords.read_records(root)
    assert {s: r["status"] for s, r in records.items()} == {2: "done", 4: "done", 6: "failed"}
    assert records[2]["success_rate"] == 0.5 and "finished" not in records[2]  # untouched


def test_an_evaluation_with_errored_episodes_is_retried_and_bad_input_is_not(tmp_path):
    """bin/evaluate exit 1 (episodes errored, or the simulator env did not build: its re-run continues) is
    abandoned, so the next attempt evaluates that checkpoint again; exit 2 (bad input) is final."""
    root = tmp_path / "run" / "checkpoints"
    sim = _watcher(tmp_path)
    _checkpoint(root, 2)
    (tmp_path / "exit-with").write_text("1")
    _drive(sim)
    _checkpoint(root, 4)
    (tmp_path / "exit-with").write_text("2")
    _drive(sim)
    records = simrecords.read_records(root)
    assert {s: r["status"] for s, r in records.items()} == {2: "abandoned", 4: "failed"}
    assert "exited 1" in records[2]["reason"] and "evaluates it again" in records[2]["reason"]
    (tmp_path / "exit-with").unlink()
    _drive(_watcher(tmp_path))  # the next attempt
    records = simrecords.read_records(root)
    assert {s: r["status"] for s, r in records.items()} == {2: "done", 4: "failed"}


def test_a_failed_evaluation_is_evaluated_again_once_its_settings_changed(tmp_path):
    """Issue 56 item 5: bin/evaluate's exit 2 is final for the settings it failed with, which the record
    keeps; a resume with other eval.sim_* values (the user's fix) evaluates that checkpoint again, and a
    record from before the settings were kept counts as changed."""
    root = tmp_path / "run" / "checkpoints"
    _checkpoint(root, 2)
    _checkpoint(root, 4)
    (tmp_path / "exit-with").write_text("2")
    _drive(_watcher(tmp_path))
    records = simrecords.read_records(root)
    assert {s: r["status"] for s, r in records.items()} == {2: "failed", 4: "failed"}
    assert records[2]["settings"]["eval.sim_tasks"] == "0"
    simrecords.write_record(root, {**records[4], "settings": None})  # as written before settings were kept
    (tmp_path / "exit-with").unlink()
    _drive(_watcher(tmp_path))  # the same settings: step 2 stays failed; step 4's are unknown: again
    records = simrecords.read_records(root)
    assert {s: r["status"] for s, r in records.items()} == {2: "failed", 4: "done"}
    _drive(_watcher(tmp_path, "eval.sim_tasks=1"))  # the user changed the value it failed with
    records = simrecords.read_records(root)
    assert {s: r["status"] for s, r in records.items()} == {2: "done", 4: "done"}
    assert records[2]["settings"]["eval.sim_tasks"] == "1"


@pytest.mark.parametrize("after", ["success_rates", "pinned_steps"])
def test_a_checkpoint_scored_best_while_rank_0_prunes_is_kept(tmp_path, monkeypatch, after):
    """Issue 56 item 4: the launcher records an evaluation, then unpins (simeval.py _record), right between
    rank 0's two reads (BestPin: the records, then the pins; or the other way round). Read records then pins,
    step 2 was neither scored nor pinned: pruned right after it became best (`best` dangled). The
    launcher's two writes are made at that moment by a hook on the read (deterministic, no sleep)."""
    root = tmp_path / "run" / "checkpoints"
    for step in (2, 4, 6, 8):
        _checkpoint(root, step)
    simrecords.write_record(root, {"step": 4, "status": "done", "success_rate": 0.5})
    simrecords.pin(root, 2)  # under evaluation
    real, fired = getattr(simrecords, after), []

    def then_the_launcher_records(*args):
        found = real(*args)
        if not fired:
            fired.append(after)
            simrecords.write_record(root, {"step": 2, "status": "done", "success_rate": 0.9})
            simrecords.unpin(root, 2)
        return found

    monkeypatch.setattr(simrecords, after, then_the_launcher_records)
    prune(root, keep=1, keep_step=8, pin=BestPin(root, "sim"))
    assert fired and 2 in [c.step for c in scan(root)[0]]
    prune(root, keep=1, keep_step=8, pin=BestPin(root, "sim"))  # the next save
    assert [c.step for c in scan(root)[0]] == [2, 8] and os.readlink(root / "best") == "checkpoint_step_2"


def _removal_hooks(monkeypatch, when: str, launcher_polls):
    """Runs launcher_polls() once, at `when` in rank 0's prune; returns the pin callable for prune()."""
    import trainer.checkpoint.layout as layout

    if when == "after the pins are read":
        return lambda complete, best=BestPin: (best(complete.__getitem__(0).path.parent, "sim")(complete),
                                               launcher_polls())[0]  # fmt: skip
    if when == "after the removal is marked":  # the pins' second read: the re-check inside the removal
        real, calls = simrecords.pinned_steps, []

        def second_read_late(root):
            calls.append(root)
            if len(calls) == 2:
                launcher_polls()
            return real(root)

        monkeypatch.setattr(simrecords, "pinned_steps", second_read_late)
    else:  # right before the removal
        remove = layout._remove
        monkeypatch.setattr(layout, "_remove", lambda path: (launcher_polls(), remove(path))[1])
    return None


@pytest.mark.parametrize(
    "when", ["after the pins are read", "after the removal is marked", "right before the removal"]
)
def test_an_evaluation_never_starts_on_a_checkpoint_being_pruned(tmp_path, monkeypatch, when):
    """Issue 56 item 4, the other window: the launcher pins and starts an evaluation between rank 0's read
    of the pins and its removal of that checkpoint; the evaluator then found it gone and it was recorded
    abandoned ("removed while evaluated"). Now the removal re-reads the pins after marking itself, and the
    launcher waits while a removal is marked: the checkpoint is evaluated (kept), or skipped (pruned before
    its turn), never removed under its evaluator. The launcher's poll is made at `when` by a hook."""
    root = tmp_path / "run" / "checkpoints"
    sim = _watcher(tmp_path)
    (tmp_path / "hold").touch()  # the evaluator waits inside its evaluation until the prune is over
    for step in (2, 4, 6):
        _checkpoint(root, step)
    fired = []

    def launcher_polls():
        if not fired:
            fired.append(when)
            sim.poll()

    best = _removal_hooks(monkeypatch, when, launcher_polls) or BestPin(root, "sim")
    prune(root, keep=1, keep_step=6, pin=best)
    assert fired
    (tmp_path / "hold").unlink()
    _drive(sim)
    records = simrecords.read_records(root)
    assert records[2]["status"] in ("done", "skipped"), records[2]
    assert (records[2]["status"] == "done") == (root / "checkpoint_step_2").is_dir()
    assert not simrecords.pinned_steps(root) and not list(root.glob(".removing-*"))


def test_a_pin_whose_launcher_is_gone_is_released(tmp_path):
    """Issue 56 item 9: a launcher SIGKILLed while it evaluated step 2 left its pin; with eval.sim=none on
    the resume nothing unpinned it and step 2 was never pruned. A pin names its holder (ownership.py's
    record): on this host a pid that is not running (or another process now), elsewhere a heartbeat (the
    pin's mtime, touched by the launcher) stopped for LINGBOT_OWNER_STALE_S (or Slurm says its job ended),
    is released by the next prune; a live holder's pin, here or on another host, holds."""
    import dataclasses
    import subprocess
    import sys

    from trainer.launcher.ownership import OwnerRecord

    root = tmp_path / "run" / "checkpoints"
    for step in (2, 4, 6, 8, 10):
        _checkpoint(root, step)
    killed = "import os, signal, sys; from trainer.checkpoint import simrecords; " \
        "simrecords.pin(sys.argv[1], 2); os.kill(os.getpid(), signal.SIGKILL)"  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", killed, str(root)], cwd=Path(simeval.__file__).parents[2])
    assert proc.returncode == -signal.SIGKILL and simrecords.pin_path(root, 2).is_file()
    elsewhere = OwnerRecord("another-node", 4242, "boot", None, time.time())
    for step, age in ((4, 3600.0), (6, 0.0)):  # its launcher's heartbeat: an hour ago, just now
        path = simrecords.pin_path(root, step)
        path.write_text(json.dumps(dataclasses.asdict(elsewhere)))
        os.utime(path, (time.time() - age, time.time() - age))
    simrecords.pin(root, 8)  # this process: alive
    prune(root, keep=1, keep_step=10, pin=BestPin(root, "sim"))
    assert [c.step for c in scan(root)[0]] == [6, 8, 10]
    assert simrecords.pinned_steps(root) == {6, 8}
    assert not simrecords.pin_path(root, 2).exists() and not simrecords.pin_path(root, 4).exists()
