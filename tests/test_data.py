"""FurnitureBench .pkl round trip, bad-data errors, atomic generation, deterministic micro-batches."""

import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from trainer.config import RunConfig, apply_overrides
from trainer.data import DatasetError, build_stream
from trainer.data import encoder as encoder_mod
from trainer.data import generate as generate_mod
from trainer.data.furniturebench import ROBOT_STATE, episode_files, read_episode, write_episode
from trainer.data.normalize import QuantileNormalizer
from trainer.data.stream import ensure_dataset

EPISODES, LENGTH = 3, 24


def small_cfg(path, **overrides):
    cfg = RunConfig()
    apply_overrides(
        cfg,
        {
            "data.path": str(path),
            "data.generated_episodes": EPISODES,
            "data.generated_length": LENGTH,
            "data.frames": 4,
            "data.frames_per_chunk": 2,
            "model.latent_size": 8,
            "model.latent_channels": 4,
            "model.dim": 32,
            "model.depth": 2,
            "model.heads": 2,
            "model.attn_block": 32,
            "train.grad_accum": 3,
            **overrides,
        },
        "test",
    )
    cfg.validate()
    return cfg


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("fb") / "furniture_train"
    generate_mod.generate_dataset(root, EPISODES, LENGTH, "one_leg", seed=0)
    return root


def test_generated_files_round_trip(dataset):
    files = episode_files(dataset, "one_leg")
    assert [f.name for f in files] == ["0.pkl", "1.pkl", "2.pkl"]
    ep = read_episode(files[1])
    raw = generate_mod.generate_episode(0, 1, LENGTH, "one_leg")
    assert ep.furniture == "one_leg" and ep.num_actions == LENGTH and ep.num_observations == LENGTH + 1
    np.testing.assert_array_equal(ep.actions, np.stack(raw["actions"]))
    np.testing.assert_array_equal(ep.images["color_image2"][5], raw["observations"][5]["color_image2"])
    assert ep.images["color_image1"].dtype == np.uint8 and ep.images["color_image1"].shape == (
        LENGTH + 1,
        224,
        224,
        3,
    )
    for key, n in ROBOT_STATE.items():
        assert ep.robot_state[key].shape == (LENGTH + 1, n)
    assert ep.rewards.shape == ep.skills.shape == (LENGTH,)


def test_generator_is_deterministic_and_scenes_move():
    a = generate_mod.generate_episode(3, 0, 12, "one_leg")
    b = generate_mod.generate_episode(3, 0, 12, "one_leg")
    c = generate_mod.generate_episode(3, 1, 12, "one_leg")
    np.testing.assert_array_equal(np.stack(a["actions"]), np.stack(b["actions"]))
    assert np.array_equal(a["observations"][7]["color_image2"], b["observations"][7]["color_image2"])
    assert not np.array_equal(a["observations"][0]["color_image2"], c["observations"][0]["color_image2"])
    # the arm moves: the front view changes where it went, and the action explains the move
    frames = [o["color_image2"].astype(int) for o in a["observations"]]
    assert np.abs(frames[3] - frames[2]).sum() > 0
    pos = np.stack([o["robot_state"]["ee_pos"] for o in a["observations"]])
    np.testing.assert_allclose(pos[1:] - pos[:-1], np.stack(a["actions"])[:, :3], atol=1e-6)


def test_full_script_places_the_part():
    ep = generate_mod.generate_episode(0, 2, 60, "one_leg")
    assert ep["success"] and sum(ep["rewards"]) == 1.0 and sum(ep["skills"]) == 8


def _write_broken(tmp_path, mutate, name="7.pkl"):
    data = generate_mod.generate_episode(0, 0, 4, "one_leg")
    mutate(data)
    path = tmp_path / name
    write_episode(path, data)
    return path


