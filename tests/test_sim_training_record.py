"""The CPU scale's recorded LIBERO dataset (trainer/data/formats/libero_record.py), without the simulator:
the recorder's loop (a failed expert episode or a diverging replay is not written, the next seed is tried,
each counted; a task that never succeeds is one line), with the simulator's side faked; when ensure_dataset
records (libero CPU scale, no dataset) and when it refuses; the preflight's note; a recording renamed into
place only when complete (a fake simulator python). The recording for real, and a recorded demo replayed
through bin/serve's path: tests/test_sim_training.py (heavy)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

pytestmark = pytest.mark.fast


class _Suite:
    name = "libero_goal"

    def get_task(self, task):
        return types.SimpleNamespace(language=f"task {task}")


def _fake_sim(monkeypatch, outcome):
    """trainer.sim.demos.play/replay faked: outcome(task, seed, kind) -> (success, same states)."""
    from trainer.sim import demos

    played = []

    def run(kind):
        def go(suite, task, seed, *args, cameras):
            success, same = outcome(task, seed, kind)
            played.append((kind, task, seed, cameras))
            states = [np.full(8, seed if same else -1, np.float32)] * 3
            return demos.Demo(
                task, seed, f"task {task}", [np.full(7, seed, np.float32)] * 3, states, {}, success
            )

        return go

    monkeypatch.setattr(demos, "play", run("play"))
    monkeypatch.setattr(demos, "replay", run("replay"))
    experts = types.ModuleType("trainer.sim.experts")
    experts.expert_for = lambda suite, task: type("Drawer", (), {})()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trainer.sim.experts", experts)
    return played


def test_failed_and_diverged_demos_are_not_written_and_the_next_seed_is_tried(monkeypatch):
    from trainer.data.formats.libero_record import record_demos

    # task 0: seed 1 fails (the expert); task 8: seed 0's replay diverges (other states)
    def outcome(task, seed, kind):
        return (task, seed) != (0, 1) or kind != "play", (task, seed, kind) != (8, 0, "replay")

    played = _fake_sim(monkeypatch, outcome)
    said: list[str] = []
    demos, took = record_demos(_Suite(), [0, 8], 4, 50, "replay", said.append)
    assert [(d.task, d.seed, d.expert) for d in demos] == [(0, 0, "Drawer"), (8, 1, "Drawer"),
                                                           (0, 2, "Drawer"), (8, 2, "Drawer")]  # fmt: skip
    assert (took["failed"], took["diverged"]) == (1, 1)
    assert ("play", 0, 1, False) in played and ("replay", 0, 1, False) not in played  # no replay of a failure
    assert all(cameras == (kind == "replay") for kind, _, _, cameras in played)  # rendered only on replay
    assert any("task 0 seed 1: the expert did not succeed in 50 steps" in line for line in said)
    assert any("task 8 seed 0: its replay diverged" in line for line in said)


def test_a_task_without_a_replayable_success_is_one_line(monkeypatch):
    from trainer.data.formats.libero_record import MAX_TRIES, RecordError, record_demos

    _fake_sim(monkeypatch, lambda task, seed, kind: (task != 1, True))
    with pytest.raises(RecordError, match=f"task 1 of libero_goal: {MAX_TRIES} seeds in a row"):
        record_demos(_Suite(), [0, 1], 2, 50, "play", lambda line: None)


# ---- the caller's side: when the CPU scale records, the preflight's note, a recording put into place whole


def _cpu_cfg(root, **sets):
    from trainer.config import load_config

    return load_config("libero", cpu_scale=True, overrides={"data.path": str(root), **sets})


def test_the_cpu_scale_records_when_it_has_no_dataset_and_the_full_scale_never(tmp_path):
    from trainer.config import load_config
    from trainer.data.formats.sources import missing_episodes, records_libero

    cfg = _cpu_cfg(tmp_path / "absent")
    assert records_libero(cfg) and missing_episodes(cfg, tmp_path / "absent") is None
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / ".lock").write_text("")
    assert missing_episodes(_cpu_cfg(tmp_path / "hidden"), tmp_path / "hidden") is None
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("x")
    assert "holds no LeRobot dataset" in missing_episodes(_cpu_cfg(tmp_path / "junk"), tmp_path / "junk")
    full = load_config("libero", cpu_scale=False, overrides={"data.path": str(tmp_path / "absent")})
    assert not records_libero(full) and "no LeRobot episodes" in missing_episodes(full, tmp_path / "absent")
    off = _cpu_cfg(tmp_path / "absent", **{"data.generate_if_missing": False})
    assert not records_libero(off) and missing_episodes(off, tmp_path / "absent")


def test_ensure_dataset_records_once_under_the_lock_and_the_preflight_says_so(tmp_path, monkeypatch):
    from trainer.data.formats import libero_record, sources
    from trainer.data.formats.discovery import Discovery
    from trainer.launcher.inputs import inputs_check

    root = tmp_path / "libero_cpu"
    cfg = _cpu_cfg(root, **{"data.generated_episodes": 3, "data.generated_length": 20})
    (note,) = [n for n in inputs_check(cfg) if n.startswith("data:")]
    assert "record 3 scripted demonstration(s) of at most 20 steps" in note and "tasks with experts" in note
    calls = []

    def record(where, episodes, length, suite, say, tasks):
        assert (where.parent / f".{where.name}.lock").exists()  # dataset_lock held
        calls.append((where, episodes, length, suite, tasks))
        say(libero_record.ANNOUNCE)
        (where / "meta").mkdir(parents=True)
        return where

    monkeypatch.setattr(libero_record, "record_dataset", record)
    monkeypatch.setattr(sources, "discover_source", lambda c, r=None: Discovery(
        root, "v2.1", [root / "meta"] if (root / "meta").exists() else []))  # fmt: skip
    said = []
    assert sources.ensure_dataset(cfg, said.append) == [root / "meta"]
    assert sources.ensure_dataset(cfg, said.append) == [root / "meta"]  # the second finds it
    assert calls == [(root, 3, 20, "libero_goal", "")] and said == [libero_record.ANNOUNCE]


def _fake_sim_python(tmp_path, body: str):
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nout=$3\n{body}\n")  # argv: -m trainer.data.formats.libero_record OUT ...
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("existing", ["missing", "empty", "hidden only"])
def test_a_complete_recording_is_renamed_into_place(tmp_path, monkeypatch, existing):
    from trainer.data.formats import libero_record
    from trainer.sim import env

    body = 'mkdir -p "$out/meta" "$out/data" && echo "{}" > "$out/meta/info.json"'
    python = _fake_sim_python(tmp_path, body)
    monkeypatch.setattr(env, "ensure_env", lambda name, say: python)
    monkeypatch.setattr(env, "choose_gl", lambda python, say: "egl")
    root = tmp_path / "data" / "libero_cpu"
    if existing != "missing":
        root.mkdir(parents=True)
    if existing == "hidden only":
        (root / ".keep").write_text("")
    said = []
    assert libero_record.record_dataset(root, 2, 8, "libero_goal", said.append) == root
    assert (root / "meta" / "info.json").is_file() and (root / "data").is_dir()
    assert said[:3] == ["!" * 100, libero_record.ANNOUNCE, "!" * 100]
    assert "recorded 2 scripted demonstration(s)" in said[-1]
    assert [p.name for p in root.parent.iterdir()] == ["libero_cpu"]  # no temporary left


def test_a_failed_or_killed_recording_never_looks_like_a_dataset(tmp_path, monkeypatch):
    from trainer.data.formats import libero_record
    from trainer.sim import env

    root = tmp_path / "data" / "libero_cpu"
    stale = tmp_path / "data" / ".libero_cpu.recording-1"  # a killed recording's leftovers
    (stale / "dataset" / "meta").mkdir(parents=True)
    body = 'mkdir -p "$out/meta" "$out/data"; echo "no GL: install libegl1" >&2; exit 3'  # half written
    python = _fake_sim_python(tmp_path, body)
    monkeypatch.setattr(env, "ensure_env", lambda name, say: python)
    monkeypatch.setattr(env, "choose_gl", lambda python, say: "egl")
    with pytest.raises(libero_record.RecordError, match=r"failed \(exit 3"):
        libero_record.record_dataset(root, 2, 8, "libero_goal", lambda line: None)
    assert not root.exists() and list((tmp_path / "data").iterdir()) == []

    def no_gl(python, say):
        raise env.SimEnvError("no GL backend here; install libegl1 libgl1-mesa-dri (or libosmesa6)")

    monkeypatch.setattr(env, "choose_gl", no_gl)
    with pytest.raises(libero_record.RecordError, match="cannot record a LIBERO dataset: no GL.*libegl1"):
        libero_record.record_dataset(root, 2, 8, "libero_goal", lambda line: None)
