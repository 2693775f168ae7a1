"""The CPU scale's recorded LIBERO dataset (trainer/data/formats/libero_record.py), without the simulator:
the scripted motion's arithmetic; when ensure_dataset records (libero CPU scale, no dataset) and when it
refuses; the preflight's note; a recording renamed into place only when complete (a fake simulator python).
The recording for real: tests/test_sim_training_recorded.py (heavy)."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data.formats.libero_record import OUTPUT_MAX, phase_of, scripted_action

pytestmark = pytest.mark.fast


def test_phases_reach_then_descend_grasp_and_lift_in_order():
    phases = [phase_of(t, 40) for t in range(40)]
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert order == ["approach", "descend", "grasp", "lift"]
    assert phases.count("approach") == 18 and phases[-1] == "lift"


def test_actions_head_for_the_object_and_close_the_gripper():
    eef, obj = np.array([0.0, 0.0, 1.2]), np.array([0.01, -0.2, 0.9])
    approach = scripted_action(eef, obj, "approach")
    assert approach.shape == (7,) and approach.dtype == np.float32
    assert approach[0] == pytest.approx(0.01 / OUTPUT_MAX) and approach[1] == -1.0  # clipped to [-1, 1]
    assert approach[2] == -1.0 and approach[6] == -1.0 and not approach[3:6].any()  # open, no rotation
    above = np.array([0.01, -0.2, 0.92])
    assert np.allclose(scripted_action(above, obj, "descend")[:3], 0.0)  # 2 cm above: there
    assert list(scripted_action(above, obj, "grasp")) == [0, 0, 0, 0, 0, 0, 1.0]
    assert list(scripted_action(above, obj, "lift")) == [0, 0, 1.0, 0, 0, 0, 1.0]


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
    assert "record 3 scripted episode(s) of 20 steps" in note and "not demonstrations" in note
    calls = []

    def record(where, episodes, length, suite, say):
        assert (where.parent / f".{where.name}.lock").exists()  # dataset_lock held
        calls.append((where, episodes, length, suite))
        say(libero_record.ANNOUNCE)
        (where / "meta").mkdir(parents=True)
        return where

    monkeypatch.setattr(libero_record, "record_dataset", record)
    monkeypatch.setattr(sources, "discover_source", lambda c, r=None: Discovery(
        root, "v2.1", [root / "meta"] if (root / "meta").exists() else []))  # fmt: skip
    said = []
    assert sources.ensure_dataset(cfg, said.append) == [root / "meta"]
    assert sources.ensure_dataset(cfg, said.append) == [root / "meta"]  # the second finds it
    assert calls == [(root, 3, 20, "libero_goal")] and said == [libero_record.ANNOUNCE]


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
    assert "recorded 2 scripted episode(s)" in said[-1]
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