@pytest.mark.parametrize(
    ("mutate", "key", "problem"),
    [
        (
            lambda d: d["observations"][2]["robot_state"].pop("ee_pos"),
            "observations[2].robot_state.ee_pos",
            "missing",
        ),
        (lambda d: d.pop("actions"), "actions", "missing"),
        (lambda d: d.pop("furniture"), "furniture", "missing"),
        (
            lambda d: d["observations"][1].__setitem__("color_image2", np.zeros((100, 100, 3), np.uint8)),
            "observations[1].color_image2",
            "expected shape (224, 224, 3), got (100, 100, 3)",
        ),
        (lambda d: d["actions"].__setitem__(3, np.zeros(7)), "actions[3]", "expected shape (8,), got (7,)"),
        (
            lambda d: d["observations"][0]["robot_state"].__setitem__("joint_positions", np.zeros(6)),
            "observations[0].robot_state.joint_positions",
            "expected shape (7,)",
        ),
        (
            lambda d: d.update(actions=[], rewards=[], skills=[], observations=d["observations"][:1]),
            "actions",
            "empty episode",
        ),
        (lambda d: d["rewards"].pop(), "rewards", "expected 4 entries"),
        (lambda d: d.update(observations=d["observations"][:3]), "observations", "expected 5"),
    ],
    ids=[
        "missing-state",
        "missing-actions",
        "missing-furniture",
        "image-shape",
        "action-shape",
        "joint-shape",
        "empty",
        "rewards-length",
        "observations-length",
    ],
)
def test_bad_data_names_file_and_key(tmp_path, mutate, key, problem):
    path = _write_broken(tmp_path, mutate)
    with pytest.raises(DatasetError) as info:
        read_episode(path)
    message = str(info.value)
    assert str(path) in message and f": {key}: " in message and problem in message


def test_not_a_pickle(tmp_path):
    path = tmp_path / "0.pkl"
    path.write_bytes(b"not a pickle")
    with pytest.raises(DatasetError, match=r"0\.pkl: <file>: not a readable episode pickle"):
        read_episode(path)


def test_stream_reports_bad_episode(tmp_path):
    root = tmp_path / "ds"
    (root / "one_leg").mkdir(parents=True)
    data = generate_mod.generate_episode(0, 0, 10, "one_leg")
    del data["observations"][4]["color_image2"]
    write_episode(root / "one_leg" / "0.pkl", data)
    with pytest.raises(DatasetError, match=r"one_leg/0\.pkl: observations\[4\]\.color_image2: missing"):
        build_stream(small_cfg(root), 0, 1)


def test_killed_generation_is_never_a_dataset(tmp_path, monkeypatch):
    root = tmp_path / "furniture_train"
    calls = []

    def dying_write(path, data):
        if len(calls) == 2:
            raise KeyboardInterrupt  # stands in for a kill in the middle of writing
        calls.append(path)
        write_episode(path, data)

    monkeypatch.setattr(generate_mod, "write_episode", dying_write)
    with pytest.raises(KeyboardInterrupt):
        ensure_dataset(small_cfg(root))
    assert not root.exists()  # the partial dataset lives only under a temporary name
    monkeypatch.undo()
    files = ensure_dataset(small_cfg(root))
    assert len(files) == EPISODES
    assert not list(tmp_path.glob(".furniture_train.tmp-*"))  # the leftover was cleaned up


def test_missing_dataset_without_generation(tmp_path):
    with pytest.raises(DatasetError, match="generate_if_missing is off.*python -m trainer.data.generate"):
        ensure_dataset(small_cfg(tmp_path / "absent", **{"data.generate_if_missing": False}))


def test_generate_cli(tmp_path):
    out = tmp_path / "cli"
    args = [sys.executable, "-m", "trainer.data.generate", str(out), "--episodes", "2", "--length", "5"]
    first = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert len(episode_files(out, "one_leg")) == 2
    with open(out / "one_leg" / "1.pkl", "rb") as f:
        assert len(pickle.load(f)["actions"]) == 5
    again = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "exists and is not empty" in again.stderr


