"""The held-out split (trainer/data/split.py) and what the stream, the cache manifest and the config make
of it; the best-checkpoint pointer and pruning (trainer/checkpoint/best.py, checkpointer.py)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from trainer.checkpoint.best import POINTER, BestPin, find_best
from trainer.checkpoint.checkpointer import prune
from trainer.checkpoint.layout import MARKER, TRAIN_STATE, scan
from trainer.config import ConfigError, RunConfig, apply_overrides, check_config
from trainer.data.cache.manifest import manifest_split
from trainer.data.formats import generate as generate_mod
from trainer.data.split import SplitError, held_out_count, split_episodes
from trainer.data.stream import BatchStream, build_stream
from trainer.loop.validate import val_batch

pytestmark = pytest.mark.fast

NAMES = [f"one_leg/2026-01-01-00:{m:02d}:00/2026-01-01-00:{m:02d}:00.pkl" for m in range(12)]


def test_split_is_a_function_of_the_names_only():
    train, held = split_episodes(NAMES, 2)
    assert len(held) == 2 and len(train) == 10 and set(train) | set(held) == set(NAMES)
    assert train == [n for n in NAMES if n not in held]  # both in the order given
    shuffled = random.Random(3).sample(NAMES, len(NAMES))
    assert set(split_episodes(shuffled, 2)[1]) == set(held)  # order, position: irrelevant
    assert split_episodes(NAMES, 2.0) == (train, held)  # a float count is the same count
    # one more episode: the held-out set changes only if the newcomer ranks among the lowest
    more = [*NAMES, "one_leg/2027-01-01-00:00:00/2027-01-01-00:00:00.pkl"]
    new_held = split_episodes(more, 2)[1]
    assert set(new_held) == set(held) or more[-1] in new_held
    assert split_episodes(NAMES, 0) == (NAMES, [])
    assert len(split_episodes(NAMES, 0.25)[1]) == 3 and len(split_episodes(NAMES, 0.01)[1]) == 1
    assert set(split_episodes(NAMES, 3)[1]) >= set(held)  # counts nest: k + 1 keeps the first k


def test_split_too_small_and_bad_values_are_errors_naming_the_numbers():
    with pytest.raises(SplitError, match=r"val_episodes=3 holds out 3 .* only 3 usable"):
        split_episodes(NAMES[:3], 3)
    with pytest.raises(SplitError, match="whole number"):
        held_out_count(10, 2.5)
    with pytest.raises(SplitError, match="expected 0"):
        held_out_count(10, -1)
    with pytest.raises(SplitError, match="unique"):
        split_episodes([NAMES[0], NAMES[0]], 1)
    for bad in ("2.5", "-1"):
        cfg = RunConfig()
        apply_overrides(cfg, {"data.val_episodes": bad}, "test")
        with pytest.raises(ConfigError, match="data.val_episodes"):
            check_config(cfg)
    cfg = RunConfig()
    apply_overrides(cfg, {"checkpoint.best_by": "train_loss"}, "test")
    with pytest.raises(ConfigError, match="checkpoint.best_by must be one of val_action_loss"):
        check_config(cfg)


def test_manifest_records_the_split_or_why_not():
    episodes = [{"file": n, "status": "used", "latent_frames": 10} for n in NAMES[:4]]
    episodes.append({"file": "x.pkl", "status": "skipped", "reason": "error"})
    record = manifest_split(episodes, 2, frames=8)
    assert record["held_out"] == split_episodes(NAMES[:4], 2)[1] and record["train"] == 2
    assert "error" in manifest_split(episodes, 4, frames=8)
    assert manifest_split(episodes, 1, frames=11)["error"].startswith("data.val_episodes=1 holds out 1")


def _stream(cfg, held_out=(), actions_scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    n = 5
    latents = [rng.standard_normal((6, 4, 8, 8)).astype(np.float32) for _ in range(n)]
    actions = [rng.standard_normal((12, 8)).astype(np.float32) for _ in range(n)]
    for e in range(n):
        if f"ep{e}" in held_out:
            actions[e] = actions[e] * actions_scale
            latents[e] = latents[e] * actions_scale
    return BatchStream(cfg, 0, 1, latents, actions, names=[f"ep{e}" for e in range(n)], held_out=held_out)


def small_cfg(**overrides):
    cfg = RunConfig()
    apply_overrides(
        cfg,
        {
            "data.frames": 4,
            "data.actions_per_frame": 2,
            "data.text_length": 4,
            "model.latent_size": 8,
            "model.latent_channels": 4,
            "model.text_dim": 8,
            "train.grad_accum": 2,
            **overrides,
        },
        "test",
    )
    return cfg


def test_held_out_episodes_never_train_and_do_not_shape_the_statistics():
    cfg = small_cfg()
    held = ("ep1", "ep3")
    stream = _stream(cfg, held)
    assert {e for e, _ in stream.clips} == {0, 2, 4}
    assert stream.held_out == [1, 3] and stream.val_clips() == [(1, 0), (3, 0)]  # 6 frames: one clip of 4
    # the held-out episodes' values do not change a single training batch (statistics: training only)
    other = _stream(cfg, held, actions_scale=7.0)
    for step in range(4):
        a, b = stream.micro_batch(step, 1), other.micro_batch(step, 1)
        assert all(torch.equal(a[k], b[k]) for k in a), step
    with pytest.raises(Exception, match="not in the dataset"):
        _stream(cfg, ("ep9",))


def test_validation_draws_are_fixed_per_episode_and_frame_not_per_run():
    held = ("ep1", "ep3")
    one = _stream(small_cfg(), held)
    two = _stream(
        small_cfg(**{"train.seed": 5, "recipe.text_dropout": 1.0, "recipe.noisy_history_prob": 1.0}), held
    )
    a, b = val_batch(one, 1, 0), val_batch(two, 1, 0)
    for key in ("latent_sigma", "latent_noise", "action_sigma", "action_noise", "frames_per_chunk", "window"):
        assert torch.equal(a[key], b[key]), key  # train.seed plays no part
    assert not b["text_dropped"].any() and not b["history_sigma"].any()  # prompt kept, clean history
    c = val_batch(one, 3, 0)
    assert not torch.equal(a["latent_noise"], c["latent_noise"])  # another episode, other draws
    before = torch.get_rng_state()
    val_batch(one, 1, 0)
    assert torch.equal(before, torch.get_rng_state())  # no global RNG consumed


def test_build_stream_applies_the_split_and_names_both_numbers(tmp_path):
    root = tmp_path / "ds"
    generate_mod.generate_dataset(root, 4, 20, "one_leg", seed=0)  # index 3 is an observation failure
    cfg = small_cfg(**{"data.path": str(root), "data.text_length": 16, "model.text_dim": 4096})
    stream = build_stream(cfg, 0, 1)
    summary = stream.data_summary
    assert summary is not None and summary.split is not None and len(summary.split["held_out"]) == 2
    assert summary.to_json()["split"]["val_episodes"] == 2
    held_idx = {stream.names.index(n) for n in summary.split["held_out"]}
    assert held_idx == set(stream.held_out) and not held_idx & {e for e, _ in stream.clips}
    manifest = json.loads((next(root.rglob("manifest.json"))).read_text())
    assert manifest["split"]["held_out"] == summary.split["held_out"]
    apply_overrides(cfg, {"data.val_episodes": 3}, "test")
    with pytest.raises(SplitError, match=rf"{root}.*val_episodes=3 holds out 3 .* only 3 usable"):
        build_stream(cfg, 0, 1)


def _fake_checkpoint(root, step, validation):
    path = root / f"checkpoint_step_{step}"
    path.mkdir(parents=True)
    (path / TRAIN_STATE).write_text(json.dumps({"step": step, "validation": validation}))
    (path / MARKER).write_text(
        json.dumps({"step": step, "files": {TRAIN_STATE: (path / TRAIN_STATE).stat().st_size}})
    )
    return path


def test_best_is_pinned_out_of_pruning_and_pointed_to(tmp_path):
    root = tmp_path / "checkpoints"
    losses = {2: 0.9, 4: 0.3, 6: 0.5, 8: 0.6, 10: None}
    for step, value in losses.items():
        _fake_checkpoint(
            root,
            step,
            None if value is None else {"action_loss": value, "latent_loss": 1 - value, "loss": 1.0},
        )
    pin = BestPin(root, "val_action_loss")
    # what pruning may remove is only what saves make: a dead attempt's partial save goes; a checkpoint the
    # user moved aside and a folder of their own stay (found by a review: both were deleted unsaid)
    (root / "checkpoint_step_12.tmp-dead").mkdir()
    (root / "my_notes").mkdir()
    (root / "my_notes" / "readme.txt").write_text("mine")
    _fake_checkpoint(root, 14, None).rename(root / "checkpoint_step_14.suspect")
    prune(root, 2, 10, pin)
    assert [c.step for c in scan(root)[0]] == [4, 8, 10]  # newest keep=2, plus the older best
    assert not (root / "checkpoint_step_12.tmp-dead").exists()
    assert (root / "my_notes" / "readme.txt").read_text() == "mine"
    assert (root / "checkpoint_step_14.suspect" / MARKER).is_file()
    link = root / POINTER
    assert (
        link.is_symlink()
        and not link.readlink().is_absolute()
        and link.resolve() == root / "checkpoint_step_4"
    )
    assert (root / "checkpoint_step_4" / MARKER).is_file()  # pruning never follows the pointer
    prune(root, 2, 10, pin)  # again: nothing else goes, the pointer stays
    assert [c.step for c in scan(root)[0]] == [4, 8, 10] and link.resolve().name == "checkpoint_step_4"
    found = find_best(scan(root)[0], "val_latent_loss")
    assert found is not None and found[0].step == 8  # latent 0.4 (step 8) beats 0.7 (step 4)
    BestPin(root, "val_latent_loss")(scan(root)[0])
    assert link.resolve().name == "checkpoint_step_8"
    for entry in root.iterdir():
        assert not entry.name.startswith(".best.tmp")
    # a new best among the newest `keep`: no extra checkpoint is kept, the old best goes
    _fake_checkpoint(root, 12, {"action_loss": 0.1, "latent_loss": 0.9, "loss": 1.0})
    prune(root, 2, 12, pin)
    assert [c.step for c in scan(root)[0]] == [10, 12] and link.resolve().name == "checkpoint_step_12"


def test_short_episodes_are_counted_named_and_repeated_by_the_split_error(tmp_path):
    from trainer.data.short import clip_frames, short_episodes, split_with_short
    from trainer.data.split import SplitError

    cfg = RunConfig()
    cfg.data.frames = 4
    lengths = [9, 10, 11, 12, 13, 17, 5]  # frames; latent frames at stride 4: 1 + (n - 1) // 4
    episodes = [{"file": f"ep{i}.pkl", "status": "used", "actions": n, "latent_frames": 1 + (n - 1) // 4}
                for i, n in enumerate(lengths)]  # fmt: skip
    episodes.append({"file": "bad.pkl", "status": "skipped", "reason": "error is True"})
    manifest = {"spec": {"temporal": 4}, "episodes": episodes}
    short = short_episodes(cfg, manifest, tmp_path)
    assert short is not None and short["count"] == 5 and short["clip_frames"] == clip_frames(4, 4) == 13
    assert [e["frames"] for e in short["episodes"]] == [9, 10, 11, 12, 5]
    line = short["line"]
    assert "5 episode(s) shorter than one clip, skipped: ep0.pkl (9 frames), ep1.pkl (10 frames)" in line
    assert "one clip needs 13 frames (data.frames=4 latent frames, the encoder's temporal stride 4" in line
    assert "lower data.frames" in line
    said = r"only 2 usable episode\(s\).*5 more episode\(s\) were found but are shorter than one clip \(13"
    with pytest.raises(SplitError, match=said):
        split_with_short(["ep4.pkl", "ep5.pkl"], 2, short)
    cfg.data.frames = 1
    assert short_episodes(cfg, manifest, tmp_path) is None
