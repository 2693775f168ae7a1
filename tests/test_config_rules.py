"""The one table of config rules (trainer/config/rules.py): every RunConfig field has a rule or a stated
reason why no value of it can be judged without data or weights; every rule's bad value is refused by
bin/train's launcher before anything else (exit 2, one line naming where it came from, the key, the value
and what is allowed, nothing written), and by a rank reading the same value from config.json (the same
table, the same line).
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path

import pytest

from trainer.attempt import Attempt
from trainer.config import ConfigError, RunConfig, load_config, resolve_config
from trainer.config.rules import CAMERA_NAMES, RULES, Free, Rule
from trainer.data.formats.furniturebench import CAMERAS
from trainer.launcher import main as launch

pytestmark = pytest.mark.fast


def field_keys(cls: type = RunConfig, prefix: str = "") -> list[str]:
    """Every leaf field of RunConfig as a dotted key (sections recursed)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += field_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


JUDGED = [key for key, rule in RULES.items() if isinstance(rule, Rule)]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in list(os.environ):
        if var.startswith(("SLURM_", "LINGBOT_")):
            monkeypatch.delenv(var)
    monkeypatch.setenv("CONDA_ENVS_PATH", str(tmp_path / "envs"))
    monkeypatch.setattr(launch, "gpu_count", lambda: 0)


def test_every_field_has_a_rule_or_a_reason_and_nothing_else():
    fields = field_keys()
    assert not set(fields) - set(RULES), (
        f"fields without a rule or a reason in RULES: {set(fields) - set(RULES)}"
    )
    assert not set(RULES) - set(fields), (
        f"rules for fields RunConfig does not have: {set(RULES) - set(fields)}"
    )
    for key, rule in RULES.items():
        if isinstance(rule, Free):
            assert len(rule.why) > 20, f"{key}: say why no value of it can be judged here"
        else:
            assert rule.allowed and rule.bad is not None, key


def test_the_shipped_config_passes_its_own_rules():
    for cpu_scale in (False, True):
        load_config("furniture_train", cpu_scale=cpu_scale)  # raises on any violation


def test_camera_names_are_the_readers():
    assert CAMERA_NAMES == CAMERAS


