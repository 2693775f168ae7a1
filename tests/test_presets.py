"""The `libero` and `robotwin` presets (trainer/config/presets/): each loads at both scales and passes the
rules; the values they take from upstream LingBot-VA equal upstream's (hard-coded below, with the file and
field they come from); the CPU scale keeps the benchmark's geometry; and (heavy) `bin/train PRESET 1` runs a
tiny CPU-scale run to completion on a LeRobot dataset in that benchmark's layout written by lerobot itself
(tests/support/presets_data.py, shared with the serving tests)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.support import runs
from tests.support.lerobot_write import libero_row, robotwin_row
from tests.support.presets_data import LAYOUTS, STEPS, trained, written_actions
from trainer.config import config_from_dict, load_config
from trainer.config.rules import violations

PRESETS = ("libero", "robotwin")
VAE_SPATIAL = 16  # the Wan2.2 VAE's spatial factor: pixels per latent cell

# Upstream LingBot-VA at 58c2ae5 (github.com/robbyant/lingbot-va; public config values), per preset:
# {dotted RunConfig key: (upstream value, "file field")}.
UPSTREAM = {
    "libero": {
        "model.action_dim": (30, "va_libero_cfg.py action_dim"),
        "model.action_used": (len(range(0, 7)), "va_libero_cfg.py len(used_action_channel_ids)"),
        "model.patch_t": (1, "shared_config.py patch_size[0]"),
        "model.patch": (2, "shared_config.py patch_size[1:]"),
        "model.latent_size": (128 // VAE_SPATIAL, "va_libero_cfg.py height 128 / 16"),
        "model.latent_width": (0, "va_libero_cfg.py width 128 = height: square (0)"),
        "data.cameras": (
            ["observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb"],
            "va_libero_cfg.py obs_cam_keys",
        ),
        "data.layout": ("side_by_side", "va_libero_cfg.py env_type 'none'"),
        "data.action_slots": (list(range(0, 7)), "va_libero_cfg.py used_action_channel_ids"),
        "data.relative_poses": ([], "lerobot_latent_dataset.py: get_relative_pose only for robotwin_tshape"),
        "data.actions_per_frame": (4, "va_libero_cfg.py action_per_frame"),
        "data.actions_per_video_frame": (1, "lerobot_latent_dataset.py frame_stride (LIBERO: 1)"),
        "recipe.video_shift": (5.0, "va_libero_cfg.py snr_shift"),
        "recipe.action_shift": (0.05, "va_libero_cfg.py action_snr_shift"),
        "recipe.text_dropout": (0.1, "va_libero_train_cfg.py cfg_prob"),
        "infer.frames_per_chunk": (4, "va_libero_cfg.py frame_chunk_size"),
        "infer.window": (30, "va_libero_cfg.py attn_window"),
        "infer.video_steps": (20, "va_libero_cfg.py num_inference_steps"),
        "infer.action_steps": (50, "va_libero_cfg.py action_num_inference_steps"),
        "infer.video_shift": (5.0, "va_libero_cfg.py snr_shift"),
        "infer.action_shift": (0.05, "va_libero_cfg.py action_snr_shift"),
        "infer.guidance": (5.0, "va_libero_cfg.py guidance_scale"),
        "infer.action_guidance": (1.0, "va_libero_cfg.py action_guidance_scale"),
        "infer.video_exec_step": (-1, "va_libero_cfg.py video_exec_step"),
        "train.lr": (1e-5, "va_libero_train_cfg.py learning_rate"),
        "train.betas": ([0.9, 0.95], "va_libero_train_cfg.py beta1, beta2"),
        "train.weight_decay": (0.1, "va_libero_train_cfg.py weight_decay"),
        "train.warmup_steps": (10, "va_libero_train_cfg.py warmup_steps"),
        "train.batch_size": (1, "va_libero_train_cfg.py batch_size"),
        "train.grad_accum": (10, "va_libero_train_cfg.py gradient_accumulation_steps"),
        "train.steps": (5000, "va_libero_train_cfg.py num_steps"),
        "train.grad_clip": (2.0, "train.py clip_grad_norm_(..., 2.0)"),
        "checkpoint.every": (200, "va_libero_train_cfg.py save_interval"),
    },
    "robotwin": {
        "model.action_dim": (30, "va_robotwin_cfg.py action_dim"),
        "model.action_used": (16, "va_robotwin_cfg.py len(used_action_channel_ids)"),
        "model.patch_t": (1, "shared_config.py patch_size[0]"),
        "model.patch": (2, "shared_config.py patch_size[1:]"),
        "model.latent_size": (256 // VAE_SPATIAL, "va_robotwin_cfg.py height 256 / 16"),
        "model.latent_width": (320 // VAE_SPATIAL, "va_robotwin_cfg.py width 320 / 16"),
        "data.cameras": (
            [
                "observation.images.cam_high",
                "observation.images.cam_left_wrist",
                "observation.images.cam_right_wrist",
            ],
            "va_robotwin_cfg.py obs_cam_keys",
        ),  # fmt: skip
        "data.layout": ("tshape", "va_robotwin_cfg.py env_type 'robotwin_tshape'"),
        "data.action_slots": (
            list(range(0, 7)) + list(range(28, 29)) + list(range(7, 14)) + list(range(29, 30)),
            "va_robotwin_cfg.py used_action_channel_ids",
        ),
        "data.relative_poses": (
            [0, 8],
            "lerobot_latent_dataset.py get_relative_pose(action[:, :7]), [:, 8:15]",
        ),
        "data.actions_per_frame": (16, "va_robotwin_cfg.py action_per_frame"),
        "data.actions_per_video_frame": (4, "lerobot_latent_dataset.py frame_stride (RoboTwin: 4)"),
        "recipe.video_shift": (5.0, "va_robotwin_cfg.py snr_shift"),
        "recipe.action_shift": (1.0, "va_robotwin_cfg.py action_snr_shift"),
        "recipe.text_dropout": (0.1, "va_robotwin_train_cfg.py cfg_prob"),
        "infer.frames_per_chunk": (2, "va_robotwin_cfg.py frame_chunk_size"),
        "infer.window": (72, "va_robotwin_cfg.py attn_window"),
        "infer.video_steps": (25, "va_robotwin_cfg.py num_inference_steps"),
        "infer.action_steps": (50, "va_robotwin_cfg.py action_num_inference_steps"),
        "infer.video_shift": (5.0, "va_robotwin_cfg.py snr_shift"),
        "infer.action_shift": (1.0, "va_robotwin_cfg.py action_snr_shift"),
        "infer.guidance": (5.0, "va_robotwin_cfg.py guidance_scale"),
        "infer.action_guidance": (1.0, "va_robotwin_cfg.py action_guidance_scale"),
        "infer.video_exec_step": (-1, "va_robotwin_cfg.py video_exec_step"),
        "train.lr": (1e-5, "va_robotwin_train_cfg.py learning_rate"),
        "train.betas": ([0.9, 0.95], "va_robotwin_train_cfg.py beta1, beta2"),
        "train.weight_decay": (0.1, "va_robotwin_train_cfg.py weight_decay"),
        "train.warmup_steps": (10, "va_robotwin_train_cfg.py warmup_steps"),
        "train.batch_size": (1, "va_robotwin_train_cfg.py batch_size"),
        "train.grad_accum": (1, "va_robotwin_train_cfg.py gradient_accumulation_steps"),
        "train.steps": (50000, "va_robotwin_train_cfg.py num_steps"),
        "train.grad_clip": (2.0, "train.py clip_grad_norm_(..., 2.0)"),
        "checkpoint.every": (1000, "va_robotwin_train_cfg.py save_interval"),
    },
}
# What the CPU scale keeps of the benchmark (the data's and the served actions' geometry), besides the
# sampling settings: everything under data.* here, infer.*, recipe.* (only sizes and the run length shrink)
KEPT_AT_CPU_SCALE = (
    "data.cameras", "data.layout", "data.action_map", "data.action_slots", "data.relative_poses",
    "data.actions_per_frame", "data.actions_per_video_frame", "data.format", "data.normalize",
    "model.action_dim", "model.action_used", "model.patch", "recipe.video_shift", "recipe.action_shift",
    "infer.frames_per_chunk", "infer.window", "infer.action_shift",
)  # fmt: skip


def _value(cfg, key: str):
    target = cfg
    for part in key.split("."):
        target = getattr(target, part)
    return target


@pytest.mark.fast
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("cpu_scale", [False, True])
def test_preset_loads_and_passes_the_rules(preset, cpu_scale):
    cfg = load_config(preset, cpu_scale=cpu_scale)
    assert cfg.name == preset and cfg.data.dataset == preset
    assert violations(cfg) == []
    assert cfg.data.format == "lerobot" and cfg.data.generate_if_missing is False
    assert cfg.data.normalize == "fit" and cfg.data.action_map == ["action"]
    # a --set on top still goes through the same rules
    assert load_config(preset, cpu_scale=cpu_scale, overrides={"data.path": "/elsewhere"}).data.path == (
        "/elsewhere"
    )


@pytest.mark.fast
@pytest.mark.parametrize("preset", PRESETS)
def test_upstream_values_are_upstreams(preset):
    cfg = load_config(preset, cpu_scale=False)
    wrong = {
        key: (_value(cfg, key), value, source)
        for key, (value, source) in UPSTREAM[preset].items()
        if not (
            _value(cfg, key) == value
            if not isinstance(value, float)
            else math.isclose(_value(cfg, key), value, rel_tol=1e-12)
        )
    }
    assert wrong == {}, "preset value != upstream's (key: (ours, upstream's, where)): " + json.dumps(wrong)
    assert cfg.model.pretrained == "models/lingbot-va-base" and cfg.data.path == f"data/{preset}"


@pytest.mark.fast
@pytest.mark.parametrize("preset", PRESETS)
def test_cpu_scale_keeps_the_benchmark_geometry(preset):
    full, cpu = load_config(preset, cpu_scale=False), load_config(preset, cpu_scale=True)
    assert {k: _value(cpu, k) for k in KEPT_AT_CPU_SCALE} == {k: _value(full, k) for k in KEPT_AT_CPU_SCALE}
    assert cpu.model.pretrained == "" and cpu.model.dim < full.model.dim
    assert cpu.train.steps < full.train.steps and cpu.data.path == f"data/{preset}_cpu"
    # the encoder's temporal factor (N / actions per video frame) is the Wan2.2 VAE's 4 at both scales
    for cfg in (full, cpu):
        assert cfg.data.actions_per_frame // cfg.data.actions_per_video_frame == 4
    # the per-view aspect of the full scale (LIBERO square; RoboTwin 16 x 20 -> 8 x 10)
    aspect = (full.model.latent_width or full.model.latent_size) / full.model.latent_size
    assert (cpu.model.latent_width or cpu.model.latent_size) / cpu.model.latent_size == aspect
    # one CPU-scale clip fits an episode of the test datasets (tests/support/presets_data.py LAYOUTS)
    per_video, t = cpu.data.actions_per_video_frame, 4
    rows = (1 + t * (cpu.data.frames - 1)) * per_video + (1 if per_video > 1 else 0)
    assert LAYOUTS[preset].length >= rows


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
    assert summary["data"]["cameras"] == UPSTREAM[preset]["data.cameras"][0]
    losses = runs.losses_by_step(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert all(math.isfinite(x) for pair in losses.values() for x in pair)
    held = summary["validation"]
    assert held["step"] == STEPS and held["episodes"] >= 1
    assert math.isfinite(held["latent_loss"]) and math.isfinite(held["action_loss"])
    assert runs.complete_steps(run_dir)[-1] == STEPS and (run_dir / "checkpoints" / "best").exists()
    actions = written_actions(data_dir)
    assert actions["action__0"].shape[1] == len(UPSTREAM[preset]["data.action_slots"][0])
    # the ranks ran the preset's CPU scale: its geometry as loaded here (one attempt's config.json)
    (attempt,) = sorted((run_dir / "attempts").glob("*/config.json"))
    ran = config_from_dict(json.loads(attempt.read_text()), str(attempt))
    cpu = load_config(preset, cpu_scale=True)
    assert {k: _value(ran, k) for k in KEPT_AT_CPU_SCALE} == {k: _value(cpu, k) for k in KEPT_AT_CPU_SCALE}
    assert (ran.model.latent_size, ran.model.latent_width) == (cpu.model.latent_size, cpu.model.latent_width)
