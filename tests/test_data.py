"""FurnitureBench data: the collector's layout and rules, preprocess_data.py output, discovery, the latent
cache (manifest, staleness, resume), real encoders through a tiny AutoencoderKLWan and a tiny T5, streams."""

import errno
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.support.tiny_wan import make_tiny_vae
from trainer.checkpoint.diskspace import OutOfSpace
from trainer.config import RunConfig, apply_overrides
from trainer.data.cache import store as cache_mod
from trainer.data.cache.manifest import StaleCache
from trainer.data.cache.prepare import ensure_cache, prepare
from trainer.data.encoding.encoder import PatchMeanEncoder, WanVAEEncoder
from trainer.data.encoding.text import StandInText, T5Text
from trainer.data.formats import generate as generate_mod
from trainer.data.formats.discovery import SKIP_ERROR, SKIP_FAILED, SKIP_NO_PKL, discover
from trainer.data.formats.furniturebench import (
    PREPROCESSED,
    ROBOT_STATE,
    DatasetError,
    read_episode,
    write_episode,
)
from trainer.data.normalize import QuantileNormalizer
from trainer.data.stream import build_stream, ensure_dataset

EPISODES, LENGTH = 8, 24  # index 3: observation failure, index 5: failed demonstration


def small_cfg(path, **overrides):
    cfg = RunConfig()
    apply_overrides(
        cfg,
        {
            "data.path": str(path),
            "data.generated_episodes": EPISODES,
            "data.generated_length": LENGTH,
            "data.frames": 4,
            "data.actions_per_frame": 2,
            "data.cameras": "color_image2",
            "data.text_length": 16,
            "model.latent_size": 8,
            "model.latent_channels": 4,
            "model.dim": 48,
            "model.depth": 2,
            "model.heads": 2,
            "model.attn_block": 32,
            "train.grad_accum": 3,
            **overrides,
        },
        "test",
    )
    return cfg


def collector_files(root):
    return discover(root, "one_leg").files


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("fb") / "furniture_train"
    generate_mod.generate_dataset(root, EPISODES, LENGTH, "one_leg", seed=0)
    return root


@pytest.mark.fast
def test_generator_writes_the_collectors_layout(dataset):
    files = collector_files(dataset)
    assert [f.parent.name for f in files] == [generate_mod.collector_name(i) for i in range(EPISODES)]
    assert all(f.name == f"{f.parent.name}.pkl" and f.parent.parent.name == "one_leg" for f in files)
    with open(files[1], "rb") as fh:
        raw = pickle.load(fh)
    assert set(raw) >= {"observations", "actions", "rewards", "skills", "success", "furniture", "error"}
    assert set(raw) >= {"error_description", "cam2_to_base", "cam3_to_base", "cam1_intr", "cam2_intr"}
    obs = raw["observations"][0]
    assert set(obs) == {"color_image1", "color_image2", "robot_state", "parts_poses"}
    assert obs["robot_state"]["joint_positions"].dtype == np.float64 and obs["color_image1"].dtype == np.uint8
    ep = read_episode(files[1])
    assert ep.num_actions == LENGTH and ep.num_observations == LENGTH + 1
    for key, n in ROBOT_STATE.items():
        assert ep.robot_state[key].shape == (LENGTH + 1, n) and ep.robot_state[key].dtype == np.float32
    assert ep.parts_poses is not None and ep.parts_poses.shape == (LENGTH + 1, 7)
    assert set(ep.extras) == {"cam2_to_base", "cam3_to_base", "cam1_intr", "cam2_intr", "cam3_intr"}
    np.testing.assert_array_equal(ep.images["color_image2"][5], raw["observations"][5]["color_image2"])


@pytest.mark.fast
def test_observation_failure_episode_loads_with_the_extra_skill_dropped(dataset):
    path = collector_files(dataset)[generate_mod.OBS_FAILURE]
    with open(path, "rb") as fh:
        raw = pickle.load(fh)
    assert len(raw["skills"]) == len(raw["actions"]) + 1 and raw["error"] is True
    ep = read_episode(path)
    assert ep.skills.shape == ep.actions.shape[:1] and ep.error is True and ep.success is False
    assert any("observation-failure" in n for n in ep.notes)


