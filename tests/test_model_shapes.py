"""trainer/model/shapes.py's parameter table is WorldModel's parameters: names, shapes, order and which
train, for every preset (and its cpu_scale block) and for a change of each ModelConfig field; and the
checkpoint-size estimate built from it needs no torch (the launcher never imports torch on a CPU node)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.config import available_configs, load_config
from trainer.model import WorldModel
from trainer.model.shapes import Param, parameter_table

pytestmark = pytest.mark.fast
REPO = Path(__file__).resolve().parents[1]


def built(cfg) -> list[Param]:
    with torch.device("meta"):
        model = WorldModel(cfg)
    return [Param(n, tuple(p.shape), p.requires_grad) for n, p in model.named_parameters()]


def small(**model):
    cfg = load_config("furniture_train", cpu_scale=True, overrides={})
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **model))


@pytest.mark.parametrize("name", available_configs())
@pytest.mark.parametrize("cpu_scale", [True, False])
def test_table_is_the_built_model_for_every_preset(name, cpu_scale):
    cfg = load_config(name, cpu_scale=cpu_scale, overrides={})
    assert parameter_table(cfg.model) == built(cfg)


# every field that shapes a parameter, changed alone (the others: attention, masks, init do not)
@pytest.mark.parametrize(
    "change",
    [
        {"dim": 96, "heads": 3}, {"depth": 1}, {"depth": 3}, {"ffn_dim": 40}, {"text_dim": 24},
        {"freq_dim": 64}, {"cross_attn_norm": False}, {"latent_channels": 5}, {"patch": 1},
        {"action_dim": 9, "action_used": 9},
    ],
)  # fmt: skip
def test_table_follows_each_shape_field(change):
    cfg = small(**change)
    assert parameter_table(cfg.model) == built(cfg)


def test_the_check_can_fail():
    cfg = small()
    table = parameter_table(cfg.model)
    assert parameter_table(small(cross_attn_norm=False).model) != built(cfg)
    assert [p.trained for p in table].count(False) == 4  # condition_embedder_action.text_embedder


def test_the_launcher_sizes_a_checkpoint_and_judges_the_inputs_without_importing_torch(tmp_path):
    """torch's import is 2 CPU-s: bin/train's launcher, which starts torchrun and its ranks, never pays it
    on a CPU node (each rank does); the inputs check (trainer/launcher/inputs.py) included: it imported
    the encoders for their folder rules (trainer/data/encoding/folders.py owns them now)."""
    code = (
        "import sys\n"
        "import trainer.launcher.main\n"
        "from trainer.config import load_config\n"
        "from trainer.checkpoint.size import estimate_bytes, model_size\n"
        "from trainer.launcher.envchoice import gpu_count\n"
        "from trainer.launcher.inputs import inputs_check\n"
        "from provision.nodeinfo import cpu_only_node\n"
        f"overrides = {{'data.path': {str(tmp_path)!r}}}\n"
        "cfg = load_config('furniture_train', cpu_scale=True, overrides=overrides)\n"
        "print(estimate_bytes(cfg, model_size(cfg), 2))\n"
        "assert inputs_check(cfg)[0].startswith('data: no episodes under')\n"
        "if cpu_only_node():  # a GPU node's count is torch's own, and imports it\n"
        "    assert gpu_count() == 0\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from trainer.checkpoint.size import ModelSize, estimate_bytes

    cfg = load_config("furniture_train", cpu_scale=True, overrides={"data.path": str(tmp_path)})
    with torch.device("meta"):
        expected = estimate_bytes(cfg, ModelSize.of(list(WorldModel(cfg).parameters())), 2)
    assert proc.stdout.split()[0] == str(expected)
