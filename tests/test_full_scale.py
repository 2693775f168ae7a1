"""Full scale never feeds the released transformer stand-in inputs silently (trainer/config/standins.py):
bin/train (and --plan), bin/evaluate and bin/serve refuse it with exit 2 and one line naming the setting to
fix; data.allow_stand_in_encoders=true passes, announced. With upstream's fixed statistics and the real
encoders, bin/serve serves a reference-layout folder with no dataset at all (trainer/sampling/rundata.py
serving_inputs), as upstream's server does: a tiny released-layout folder (transformer/, vae/,
text_encoder/, tokenizer/) served with the libero preset at full scale, data.path pointing nowhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.lingbot_tiny import tiny_cfg
from tests.support.tiny_wan import make_tiny_vae
from trainer.config import load_config
from trainer.launcher import main as launch

pytestmark = pytest.mark.fast
REPO = Path(__file__).resolve().parents[1]
UPSTREAM = json.loads((REPO / "tests/fixtures/upstream_presets_58c2ae5.json").read_text())
LIBERO_CAMS = ("observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb")
FAST_INFER = ["infer.video_steps=1", "infer.action_steps=1"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in list(os.environ):
        if var.startswith(("SLURM_", "LINGBOT_")):
            monkeypatch.delenv(var)
    monkeypatch.setenv("CONDA_ENVS_PATH", str(tmp_path / "envs"))
    monkeypatch.setattr(launch, "gpu_count", lambda: 0)


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """A released-layout folder of a tiny model: transformer/ (dim 48, 4 latent channels, text_dim 16), the
    tiny Wan2.2 VAE (z_dim 4, x16 spatial, x4 temporal), a tiny UMT5 (d_model 16) and its tokenizer."""
    from tests.test_data import make_tiny_t5
    from trainer.model import WorldModel, export_reference

    root = tmp_path_factory.mktemp("w") / "lingbot-va-base"
    cfg = tiny_cfg()
    torch.manual_seed(0)
    assert export_reference(WorldModel(cfg), cfg, root) is not None
    make_tiny_vae(root / "vae")
    make_tiny_t5(root)
    return root


def _encoders(root: Path) -> list[str]:
    return [f"data.vae_path={root / 'vae'}", f"data.text_encoder={root / 'text_encoder'}"]


def test_bin_train_refuses_stand_ins_for_the_released_transformer(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = launch.main(
        ["libero", "1", "--no-cpu-scale", "--run-dir", str(run_dir), "--set", "data.encoder=patch_mean"]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert "data.encoder=patch_mean" in lines[0] and "set data.encoder=wan_vae" in lines[0], lines[0]
    assert "data.allow_stand_in_encoders=true" in lines[0] and not run_dir.exists()


def test_the_override_is_announced_and_goes_on_to_the_preflight(tmp_path, capsys):
    """Past the refusal with data.allow_stand_in_encoders=true: the banner, then the preflight (exit 3 here:
    no dataset); the CPU scale of the same preset is not refused at all (random weights, stand-ins)."""
    sets = [
        "--set",
        "data.encoder=patch_mean",
        "--set",
        "data.text_encoder=",
        "--set",
        "data.allow_stand_in_encoders=true",
    ]
    code = launch.main(["libero", "1", "--no-cpu-scale", "--run-dir", str(tmp_path / "run"), *sets])
    err = capsys.readouterr().err
    assert code == 3, err
    assert (
        "STAND-IN INPUTS FOR THE RELEASED TRANSFORMER" in err and "data.allow_stand_in_encoders=true" in err
    )
    cpu = load_config("libero", cpu_scale=True)
    assert (cpu.data.encoder, cpu.data.text_encoder, cpu.model.pretrained) == ("patch_mean", "", "")


def test_the_plan_refuses_stand_ins_and_names_absent_folders_without_refusing(capsys, monkeypatch):
    from trainer.launcher import plancmd

    code = launch.main(["robotwin", "2", "--plan", "--gpu", "H100", "--set", "data.text_encoder="])
    err = capsys.readouterr().err
    assert code == 2 and 'data.text_encoder="" (hashed words)' in err and "set data.text_encoder=" in err
    cfg = load_config("robotwin", cpu_scale=False, overrides={"model.pretrained": "/nowhere/lingbot"})
    lines = plancmd.absent_inputs(cfg)
    assert [line.split("=")[0] for line in lines] == [
        "plan: model.pretrained",
        "plan: data.vae_path",
        "plan: data.text_encoder",
    ]
    assert all("the plan does not need it" in line for line in lines)


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "module, setting",
    [("trainer.evaluation.cli", "data.encoder=patch_mean"), ("trainer.serving.cli", "data.text_encoder=")],
)
def test_evaluate_and_serve_refuse_a_released_folder_with_stand_ins(released, module, setting):
    done = _cli(module, str(released), "--config", "libero", "--full-scale", "--set", setting, *(
        a for s in _encoders(released) if not s.startswith(setting.split("=")[0]) for a in ("--set", s)
    ))  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert setting.split("=")[0] in lines[0] and "data.allow_stand_in_encoders=true" in lines[0], lines[0]
    assert str(released) in lines[0]  # the fix names the served folder's own encoders


def test_a_released_folder_is_served_with_upstreams_statistics_and_no_dataset(released, tmp_path):
    from trainer.serving.session import Session, load_served

    lines: list[str] = []
    sets = [*_encoders(released), f"data.path={tmp_path / 'no-dataset'}", *FAST_INFER]
    served = load_served(str(released), "libero", False, sets, "cpu", 0, lines.append)
    assert not (tmp_path / "no-dataset").exists()
    assert any("no dataset read" in line for line in lines), lines
    upstream = UPSTREAM["presets"]["libero"]["values"]
    np.testing.assert_array_equal(served.normalizer.q01, np.float32(upstream["data.norm_q01"]["value"][:7]))
    np.testing.assert_array_equal(served.normalizer.q99, np.float32(upstream["data.norm_q99"]["value"][:7]))
    assert served.latent_stats is None and served.stand_ins == ()
    assert served.grid == (4, 8, 16)  # the tiny VAE's 4 channels, two 8 x 8 views side by side
    session = Session(served)
    session.reset("pick up the black bowl")
    rng = np.random.default_rng(0)
    frame = {cam: rng.integers(0, 255, (128, 128, 3), dtype=np.uint8) for cam in LIBERO_CAMS}
    actions = session.observe(frame)
    assert actions.shape == (7, 4, 4) and np.isfinite(actions).all()
    keys = [
        {cam: rng.integers(0, 255, (128, 128, 3), dtype=np.uint8) for cam in LIBERO_CAMS} for _ in range(12)
    ]
    session.executed(keys, actions)  # the executed chunk as history: 4 key frames x 3 latent frames
    assert np.isfinite(session.observe(frame)).all()


def test_the_override_serves_announced_stand_in_text(released, tmp_path):
    from trainer.serving.session import load_served

    lines: list[str] = []
    sets = [f"data.vae_path={released / 'vae'}", "data.text_encoder=", "data.allow_stand_in_encoders=true"]
    served = load_served(
        str(released), "libero", False, [*sets, f"data.path={tmp_path}", *FAST_INFER], "cpu", 0, lines.append
    )
    assert any("STAND-IN INPUTS FOR THE RELEASED TRANSFORMER" in line for line in lines), lines
    assert served.stand_ins  # and bin/serve repeats each one on its terminal


@pytest.fixture
def released_dims(tmp_path) -> Path:
    """A folder with the released transformer's config.json (24 x 128, 30 layers) and no weights: what the
    launcher and bin/evaluate / bin/serve read before any weight (the refusal must come first)."""
    layout = json.loads((REPO / "tests/fixtures/released_layout.json").read_text())
    folder = tmp_path / "lingbot-va-base" / "transformer"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        json.dumps({"_class_name": "WanTransformer3DModel", **layout["config"]})
    )
    # an empty weights file: the folder resolves as a transformer/, and any weight read would fail
    (folder / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    return folder.parent


def test_the_released_architecture_with_stand_ins_is_refused_at_cpu_scale_too(
    released_dims, tmp_path, capsys
):
    """A CPU machine's cpu_scale block (the stand-in encoders) with the released weights, by model.pretrained
    or as a served folder: refused like the full scale, before any weight is read (the folder has none)."""
    run_dir = tmp_path / "run"
    code = launch.main(
        [
            "furniture_train",
            "1",
            "--cpu-scale",
            "--run-dir",
            str(run_dir),
            "--set",
            f"model.pretrained={released_dims}",
        ]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    said = "\n".join(lines)
    assert code == 2 and "data.encoder=patch_mean" in lines[-1] and str(released_dims) in lines[-1], said
    assert not run_dir.exists()
    from trainer.config import ConfigError
    from trainer.sampling.load import load_model

    with pytest.raises(ConfigError, match="weights-free stand-in input"):
        load_model(released_dims, load_config("libero", cpu_scale=True), full_scale=False)


def test_a_folders_dims_win_over_a_presets_cpu_scale_ones_but_not_over_a_set(released):
    """bin/evaluate / bin/serve of an export of a CPU-scale run: the preset's cpu_scale model.dim (128) is
    not the user's choice and gives way to the folder's config.json (48); it was refused, with the fix
    "train without model.pretrained". A --set that differs is still a conflict."""
    from trainer.config import resolve_config
    from trainer.sampling.load import TargetError, load_reference_model

    cfg, sources = resolve_config("furniture_train", cpu_scale=True)
    assert cfg.model.dim != 48 and sources["model.dim"].endswith("(cpu_scale)")
    model, loaded = load_reference_model(released / "transformer", cfg, sources)
    assert loaded.model.dim == 48
    cfg, sources = resolve_config("furniture_train", cpu_scale=True, overrides={"model.dim": "96"})
    with pytest.raises(TargetError, match="--set sets model.dim=96"):
        load_reference_model(released / "transformer", cfg, sources)