@pytest.mark.fast
def test_discovery_layouts_and_order(tmp_path):
    data = generate_mod.generate_episode(0, 0, 4, "one_leg")
    for name in ("2026-03-01-10:00:00", "2025-12-31-23:59:59"):  # collector data_path, any order on disk
        (tmp_path / "col" / name).mkdir(parents=True)
        write_episode(tmp_path / "col" / name / f"{name}.pkl", data)
    (tmp_path / "col" / "2026-04-01-00:00:00").mkdir()  # mp4 only: reported, not silently dropped
    found = discover(tmp_path / "col", "one_leg")
    assert [p.parent.name for p in found.files] == ["2025-12-31-23:59:59", "2026-03-01-10:00:00"]
    assert found.skipped == [(tmp_path / "col" / "2026-04-01-00:00:00", SKIP_NO_PKL)]
    (tmp_path / "parent" / "one_leg").mkdir(parents=True)
    (tmp_path / "parent" / "lamp").mkdir()
    for name in ("10", "2"):
        write_episode(tmp_path / "parent" / "one_leg" / f"{name}.pkl", data)
    flat = discover(tmp_path / "parent", "one_leg")
    assert [p.name for p in flat.files] == ["2.pkl", "10.pkl"] and "furniture parent" in flat.layout


def _preprocessed(raw: dict, save_last_step: bool = False) -> dict:
    """What preprocess_data.py writes, by its description: channel-first images, 14-d state, no last obs."""
    obs = raw["observations"] if save_last_step else raw["observations"][:-1]
    keys = ("ee_pos", "ee_quat", "ee_pos_vel", "ee_ori_vel", "gripper_width")
    return {
        "furniture": raw["furniture"],
        "observations": [
            {
                "color_image1": np.moveaxis(o["color_image1"], -1, 0),
                "color_image2": np.moveaxis(o["color_image2"], -1, 0),
                "robot_state": np.concatenate([np.atleast_1d(o["robot_state"][k]) for k in keys]),
            }
            for o in obs
        ],
        "actions": raw["actions"],
        "rewards": raw["rewards"],
        "skills": raw["skills"],
    }


@pytest.mark.fast
def test_preprocess_data_output_is_read(tmp_path):
    raw = generate_mod.generate_episode(0, 1, 6, "one_leg")
    path = tmp_path / "2026-01-01-00:00:00.pkl"
    write_episode(path, _preprocessed(raw))
    ep = read_episode(path)
    assert ep.format == PREPROCESSED and ep.num_observations == 6 and ep.success is None
    np.testing.assert_array_equal(ep.images["color_image1"][2], raw["observations"][2]["color_image1"])
    assert ep.robot_state["concat14"].shape == (6, 14) and any("preprocess_data.py" in n for n in ep.notes)


@pytest.mark.fast
def test_preprocess_data_output_with_bad_shape_is_named(tmp_path):
    bad = _preprocessed(generate_mod.generate_episode(0, 1, 6, "one_leg"))
    bad["observations"][1]["robot_state"] = np.zeros(13)
    write_episode(tmp_path / "x.pkl", bad)
    with pytest.raises(
        DatasetError, match=r"x\.pkl: observations\[1\]\.robot_state: .*preprocess_data\.py output"
    ):
        read_episode(tmp_path / "x.pkl")


@pytest.mark.fast
def test_missing_camera3_is_named(dataset):
    with pytest.raises(DatasetError, match=r"observations\[0\]\.color_image3: missing.*only; color_image3"):
        read_episode(collector_files(dataset)[0], cameras=("color_image3",))


def _write_broken(tmp_path, mutate, name="7.pkl"):
    data = generate_mod.generate_episode(0, 0, 4, "one_leg")
    mutate(data)
    path = tmp_path / name
    write_episode(path, data)
    return path