@pytest.mark.parametrize("key", JUDGED)
def test_the_launcher_refuses_each_bad_value_first_with_exit_2_and_writes_nothing(key, tmp_path, capsys):
    rule = RULES[key]
    assert isinstance(rule, Rule)
    run_dir = tmp_path / "run"
    code = launch.main(["furniture_train", "2", "--run-dir", str(run_dir), "--set", f"{key}={rule.bad}"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert not run_dir.exists()  # nothing written, not even the run dir
    assert len(lines) == 1 and "Traceback" not in err, err
    assert key in lines[0] and "--set" in lines[0] and f"must be {rule.allowed}" in lines[0], lines[0]
    assert "fails the same way until that value is fixed" in lines[0]


@pytest.mark.parametrize(
    "item, shown",
    [("train.lr=-1", "train.lr=-1.0"), ("recipe.video_shift=-5", "recipe.video_shift=-5.0"),
     ("data.cameras=[nope]", "data.cameras=['nope']"), ("train.lr=inf", "train.lr=inf"),
     ("recipe.video_shift=inf", "recipe.video_shift=inf")],
)  # fmt: skip
def test_the_values_of_the_report_are_refused_with_key_value_and_allowed(item, shown, tmp_path, capsys):
    assert launch.main(["furniture_train", "2", "--run-dir", str(tmp_path / "run"), "--set", item]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("[bin/train] error: --set: " + shown + " is not allowed"), line


def test_a_rank_judges_its_config_json_with_the_same_table(tmp_path):
    cfg, _ = resolve_config("furniture_train", cpu_scale=True)
    data = cfg.to_dict()
    data["train"]["lr"] = -1.0
    attempt = Attempt(tmp_path / "attempt")
    attempt.dir.mkdir()
    (attempt.dir / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as exc:
        attempt.read_config()
    assert "train.lr=-1.0 is not allowed: train.lr must be > 0" in str(exc.value)
    assert str(attempt.dir / "config.json") in str(exc.value)


def test_a_type_error_names_its_source_key_value_and_type():
    with pytest.raises(ConfigError) as exc:
        load_config("furniture_train", cpu_scale=True, overrides={"train.keep_params_gathered": "maybe"})
    key = "train.keep_params_gathered"
    assert str(exc.value) == f"--set: bad value 'maybe' for {key}: {key} must be true or false"


def test_a_value_from_the_config_file_is_named_by_its_file(tmp_path, monkeypatch):
    from trainer.config import load

    (tmp_path / "mine.yaml").write_text("train:\n  lr: -2\ncpu_scale:\n  train:\n    warmup_steps: -1\n")
    monkeypatch.setattr(load, "CONFIG_DIR", tmp_path)
    with pytest.raises(ConfigError, match=r"mine\.yaml: train\.lr=-2\.0 is not allowed"):
        load_config("mine", cpu_scale=False)
    with pytest.raises(ConfigError, match=r"mine\.yaml \(cpu_scale\): train\.warmup_steps=-1"):
        load_config("mine", cpu_scale=True, overrides={"train.lr": "1e-3"})


def test_a_relative_set_path_is_the_working_directorys_and_a_presets_the_repos(tmp_path, monkeypatch):
    """docs/data.md: a --set path is the working directory's. data.path and model.pretrained were the repo
    root's (found by a review: `--set data.path=reldata` generated episodes inside the checkout)."""
    from provision.paths import repo_root

    monkeypatch.chdir(tmp_path)
    sets = {
        "data.path": "reldata",
        "model.pretrained": "weights/mine",
        "data.vae_path": "vae",
        "data.cache_dir": "c",
    }
    cfg = load_config("furniture_train", cpu_scale=True, overrides=sets)
    assert (cfg.data.path, cfg.model.pretrained, cfg.data.vae_path, cfg.data.cache_dir) == tuple(
        str(tmp_path / v) for v in sets.values()
    )  # data.cache_dir too (a review: a requeue from another folder used another cache)
    preset = load_config("furniture_train", cpu_scale=True)
    assert not Path(preset.data.path).is_absolute()  # the preset's own: resolved against the repo root
    assert (
        load_config("furniture_train", cpu_scale=True, overrides={"data.path": "/abs/x"}).data.path
        == "/abs/x"
    )
    assert repo_root() != tmp_path


def test_a_set_value_that_breaks_another_keys_rule_is_named_with_it(tmp_path, capsys):
    """--set model.heads=5 breaks model.dim's rule (a multiple of heads): the line named only the preset's
    model.dim=128 (found by a review); it now names the --set value too."""
    assert (
        launch.main(["furniture_train", "2", "--run-dir", str(tmp_path / "run"), "--set", "model.heads=5"])
        == 2
    )
    line = capsys.readouterr().err.strip()
    assert "model.dim=128 is not allowed" in line and "(with model.heads=5 from --set)" in line, line


def test_a_preset_with_a_base_is_the_bases_values_with_its_own_on_top(tmp_path, monkeypatch):
    """`base: NAME`: the base's top level, the preset's, then (CPU scale) the base's cpu_scale block, the
    preset's; each value named by the file it came from; a cycle is refused naming the chain."""
    from trainer.config import load

    (tmp_path / "parent.yaml").write_text(
        "train:\n  lr: 0.5\n  steps: 7\ncpu_scale:\n  train:\n    steps: 3\n    warmup_steps: 2\n"
    )
    (tmp_path / "child.yaml").write_text(
        "base: parent\ntrain:\n  lr: 0.25\ncpu_scale:\n  train:\n    steps: 9\n"
    )
    monkeypatch.setattr(load, "CONFIG_DIR", tmp_path)
    full, sources = load.resolve_config("child", cpu_scale=False)
    assert (full.train.lr, full.train.steps, full.name) == (0.25, 7, "child")
    assert sources["train.steps"] == str(tmp_path / "parent.yaml")
    assert sources["train.lr"] == str(tmp_path / "child.yaml")
    cpu, sources = load.resolve_config("child", cpu_scale=True)
    assert (cpu.train.lr, cpu.train.steps, cpu.train.warmup_steps) == (0.25, 9, 2)
    assert sources["train.warmup_steps"] == f"{tmp_path / 'parent.yaml'} (cpu_scale)"
    (tmp_path / "parent.yaml").write_text("base: child\n")
    with pytest.raises(ConfigError, match=r"child -> parent -> child"):
        load_config("child", cpu_scale=False)


@pytest.mark.parametrize(
    "sets, shown, why",
    [
        (["eval.sim_tasks=0-12"], "eval.sim_tasks='0-12'", "libero_10 has tasks 0-9"),
        (["eval.sim_tasks=5-2"], "eval.sim_tasks='5-2'", "5-2 is out of range"),
        (["eval.sim_suite=libero_goal", "eval.sim_tasks=10"], "eval.sim_tasks='10'", "libero_goal has tasks"),
        (["eval.sim=libero", "eval.sim_every=10"], "eval.sim='libero'", "LIBERO's controller takes 7"),
    ],
)
def test_the_eval_values_are_judged_by_the_simulators_own_checks_before_anything(
    sets, shown, why, tmp_path, capsys, monkeypatch
):
    """Issue 56 item 5: eval.sim_tasks out of the suite's range or reversed, and eval.sim libero on a run
    LIBERO's client cannot drive (furniture_train: 8 channels, its own cameras) passed the launcher; every
    evaluation then exited 2 and was recorded failed. The suite's own parse_tasks and check_served judge
    them."""

    def reached(*args, **kwargs):
        raise AssertionError("the launcher went on to the preflight")

    monkeypatch.setattr(launch, "_preflight", reached)
    run_dir = tmp_path / "run"
    argv = ["furniture_train", "2", "--cpu-scale", "--run-dir", str(run_dir)]
    assert launch.main(argv + [arg for s in sets for arg in ("--set", s)]) == 2
    line = capsys.readouterr().err.strip()
    assert shown in line and why in line and len(line.splitlines()) == 1, line
    assert not run_dir.exists()


def test_the_eval_rules_use_the_simulators_suites_not_a_copy():
    from trainer.config import rules
    from trainer.sim import suites

    assert not hasattr(rules, "SIM_SUITES")
    assert RULES["eval.sim_suite"].allowed == "one of " + ", ".join(suites.SUITES)
    cfg = load_config("libero", cpu_scale=False)
    assert cfg.eval.sim == "libero"  # the preset's own: LIBERO's client drives it
    assert not rules.violations(load_config("libero", cpu_scale=True, overrides={"eval.sim_tasks": "0-9"}))
