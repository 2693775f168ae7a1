"""config/perf.py: what each speed option's `auto` means per device, and the values the config accepts."""

from __future__ import annotations

import pytest
import torch

from tests.support.lingbot_tiny import tiny_cfg
from trainer.config import ConfigError, RunConfig, apply_overrides, check_config
from trainer.config.perf import AcPlan, adamw_impl, compile_blocks, parse_ac, prefetch_data

pytestmark = pytest.mark.fast
CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def test_auto_means_the_measured_default_per_device():
    cfg = RunConfig()
    assert not compile_blocks(cfg, CUDA) and not compile_blocks(cfg, CPU)  # unmeasured on a GPU: off
    assert not prefetch_data(cfg, CUDA) and not prefetch_data(cfg, CPU)
    cfg.train.compile, cfg.train.data_path = "true", "prefetch"
    assert compile_blocks(cfg, CPU) and prefetch_data(cfg, CPU)
    assert adamw_impl(cfg, CUDA) == {"fused": True} and adamw_impl(cfg, CPU) == {"foreach": False}
    assert parse_ac("auto", "cuda") == AcPlan("full") and parse_ac("auto", "cpu") == AcPlan("none")
    cfg.train.compile, cfg.train.optimizer = "false", "foreach"
    assert not compile_blocks(cfg, CUDA) and adamw_impl(cfg, CUDA) == {"foreach": True}


@pytest.mark.parametrize(
    "value, plan, wrapped",
    [("none", AcPlan("none"), []), ("false", AcPlan("none"), []), ("true", AcPlan("full"), [0, 1, 2, 3]),
     ("full", AcPlan("full"), [0, 1, 2, 3]), ("op", AcPlan("op"), [0, 1, 2, 3]),
     ("block:2", AcPlan("full", 2), [0, 2]), ("block:1", AcPlan("full"), [0, 1, 2, 3])],
)  # fmt: skip
def test_activation_checkpointing_values(value, plan, wrapped):
    got = parse_ac(value)
    assert got == plan and [i for i in range(4) if got.wraps(i)] == wrapped
    cfg = tiny_cfg(**{"model.activation_checkpointing": value})  # the config's rules accept it
    assert cfg.model.activation_checkpointing == value


BAD = [
    ("model.activation_checkpointing", "block:0"),
    ("model.activation_checkpointing", "sometimes"),
    ("train.compile", "maybe"),
    ("train.data_path", "disk"),
    ("train.optimizer", "sgd"),
    ("train.fsdp_prefetch", "-1"),
]


@pytest.mark.parametrize("key, value", BAD)
def test_bad_values_are_refused_naming_the_key(key, value):
    cfg = RunConfig()
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        apply_overrides(cfg, {key: value}, "--set")
        check_config(cfg)


def test_a_yaml_boolean_still_sets_the_word_options():
    cfg = RunConfig()
    apply_overrides(cfg, {"train.compile": True, "model.activation_checkpointing": False}, "test.yaml")
    assert cfg.train.compile == "true" and cfg.model.activation_checkpointing == "false"
    assert compile_blocks(cfg, CPU) and parse_ac(cfg.model.activation_checkpointing) == AcPlan("none")