@pytest.mark.fast
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
            lambda d: d.update(actions=[], rewards=[], skills=[], observations=d["observations"][:1]),
            "actions",
            "empty episode",
        ),
        (lambda d: d["rewards"].pop(), "rewards", "expected 4 entries"),
        (lambda d: d["skills"].extend([0, 0]), "skills", "expected 4 entries"),
        (lambda d: d.update(observations=d["observations"][:3]), "observations", "expected 5"),
    ],
    ids=["state", "actions", "furniture", "image", "action-shape", "empty", "rewards", "skills", "obs"],
)
def test_bad_data_names_file_and_key(tmp_path, mutate, key, problem):
    path = _write_broken(tmp_path, mutate)
    with pytest.raises(DatasetError) as info:
        read_episode(path)
    message = str(info.value)
    assert str(path) in message and f": {key}: " in message and problem in message


@pytest.mark.fast
def test_not_a_pickle(tmp_path):
    path = tmp_path / "0.pkl"
    path.write_bytes(b"not a pickle")
    with pytest.raises(DatasetError, match=r"0\.pkl: <file>: not a readable episode pickle"):
        read_episode(path)


@pytest.mark.fast
def test_failed_episodes_skipped_by_default_and_kept_when_asked(dataset):
    stream = build_stream(small_cfg(dataset), 0, 1)
    s = stream.data_summary
    assert s is not None and s.found == EPISODES
    assert s.skipped.get(SKIP_ERROR) == 1 and s.skipped.get(SKIP_FAILED, 0) >= 1
    assert s.used == EPISODES - sum(s.skipped.values()) == len(stream.latents)
    assert s.stand_ins and s.encoder == "patch_mean" and s.text_encoder == "stand-in"
    assert json.loads(json.dumps(s.to_json()))["used"] == s.used
    kept = build_stream(small_cfg(dataset, **{"data.include_failed": "true"}), 0, 1).data_summary
    assert kept is not None and kept.used == EPISODES and any("observation-failure" in n for n in kept.notes)


@pytest.mark.fast
def test_cache_is_used_and_stale_cache_refused(tmp_path, monkeypatch):
    root = tmp_path / "ds"
    cfg = small_cfg(root, **{"data.generated_episodes": 3})
    first = build_stream(cfg, 0, 1)
    directory, manifest = ensure_cache(cfg, 0, 1)
    assert (directory / "manifest.json").is_file() and len(manifest["episodes"]) == 3
    ep = manifest["episodes"][0]
    assert set(ep["source"]) == {"size", "mtime_ns", "sha256"} and manifest["spec"]["cameras"] == [
        "color_image2"
    ]

    def no_encoding(*args, **kwargs):
        raise AssertionError("the cache should have answered")

    monkeypatch.setattr(cache_mod, "encode_episode_entry", no_encoding)
    second = build_stream(cfg, 0, 1)
    for key, value in first.micro_batch(2, 1).items():
        assert torch.equal(value, second.micro_batch(2, 1)[key]), key

    source = collector_files(root)[1]
    os.utime(source, ns=(1, 1))  # touched, same content: still current (checksum decides)
    build_stream(cfg, 0, 1)
    data = pickle.loads(source.read_bytes())
    data["actions"][0] = data["actions"][0] + 1
    write_episode(source, data)
    with pytest.raises(StaleCache, match=f"{source.parent.name}.pkl: (size|content)"):
        build_stream(cfg, 0, 1)
    monkeypatch.undo()
    prepare(cfg)  # the fix the message names; only the changed episode is redone
    build_stream(cfg, 0, 1)
    entry = next((directory / "episodes").rglob("*.npz"))
    kept = entry.read_bytes()
    entry.write_bytes(kept[:500])  # a truncated copy: was a BadZipFile traceback naming nothing
    with pytest.raises(StaleCache, match=f"{entry}: damaged cache file .*rm -rf {directory} "):
        build_stream(cfg, 0, 1)
    entry.write_bytes(kept)
    extra = root / "one_leg" / "2027-01-01-00:00:00"
    extra.mkdir()
    write_episode(extra / f"{extra.name}.pkl", data)
    with pytest.raises(StaleCache, match="1 episode file.* not in the cache") as stale:
        build_stream(cfg, 0, 1)
    assert f"rebuild it from the data as it is now: rm -rf {directory}" in str(
        stale.value
    )  # the fix, runnable
    from trainer.loop.rank import needs_fix

    assert (
        needs_fix(stale.value) == "the latent cache is rebuilt (its line says how)"
    )  # not "the data is fixed"
    # a path that cannot be written fails the same way next time (a review: the last line said "starts
    # fresh"); other OSErrors may be passing (a network file system's hiccup) and are not a needed fix
    ro = OSError(30, "Read-only file system", "/data/.latents")
    assert needs_fix(ro) == "/data/.latents can be written" and needs_fix(OSError(5, "I/O error")) is None
    manifest_path = directory / "manifest.json"
    bad = json.loads(manifest_path.read_text())
    bad["spec"]["cameras"] = ["color_image1"]
    manifest_path.write_text(json.dumps(bad))
    with pytest.raises(StaleCache, match=r"cameras: cache \['color_image1'\] vs config \['color_image2'\]"):
        ensure_cache(cfg, 0, 1)


