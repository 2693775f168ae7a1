"""The run config: every shipped config loads at both scales; --set is strict about keys and values."""

from __future__ import annotations

import re

import pytest

from trainer.config import ConfigError, available_configs, check_config, load_config, parse_set

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("name", available_configs())
@pytest.mark.parametrize("cpu_scale", [False, True])
def test_every_shipped_config_loads_and_validates(name, cpu_scale):
    cfg = load_config(name, cpu_scale=cpu_scale)
    check_config(cfg)
    assert cfg.name == name


def test_furniture_train_is_the_seed_experiment_and_cpu_scale_is_smaller():
    full = load_config("furniture_train", cpu_scale=False)
    assert (full.train.steps, full.train.grad_accum, full.train.batch_size) == (5000, 10, 1)
    assert full.train.lr == pytest.approx(1e-5)
    assert full.checkpoint.every == 200
    cpu = load_config("furniture_train", cpu_scale=True)
    assert cpu.train.steps < full.train.steps
    assert cpu.model.dim < full.model.dim and cpu.model.depth <= full.model.depth
    assert cpu.train.grad_accum == full.train.grad_accum  # the accumulation structure carries over


def test_set_overrides_are_typed():
    cfg = load_config(
        "furniture_train",
        cpu_scale=True,
        overrides=parse_set(
            ["train.steps=7", "train.lr=3e-4", "checkpoint.export_safetensors=yes", "train.betas=0.8,0.9"]
        ),
    )
    assert cfg.train.steps == 7 and isinstance(cfg.train.steps, int)
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.checkpoint.export_safetensors is True
    assert cfg.train.betas == [0.8, 0.9]


@pytest.mark.parametrize(
    "item, message",
    [
        ("train.stepz=3", "unknown key 'train.stepz'"),
        ("trian.steps=3", "unknown key 'trian.steps'"),
        ("train.steps=abc", "bad value 'abc' for train.steps: train.steps must be an integer"),
        ("train.steps=2.5", "must be an integer"),
        ("log.wandb=maybe", "bad value 'maybe' for log.wandb: log.wandb must be true or false"),
        ("model=3", "is a section"),
        ("train.steps=0", "train.steps=0 is not allowed: train.steps must be > 0"),
        ("model.dim=100", "model.dim must be > 0, a multiple of model.heads"),
    ],
)
def test_bad_set_is_a_clear_error(item, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("furniture_train", cpu_scale=False, overrides=parse_set([item]))


def test_unknown_key_error_lists_the_known_ones():
    with pytest.raises(ConfigError) as err:
        load_config("furniture_train", cpu_scale=False, overrides=parse_set(["train.stepz=3"]))
    assert "grad_accum" in str(err.value) and "steps" in str(err.value)


@pytest.mark.parametrize("item", ["train.steps", "=3", ""])
def test_malformed_set_item(item):
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_set([item])


def test_unknown_config_names_the_available_ones():
    with pytest.raises(ConfigError, match=r"unknown config 'nope'.*furniture_train"):
        load_config("nope", cpu_scale=False)