def test_quantile_normalizer():
    rng = np.random.default_rng(0)
    acts = np.stack([rng.uniform(-2, 6, 1000), np.full(1000, 0.5)], axis=1)
    norm = QuantileNormalizer.fit(acts)
    out = norm.normalize(acts)
    assert out.min() >= -1 and out.max() <= 1
    np.testing.assert_allclose(norm.normalize(norm.q01[None]), [[-1.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(norm.normalize(norm.q99[None])[:, 0], [1.0], atol=1e-6)
    assert (out[:, 1] == 0).all()  # constant channel
    inside = acts[(acts[:, 0] > norm.q01[0]) & (acts[:, 0] < norm.q99[0])]
    np.testing.assert_allclose(
        norm.denormalize(norm.normalize(inside))[:, 0], inside[:, 0], rtol=1e-5, atol=1e-5
    )


def test_latent_cache_is_used(dataset, monkeypatch):
    cfg = small_cfg(dataset)
    first = build_stream(cfg, 0, 1)
    assert list((dataset / ".latents").rglob("*.npz"))

    def no_decoding(*args, **kwargs):
        raise AssertionError("the cache should have answered")

    monkeypatch.setattr(encoder_mod, "read_episode", no_decoding)
    second = build_stream(cfg, 0, 1)
    for key, value in first.micro_batch(2, 1).items():
        assert torch.equal(value, second.micro_batch(2, 1)[key]), key


def test_micro_batch_is_deterministic_and_stateless(dataset):
    cfg = small_cfg(dataset, **{"train.batch_size": 2})
    a0, b0, a1 = build_stream(cfg, 0, 2), build_stream(cfg, 0, 2), build_stream(cfg, 1, 2)
    for _ in range(3):
        a0.micro_batch(0, 0)  # earlier calls must not change later answers
    x, y = a0.micro_batch(5, 2), b0.micro_batch(5, 2)
    assert set(x) == set(y)
    for key in x:
        assert torch.equal(x[key], y[key]), key
    other = a1.micro_batch(5, 2)
    assert not torch.equal(x["latent_noise"], other["latent_noise"])
    assert x["latents"].shape == (2, 4, 4, 8, 8) and x["actions"].shape == (2, 8, cfg.model.action_dim)
    assert a0.tokens_per_micro_batch == 2 * 2 * (4 * 16 + 8)
    assert x["actions"][..., cfg.model.action_used :].abs().max() == 0
    assert x["actions"].abs().max() <= 1


def test_ranks_and_epochs_partition_clips(dataset):
    cfg = small_cfg(dataset)
    streams = [build_stream(cfg, r, 2) for r in range(2)]
    n = streams[0].num_clips
    per_step = cfg.train.grad_accum * 2
    seen = []
    for step in range(-(-n // per_step) + 1):
        step_ids = [s.sample_indices(step, m)[0] for m in range(cfg.train.grad_accum) for s in streams]
        assert len(set(step_ids)) == len(step_ids)  # no clip twice within a step
        seen.extend(step_ids)
    assert sorted(seen[:n]) == list(range(n))  # the first epoch visits every clip once
    assert seen[n : 2 * n] != seen[:n]  # the next epoch is reshuffled


def test_chunk_and_window_choices_per_step(dataset):
    cfg = small_cfg(dataset, **{"data.chunk_choices": "1,2,4", "data.window_choices": "1,3"})
    s0, s1 = build_stream(cfg, 0, 2), build_stream(cfg, 1, 2)
    choices = {s0.mask_choices(step) for step in range(40)}
    assert {c for c, _ in choices} == {1, 2, 4} and {w for _, w in choices} == {1, 3}
    b0, b1 = s0.micro_batch(7, 0), s1.micro_batch(7, 2)
    assert int(b0["frames_per_chunk"]) == int(b1["frames_per_chunk"]) and int(b0["window"]) == int(
        b1["window"]
    )