@pytest.mark.fast
def test_prepare_resumes_after_a_kill(tmp_path, monkeypatch):
    root = tmp_path / "ds"
    cfg = small_cfg(root, **{"data.generated_episodes": 4, "data.include_failed": "true"})
    ensure_dataset(cfg)
    real = cache_mod.encode_episode_entry
    calls: list = []

    def dying(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # a kill in the middle of the preparation
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(cache_mod, "encode_episode_entry", dying)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg)
    monkeypatch.undo()
    done = prepare(cfg)
    assert (done.encoded, done.kept) == (2, 2) and (done.directory / "manifest.json").is_file()


@pytest.mark.fast
def test_out_of_space_keeps_errno_and_names_the_path(tmp_path, monkeypatch):
    cfg = small_cfg(tmp_path / "ds", **{"data.generated_episodes": 1})
    ensure_dataset(cfg)

    def full(path, data, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod, "write_atomic", full)
    with pytest.raises(OutOfSpace) as info:
        prepare(cfg)
    assert info.value.errno == errno.ENOSPC and ".latents" in info.value.report.path
    assert info.value.report.what == "latent cache" and (info.value.report.needed or 0) > 0


@pytest.mark.fast
def test_cameras_are_encoded_separately_and_put_side_by_side(dataset):
    one = build_stream(small_cfg(dataset), 0, 1)
    two = build_stream(small_cfg(dataset, **{"data.cameras": "color_image2,color_image1"}), 0, 1)
    assert two.latents[0].shape[-1] == 2 * one.latents[0].shape[-1]
    enc = PatchMeanEncoder(4, 8, 2)
    ep = read_episode(discover(dataset, "one_leg").files[0], cameras=("color_image2", "color_image1"))
    a, b = enc.encode(ep.images["color_image2"]), enc.encode(ep.images["color_image1"])
    raw = np.concatenate([a, b], axis=-1).astype(np.float16).astype(np.float32)
    z = (raw - raw.mean(axis=(0, 2, 3), keepdims=True)) / raw.std(axis=(0, 2, 3), keepdims=True)
    corr = np.corrcoef(z.ravel(), two.latents[0].numpy().ravel())[0, 1]
    assert corr > 0.9  # same layout (normalised over all episodes, so not bitwise)


@pytest.mark.fast
def test_bad_cameras_refused(dataset):
    with pytest.raises(DatasetError, match="data.cameras"):
        build_stream(small_cfg(dataset, **{"data.cameras": "color_image2,color_image2"}), 0, 1)


@pytest.mark.fast
def test_clip_actions_lead_into_their_latent_frame(dataset):
    cfg = small_cfg(dataset, **{"data.include_failed": "true"})
    stream = build_stream(cfg, 0, 1)
    t = cfg.data.actions_per_frame
    raw = read_episode(discover(dataset, "one_leg").files[0]).actions
    e0 = stream.actions[0]
    assert e0.shape[0] == stream.latents[0].shape[0] * t
    renorm = stream.normalizer.normalize(raw, clip=1.5)
    np.testing.assert_allclose(e0[t : 2 * t, :7].numpy(), renorm[:t, :7], atol=1e-6)  # slots 0..6
    assert stream.action_mask.dtype == torch.bool and int(stream.action_mask.sum()) == cfg.model.action_used


