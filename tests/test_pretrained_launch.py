"""model.pretrained and the data through bin/train's launcher. The dimensions come from the folder's
config.json whatever the cpu_scale block says; only a model.* value the user set (--set, the config file) can
conflict, and that
is said before the preflight, in one line, exit 2, nothing written. A folder that cannot be read is a
preflight failure (exit 3). The launcher runs in this process; torchrun is replaced by a recorder.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import provision.check
from provision.check import PASS, Check, Report
from tests.support.lingbot_tiny import tiny_cfg
from trainer.config import resolve_config
from trainer.launcher import main as launch
from trainer.launcher import supervise
from trainer.model import WorldModel, apply_pretrained_config, export_reference
from trainer.model.weights import PretrainedConflict

pytestmark = pytest.mark.fast


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in list(os.environ):
        if var.startswith(("SLURM_", "LINGBOT_")) or var in ("CONDA_PREFIX", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("CONDA_ENVS_PATH", str(tmp_path / "envs"))
    monkeypatch.setattr(launch, "gpu_count", lambda: 0)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A released-layout folder (DIR/transformer/{config.json, safetensors}) of a tiny model: dim 48."""
    cfg = tiny_cfg()
    torch.manual_seed(0)
    folder = export_reference(WorldModel(cfg), cfg, tmp_path_factory.mktemp("w") / "lingbot-va-base")
    assert folder is not None
    return folder.parent


class Recorder:
    """Stands in for supervise.Torchrun: keeps the attempt dir; the ranks 'vanish' (no records)."""

    attempts: list = []

    def __init__(self, command, env, attempt, detector=None, log=None):
        Recorder.attempts.append(attempt.dir)
        self.signals, self.stderr_tail, self.record_lines, self.killed_note = [], [], {}, None
        self.stopped_before_ranks = self.hung = None

    def wait(self):
        return 0


@pytest.fixture
def recorder(monkeypatch):
    Recorder.attempts = []
    monkeypatch.setattr(supervise, "Torchrun", Recorder)
    checks = Report(prefix="p", env_name="e", worker=False, fast=True, node="n", started="now",
                    checks=[Check("x", PASS, 0.0, "ok")])  # fmt: skip
    monkeypatch.setattr(provision.check, "run_checks", lambda prefix, **kw: checks)
    return Recorder


def test_cpu_scale_sizes_give_way_to_config_json(released):
    cfg, sources = resolve_config(
        "furniture_train", cpu_scale=True, overrides={"model.pretrained": str(released)}
    )
    assert cfg.model.dim == 128  # the cpu_scale block's, before the folder is read
    assert apply_pretrained_config(cfg, sources) == released / "transformer"
    assert (cfg.model.dim, cfg.model.heads, cfg.model.depth, cfg.model.ffn_dim) == (48, 4, 2, 96)


def test_a_dimension_set_on_the_command_line_conflicts(released):
    overrides = {"model.pretrained": str(released), "model.depth": "3"}
    cfg, sources = resolve_config("furniture_train", cpu_scale=True, overrides=overrides)
    with pytest.raises(PretrainedConflict, match=r"--set sets model.depth=3 but .*config.json says 2"):
        apply_pretrained_config(cfg, sources)


def test_bin_train_on_cpu_takes_the_folders_dimensions(released, recorder, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["furniture_train", "2", "--run-dir", str(run_dir), "--set", f"model.pretrained={released}",
            "--set", "train.steps=2", "--set", "model.latent_size=8"]  # fmt: skip
    assert launch.main(argv) == 1  # the recorder's ranks vanish: past the preflight is all that is asked
    err = capsys.readouterr().err
    assert "PretrainedError" not in err and "dim 48, depth 2" in err, err
    written = json.loads((recorder.attempts[0] / "config.json").read_text())["model"]
    assert (written["dim"], written["heads"], written["depth"], written["text_dim"]) == (48, 4, 2, 16)


def test_a_conflict_is_exit_2_in_one_line_before_the_preflight(released, recorder, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["furniture_train", "2", "--run-dir", str(run_dir), "--set", f"model.pretrained={released}",
            "--set", "model.dim=64", "--set", "model.heads=2"]  # fmt: skip
    assert launch.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "--set sets model.dim=64 but" in lines[0] and "--set sets model.heads=2 but" in lines[0]
    assert "model.depth" not in lines[0]  # the cpu_scale block's depth 4 is not the user's: no conflict
    assert not run_dir.exists() and recorder.attempts == []


def test_an_unreadable_folder_is_a_preflight_failure(recorder, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = [
        "furniture_train",
        "2",
        "--run-dir",
        str(run_dir),
        "--set",
        f"model.pretrained={tmp_path / 'nope'}",
    ]
    assert launch.main(argv) == 3
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "preflight failed: model.pretrained=" in last and "no such directory" in last
    assert "the next run fails the same way until that is fixed; then it starts fresh" in last
    assert recorder.attempts == []
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "preflight_failed"


def test_weights_that_do_not_fit_the_model_fail_the_preflight_in_one_line(
    released, recorder, tmp_path, capsys
):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken" / "transformer"
    broken.mkdir(parents=True)
    for f in (released / "transformer").iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    weights = broken / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    tensors.pop("proj_out.bias")
    save_file(tensors, weights)
    run_dir = tmp_path / "run"
    argv = ["furniture_train", "2", "--run-dir", str(run_dir), "--set", f"model.pretrained={broken.parent}"]
    assert launch.main(argv) == 3
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "envcheck" not in err  # judged before the env's compile checks
    assert "1 missing tensor(s): proj_out.bias" in last and "the next run fails the same way until" in last
    assert recorder.attempts == []


def test_a_data_path_without_episodes_fails_the_preflight(recorder, tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("not an episode")
    run_dir = tmp_path / "run"
    argv = ["furniture_train", "2", "--run-dir", str(run_dir), "--set", f"data.path={tmp_path / 'data'}"]
    assert launch.main(argv) == 3
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "preflight failed: " in last and "holds no one_leg episodes" in last
    assert recorder.attempts == []
