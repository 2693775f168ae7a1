"""The `libero` and `robotwin` presets (trainer/config/presets/): each loads at both scales and passes the
rules; they equal upstream LingBot-VA's values as read from upstream's own files at commit 58c2ae5
(tests/fixtures/upstream_presets_58c2ae5.json: each value with its file and line, made by
tests/support/upstream_presets.py), except the deliberate differences the fixture lists with their reasons;
the clip lengths the YAML states are the project's own rule's (trainer/data/short.py clip_frames); the CPU
scale keeps the benchmark's geometry; and (heavy) `bin/train PRESET 1` runs a tiny CPU-scale run to
completion on a LeRobot dataset in that benchmark's layout written by lerobot itself
(tests/support/presets_data.py, shared with the serving tests)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from tests.support import runs
from tests.support.lerobot_write import libero_row, robotwin_row
from tests.support.presets_data import LAYOUTS, STEPS, trained, written_actions
from trainer.config import CONFIG_DIR, config_from_dict, load_config
from trainer.config.rules import violations
from trainer.data.short import clip_frames

PRESETS = ("libero", "robotwin")
FIXTURE = Path(__file__).parent / "fixtures" / "upstream_presets_58c2ae5.json"
UPSTREAM = json.loads(FIXTURE.read_text())
TEMPORAL = UPSTREAM["source"]["vae_factors"]["temporal"]  # the Wan2.2 VAE's 4 video frames per latent frame
# What the CPU scale keeps of the benchmark (the data's and the served actions' geometry), besides the
# sampling settings: everything under data.* here, infer.*, recipe.* (only sizes and the run length shrink)
KEPT_AT_CPU_SCALE = (
    "data.cameras", "data.layout", "data.action_map", "data.action_slots", "data.relative_poses",
    "data.actions_per_frame", "data.actions_per_video_frame", "data.format",
    "model.action_dim", "model.action_used", "model.patch", "recipe.video_shift", "recipe.action_shift",
    "infer.frames_per_chunk", "infer.window", "infer.action_shift",
)  # fmt: skip


def _value(cfg, key: str):
    target = cfg
    for part in key.split("."):
        target = getattr(target, part)
    return target


def _same(ours, theirs) -> bool:
    if isinstance(theirs, list):
        return isinstance(ours, list) and len(ours) == len(theirs) and all(map(_same, ours, theirs))
    if isinstance(theirs, float) or isinstance(ours, float):
        return math.isclose(float(ours), float(theirs), rel_tol=1e-12, abs_tol=0.0)
    return bool(ours == theirs)


def _differences(cfg, preset: str, scale: str) -> dict:
    fixture = UPSTREAM["presets"][preset]
    excepted = fixture["exceptions"][scale]
    return {
        key: {
            "ours": _value(cfg, key),
            "upstream": entry["value"],
            "where": f"{entry['file']}:{entry['line']}",
        }
        for key, entry in fixture["values"].items()
        if key not in excepted and not _same(_value(cfg, key), entry["value"])
    }


@pytest.mark.fast
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("cpu_scale", [False, True])
def test_preset_loads_and_passes_the_rules(preset, cpu_scale):
    cfg = load_config(preset, cpu_scale=cpu_scale)
    assert cfg.name == preset and cfg.data.dataset == preset
    assert violations(cfg) == []
    assert cfg.data.format == "lerobot"
    # only libero's CPU scale records a stand-in dataset when it has none (data/formats/libero_record.py)
    assert cfg.data.generate_if_missing is (preset == "libero" and cpu_scale)
    assert cfg.data.action_map == ["action"]
    # full scale: upstream's fixed statistics and the released folder's encoders; CPU scale: fitted, stand-ins
    want = ("fit", "patch_mean") if cpu_scale else ("fixed", "wan_vae")
    assert (cfg.data.normalize, cfg.data.encoder) == want
    # a --set on top still goes through the same rules
    assert load_config(preset, cpu_scale=cpu_scale, overrides={"data.path": "/elsewhere"}).data.path == (
        "/elsewhere"
    )


@pytest.mark.fast
def test_the_fixture_names_its_source_for_every_value():
    assert (
        UPSTREAM["source"]["commit"].startswith("58c2ae5")
        and "upstream_presets.py" in (UPSTREAM["source"]["made_by"])
    )
    for preset in PRESETS:
        fixture = UPSTREAM["presets"][preset]
        for key, entry in fixture["values"].items():
            assert entry["file"].startswith("wan_va/") and entry["line"] >= 1 and entry["upstream"], key
        for scale, excepted in fixture["exceptions"].items():
            assert scale in ("full", "cpu_scale") and all(len(why) > 15 for why in excepted.values()), scale


@pytest.mark.fast
@pytest.mark.parametrize("preset", PRESETS)
def test_full_scale_is_upstreams_but_for_the_listed_exceptions(preset):
    cfg = load_config(preset, cpu_scale=False)
    wrong = _differences(cfg, preset, "full")
    assert wrong == {}, "preset value != upstream's, and not a listed exception: " + json.dumps(wrong)
    assert cfg.model.pretrained == "models/lingbot-va-base" and cfg.data.path == f"data/{preset}"
    # the encoders are the released folder's own, as upstream's server loads them (<pretrained>/vae, ...)
    root = (Path(CONFIG_DIR).parents[2] / cfg.model.pretrained).resolve()
    assert (Path(cfg.data.vae_path), Path(cfg.data.text_encoder)) == (root / "vae", root / "text_encoder")


@pytest.mark.fast
@pytest.mark.parametrize("preset", PRESETS)
def test_cpu_scale_is_upstreams_but_for_the_listed_exceptions(preset):
    cpu = load_config(preset, cpu_scale=True)
    wrong = _differences(cpu, preset, "cpu_scale")
    assert wrong == {}, "CPU-scale value != upstream's, and not a listed exception: " + json.dumps(wrong)


@pytest.mark.fast
@pytest.mark.parametrize("preset", PRESETS)
def test_the_clip_lengths_the_yaml_states_are_the_rules(preset):
    """Every `N latent frames ... = R rows` the preset's comments state is clip_frames' (1 + a t (N - 1))."""
    text = " ".join(
        line.split("#", 1)[-1] for line in (CONFIG_DIR / f"{preset}.yaml").read_text().splitlines()
    )
    stated = [(int(n), int(r)) for n, r in re.findall(r"(\d+) latent frames[^#]*?= (\d+) rows", text)]
    per_video = load_config(preset, cpu_scale=False).data.actions_per_video_frame
    assert len(stated) == 2, stated  # the full scale's clip and the CPU scale's
    assert stated == [(n, clip_frames(n, TEMPORAL, per_video)) for n, _ in stated]


@pytest.mark.fast
@pytest.mark.parametrize("preset", PRESETS)
def test_cpu_scale_keeps_the_benchmark_geometry(preset):
    full, cpu = load_config(preset, cpu_scale=False), load_config(preset, cpu_scale=True)
    assert {k: _value(cpu, k) for k in KEPT_AT_CPU_SCALE} == {k: _value(full, k) for k in KEPT_AT_CPU_SCALE}
    assert cpu.model.pretrained == "" and cpu.model.dim < full.model.dim
    assert cpu.train.steps < full.train.steps and cpu.data.path == f"data/{preset}_cpu"
    # the encoder's temporal factor (N / actions per video frame) is the Wan2.2 VAE's 4 at both scales
    for cfg in (full, cpu):
        assert cfg.data.actions_per_frame // cfg.data.actions_per_video_frame == TEMPORAL
    # the per-view aspect of the full scale (LIBERO square; RoboTwin 16 x 20 -> 8 x 10)
    aspect = (full.model.latent_width or full.model.latent_size) / full.model.latent_size
    assert (cpu.model.latent_width or cpu.model.latent_size) / cpu.model.latent_size == aspect
    # one CPU-scale clip fits an episode of the test datasets (tests/support/presets_data.py LAYOUTS),
    # by the rule the data stream applies (trainer/data/short.py), not a restatement of it
    rows = clip_frames(cpu.data.frames, TEMPORAL, cpu.data.actions_per_video_frame)
    assert LAYOUTS[preset].length >= rows == {"libero": 13, "robotwin": 49}[preset]


@pytest.mark.fast
def test_writer_rows_are_each_benchmarks_actions():
    """tests/support/lerobot_write.py's LIBERO rows: 7 delta commands in [-1, 1], the gripper +-1; its
    RoboTwin rows: two absolute poses with unit quaternions xyzw that move smoothly, grippers in [0, 1]."""
    libero = np.stack([libero_row(1, t)[0] for t in range(40)])
    assert libero.shape == (40, 7) and np.abs(libero).max() <= 1 and set(np.unique(libero[:, 6])) <= {-1, 1}
    assert libero_row(0, 0)[1].shape == (8,)
    rows = np.stack([robotwin_row(2, t)[0] for t in range(60)])
    assert rows.shape == (60, 16) and robotwin_row(0, 0)[1].shape == (14,)
    for start in (0, 8):  # data.relative_poses: the 7-wide poses' start columns
        assert np.allclose(np.linalg.norm(rows[:, start + 3 : start + 7], axis=1), 1, atol=1e-6)
        assert np.abs(np.diff(rows[:, start : start + 3], axis=0)).max() < 0.01  # metres per row
    assert ((rows[:, [7, 15]] >= 0) & (rows[:, [7, 15]] <= 1)).all()


@pytest.mark.heavy
@pytest.mark.parametrize("preset", PRESETS)
def test_bin_train_runs_the_preset_on_its_layout(preset, tmp_path_factory, preflight_record):
    """`bin/train PRESET 1 --cpu-scale` on a LeRobot dataset in the benchmark's layout: exit 0 (train_tiny
    raises with the output otherwise), completed, every step's and the held-out losses finite."""
    run_dir, data_dir = trained(tmp_path_factory, preset, preflight_record)
    summary = runs.summary(run_dir)
    assert summary["status"] == "completed" and summary["exit_code"] == 0
    assert summary["data"]["layout"].startswith("LeRobot v2.1")
    layout = LAYOUTS[preset]
    assert summary["data"]["used"] == layout.episodes
    assert summary["data"]["cameras"] == UPSTREAM["presets"][preset]["values"]["data.cameras"]["value"]
    losses = runs.losses_by_step(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert all(math.isfinite(x) for pair in losses.values() for x in pair)
    held = summary["validation"]
    assert held["step"] == STEPS and held["episodes"] >= 1
    assert math.isfinite(held["latent_loss"]) and math.isfinite(held["action_loss"])
    assert runs.complete_steps(run_dir)[-1] == STEPS and (run_dir / "checkpoints" / "best").exists()
    actions = written_actions(data_dir)
    assert actions["action__0"].shape[1] == len(
        UPSTREAM["presets"][preset]["values"]["data.action_slots"]["value"]
    )
    # the ranks ran the preset's CPU scale: its geometry as loaded here (one attempt's config.json)
    (attempt,) = sorted((run_dir / "attempts").glob("*/config.json"))
    ran = config_from_dict(json.loads(attempt.read_text()), str(attempt))
    cpu = load_config(preset, cpu_scale=True)
    assert {k: _value(ran, k) for k in KEPT_AT_CPU_SCALE} == {k: _value(cpu, k) for k in KEPT_AT_CPU_SCALE}
    assert (ran.model.latent_size, ran.model.latent_width) == (cpu.model.latent_size, cpu.model.latent_width)


@pytest.mark.fast
def test_the_learning_preset_is_liberos_at_full_scale_and_records_its_own_demos():
    """libero_learn (base: libero): at full scale every value is the libero preset's (upstream's); at CPU
    scale it keeps LIBERO's geometry, records expert demonstrations of the tasks it evaluates into its own
    folder, and evaluates them in the simulator on LIBERO's official init states during training."""
    full, learn = load_config("libero", cpu_scale=False), load_config("libero_learn", cpu_scale=False)
    assert dataclasses_equal_but_name(full, learn)
    cpu = load_config("libero_learn", cpu_scale=True)
    assert {k: _value(cpu, k) for k in KEPT_AT_CPU_SCALE} == {k: _value(full, k) for k in KEPT_AT_CPU_SCALE}
    assert cpu.data.path == "data/libero_learn" and cpu.data.generate_if_missing
    assert cpu.eval.sim == "libero" and cpu.eval.sim_suite == "libero_goal"
    assert cpu.eval.sim_tasks == cpu.data.generated_tasks  # scored on the tasks it has demonstrations of


def dataclasses_equal_but_name(a, b) -> bool:
    import dataclasses

    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    da.pop("name"), db.pop("name")
    return da == db