def make_tiny_t5(root):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import T5TokenizerFast, UMT5Config, UMT5EncoderModel  # type: ignore[attr-defined]

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=50, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"
    )
    tok.train_from_iterator(
        ["assemble one leg of the square table", "insert it and screw it in"], trainer=trainer
    )
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", tok.token_to_id("</s>"))]
    )
    fast = T5TokenizerFast(
        tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>", extra_ids=0
    )
    fast.save_pretrained(root / "tokenizer")
    torch.manual_seed(0)
    config = UMT5Config(
        vocab_size=len(fast),
        d_model=16,
        d_kv=4,
        d_ff=32,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
    )
    model = UMT5EncoderModel(config).eval()
    model.save_pretrained(root / "text_encoder")
    return fast, model


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    root = tmp_path_factory.mktemp("lingbot-va-base")
    vae = make_tiny_vae(root / "vae")
    tokenizer, t5 = make_tiny_t5(root)
    return root, vae, tokenizer, t5


@pytest.mark.fast
def test_wan_vae_encoder_loads_the_folder_and_matches_diffusers(released, dataset):
    root, vae, _, _ = released
    enc = WanVAEEncoder(str(root), latent_side=2, device=torch.device("cpu"))  # the model root: vae/ found
    assert (enc.channels, enc.temporal, enc.resolution) == (4, 4, 32)
    frames = read_episode(discover(dataset, "one_leg").files[0]).images["color_image2"][:9]
    out = enc.encode(frames)
    assert out.shape == (3, 4, 2, 2)  # 9 frames -> 1 + 8/4 latent frames
    x = torch.nn.functional.interpolate(
        torch.from_numpy(frames).float().permute(0, 3, 1, 2),
        size=(32, 32),
        mode="bilinear",
        align_corners=False,
    )
    with torch.no_grad():
        mu = vae.encode(x.permute(1, 0, 2, 3)[None] / 255.0 * 2 - 1).latent_dist.mean
    mean, std = torch.tensor([0.1, -0.2, 0.3, 0.0]), torch.tensor([2.0, 1.5, 1.0, 0.5])
    want = ((mu - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1))[0].permute(1, 0, 2, 3)
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.fast
def test_t5_text_encoder_matches_transformers(released):
    root, _, tokenizer, t5 = released
    enc = T5Text(str(root), "", length=32, device=torch.device("cpu"))
    emb, mask = enc.embed("assemble one  leg")
    ids = tokenizer(["assemble one leg"], padding="max_length", max_length=32, return_tensors="pt")
    n = int(ids.attention_mask.sum())
    with torch.no_grad():
        hidden = t5(ids.input_ids, ids.attention_mask).last_hidden_state[0]
    assert emb.shape == (32, 16) and 1 < n < 32 and mask.sum() == n and not emb[n:].any()
    np.testing.assert_allclose(emb[:n], hidden[:n].numpy(), rtol=1e-5, atol=1e-6)
    empty, empty_mask = enc.embed("")
    assert empty_mask.sum() == 1 and not np.allclose(empty[0], emb[0])


@pytest.mark.fast
def test_stand_in_text_is_deterministic():
    a, ma = StandInText(8, 10).embed("put the leg in")
    b, _ = StandInText(8, 10).embed("put the  leg in")
    c, _ = StandInText(8, 10).embed("")
    np.testing.assert_array_equal(a, b)
    assert ma.sum() == 5 and not a[5:].any() and not np.array_equal(a[0], c[0])


@pytest.mark.fast
def test_wan_vae_prepare_writes_real_latents(released, tmp_path):
    root, *_ = released
    cfg = small_cfg(
        tmp_path / "ds",
        **{
            "data.generated_episodes": 2,
            "data.val_episodes": 0,  # 2 episodes: none to spare for a held-out split
            "data.encoder": "wan_vae",
            "data.vae_path": str(root / "vae"),
            "data.text_encoder": str(root),
            "data.actions_per_frame": 4,
            "data.frames": 3,
            "model.latent_channels": 4,
            "model.latent_size": 2,
        },
    )
    cfg.model.text_dim = 16  # the model branch's field (the stand-in reads 4096 without it)
    ensure_dataset(cfg)
    done = prepare(cfg)
    manifest = json.loads((done.directory / "manifest.json").read_text())
    assert manifest["spec"]["encoder"] == "wan_vae" and manifest["spec"]["text_encoder"] == "t5"
    assert manifest["spec"]["resolution"] == 32 and manifest["stand_ins"] == []
    with np.load(done.directory / "text.npz") as z:
        assert z["prompt_emb"].shape == (16, 16) and z["empty_mask"].sum() == 1
    stream = build_stream(cfg, 0, 1)
    assert stream.data_summary is not None and stream.data_summary.stand_ins == []
    batch = stream.micro_batch(0, 0)
    assert batch["latents"].shape == (1, 3, 4, 2, 2) and batch["actions"].shape == (
        1,
        12,
        cfg.model.action_dim,
    )
    assert batch["text_emb"].shape == (1, 16, 16)
    assert done.frames_per_s > 0


@pytest.mark.fast
def test_killed_generation_is_never_a_dataset(tmp_path, monkeypatch):
    root = tmp_path / "furniture_train"
    calls: list = []

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


@pytest.mark.fast
def test_missing_dataset_without_generation(tmp_path):
    with pytest.raises(
        DatasetError, match="generate_if_missing is off.*python -m trainer.data.formats.generate"
    ):
        ensure_dataset(small_cfg(tmp_path / "absent", **{"data.generate_if_missing": False}))


@pytest.mark.heavy
def test_generate_cli(tmp_path):
    out = tmp_path / "cli"
    args = [
        sys.executable,
        "-m",
        "trainer.data.formats.generate",
        str(out),
        "--episodes",
        "2",
        "--length",
        "5",
    ]
    first = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert len(collector_files(out)) == 2
    again = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "exists and is not empty" in again.stderr


@pytest.mark.fast
def test_quantile_normalizer():
    rng = np.random.default_rng(0)
    acts = np.stack([rng.uniform(-2, 6, 1000), np.full(1000, 0.5)], axis=1)
    norm = QuantileNormalizer.fit(acts)
    out = norm.normalize(acts)
    assert out.min() >= -1 and out.max() <= 1
    assert norm.normalize(acts, clip=1.5).min() < -1
    np.testing.assert_allclose(norm.normalize(norm.q01[None]), [[-1.0, 0.0]], atol=1e-6)
    assert (out[:, 1] == 0).all()  # constant channel


@pytest.mark.fast
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
    assert x["text_emb"].shape[:2] == (2, 16) and x["text_mask"].dtype == torch.bool
    assert x["actions"].abs().max() <= 1.5


@pytest.mark.fast
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


@pytest.mark.heavy
def test_prepare_under_torchrun(tmp_path):
    root = tmp_path / "ds"
    generate_mod.generate_dataset(root / "x", 3, 12, "one_leg", seed=1)
    sets = [
        f"data.path={root / 'x'}",
        "data.cameras=color_image2",
        "data.actions_per_frame=2",
        "data.frames=2",
        "data.encoder=patch_mean",  # the stand-ins: the full scale's default is the released folder's VAE
        "data.text_encoder=",
    ]
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a free port, not the default 29500 another test's torchrun may hold
        "--log-dir",  # torchrun's own folder, else a torchelastic_* folder left in /tmp
        str(tmp_path / "torchrun-logs"),
        "--nproc-per-node",
        "2",
        "-m",
        "trainer.data.cache.prepare",
    ]
    for s in sets + ["model.latent_size=8", "model.latent_channels=4", "data.text_length=8"]:
        args += ["--set", s]
    run = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[rank 1] prepare[rank 1]" in run.stdout and "cache complete" in run.stdout
