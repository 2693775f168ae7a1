"""Actions faster than video (data.actions_per_video_frame), the T-shape layout, relative poses, and the
default cache spec unchanged by them (trainer/data/cache/store.py, stream.py, poses.py, model/masks.py)."""

import numpy as np
import pytest

from tests.test_data import small_cfg
from trainer.config import load_config
from trainer.config.load import parse_set
from trainer.data.cache.store import make_spec
from trainer.data.encoding import views
from trainer.data.encoding.encoder import make_encoder
from trainer.data.encoding.text import make_text_encoder
from trainer.data.formats import generate as generate_mod
from trainer.data.formats.furniturebench import DatasetError, read_episode
from trainer.data.poses import relative_to_first
from trainer.data.stream import build_stream
from trainer.model.masks import sequence_shape

# Measured at HEAD c949d2f before this change: make_spec(cfg, make_encoder(cfg), make_text_encoder(cfg))
# .digest() for load_config('furniture_train', cpu_scale=True) with no overrides.
DEFAULT_DIGEST = "d86b9d09be43"


@pytest.mark.fast
def test_default_spec_digest_unchanged():
    cfg = load_config("furniture_train", cpu_scale=True, overrides=parse_set([]))
    spec = make_spec(cfg, make_encoder(cfg), make_text_encoder(cfg))
    assert spec.digest() == DEFAULT_DIGEST
    assert "actions_per_video_frame" not in spec.to_json() and "layout" not in spec.to_json()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("rates") / "furniture_train"
    generate_mod.generate_dataset(root, 8, 24, "one_leg", seed=0)
    return root


@pytest.mark.fast
def test_video_every_second_row_and_actions_lead_into_frames(dataset):
    cfg = small_cfg(
        dataset, **{"data.actions_per_video_frame": 2, "data.actions_per_frame": 4, "data.frames": 3}
    )
    default = make_spec(small_cfg(dataset), make_encoder(small_cfg(dataset)), make_text_encoder(cfg))
    spec = make_spec(cfg, make_encoder(cfg), make_text_encoder(cfg))
    assert spec.to_json()["actions_per_video_frame"] == 2 and spec.digest() != default.digest()
    stream = build_stream(cfg, 0, 1)
    name = stream.names[0]
    ep = read_episode(dataset / "one_leg" / name, ["color_image2"])
    want = make_encoder(cfg).encode(ep.images["color_image2"][::2])  # t = 2 video frames per latent frame
    lat = stream.latents[0].numpy() * stream.latent_stats[1] + stream.latent_stats[0]
    assert lat.shape == want.shape
    np.testing.assert_allclose(lat, want.astype(np.float16).astype(np.float32), atol=1e-3)
    n, used = 4, cfg.model.action_used
    norm = stream.normalizer.normalize(ep.actions, clip=1.5)[:, :used]
    slots = [i for i in range(cfg.model.action_dim) if stream.action_mask[i]]
    acts = stream.actions[0].numpy()[:, slots]
    assert np.all(acts[:n] == stream.normalizer.normalize(np.zeros((n, ep.actions.shape[1]), np.float32),
                                                          clip=1.5)[:, :used])  # fmt: skip
    for k in range(1, lat.shape[0]):
        np.testing.assert_allclose(acts[k * n : (k + 1) * n], norm[(k - 1) * n : k * n], atol=1e-6)


def _tshape_cfg(path):
    return small_cfg(path, **{"data.cameras": "color_image2,color_image1,color_image3",
                              "data.layout": "tshape", "model.latent_size": 8, "model.latent_width": 12,
                              "model.patch": 2})  # fmt: skip


@pytest.mark.fast
def test_tshape_composes_wrists_above_the_high_camera(dataset):
    """Per-camera encoders at their views.view_sizes (cache.camera_encoders), composed as the stream does.
    (FurnitureBench .pkl files hold two cameras only, so the frames here are random.)"""
    from trainer.data.cache.store import camera_encoders

    cfg = _tshape_cfg(dataset)
    enc = make_encoder(cfg)
    spec = make_spec(cfg, enc, make_text_encoder(cfg))
    assert spec.to_json()["layout"] == "tshape" and spec.to_json()["latent_width"] == 12
    assert spec.view_sizes() == views.view_sizes(cfg) == [(8, 12), (4, 6), (4, 6)]
    encoders = camera_encoders(spec.cameras, spec.view_sizes(), enc)
    frames = np.random.default_rng(0).integers(0, 255, (5, 32, 32, 3), dtype=np.uint8)
    per = [encoders[c].encode(frames + i) for i, c in enumerate(cfg.data.cameras)]
    assert [p.shape[-2:] for p in per] == [(8, 12), (4, 6), (4, 6)]
    lat = views.compose(per, views.layout_of(cfg))
    assert lat.shape[-2:] == (12, 12) == views.grid(cfg)
    np.testing.assert_array_equal(lat[..., :4, :6], per[1])  # the first wrist, top left
    np.testing.assert_array_equal(lat[..., :4, 6:], per[2])
    np.testing.assert_array_equal(lat[..., 4:, :], per[0])  # the high camera, below


@pytest.mark.fast
def test_tshape_tokens_per_frame(dataset):
    from trainer.plan.memory import synthetic_micro_batch

    cfg = _tshape_cfg(dataset)
    assert views.grid(cfg) == (12, 12)
    assert sequence_shape(cfg).tokens_per_frame == (12 // 2) * (12 // 2)
    assert tuple(synthetic_micro_batch(cfg)["latents"].shape[-2:]) == (12, 12)
    side = small_cfg(dataset, **{"data.cameras": "color_image2,color_image1"})
    assert views.grid(side) == (8, 16)


def _quat(axis, angle):
    axis = np.asarray(axis, float) / np.linalg.norm(axis)
    return np.concatenate([axis * np.sin(angle / 2), [np.cos(angle / 2)]])


def _matrix(q):
    x, y, z, w = q / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])  # fmt: skip


@pytest.mark.fast
def test_relative_poses_against_rotation_matrices():
    rng = np.random.default_rng(0)
    rows = []
    for i in range(5):
        q = _quat(rng.normal(size=3), 0.3 + 0.4 * i)
        rows.append(np.concatenate([[7.0], rng.normal(size=3), q, [0.5]]))
    acts = np.array(rows, np.float64)
    out = relative_to_first(acts, [1])
    np.testing.assert_allclose(out[0, 1:8], [0, 0, 0, 0, 0, 0, 1], atol=1e-12)
    r0 = _matrix(acts[0, 4:8])
    for i in range(5):
        np.testing.assert_allclose(out[i, 1:4], acts[i, 1:4] - acts[0, 1:4], atol=1e-12)
        np.testing.assert_allclose(_matrix(out[i, 4:8]), r0.T @ _matrix(acts[i, 4:8]), atol=1e-10)
    assert np.all(out[:, [0, 8]] == acts[:, [0, 8]])
    with pytest.raises(DatasetError, match="data.relative_poses"):
        relative_to_first(acts, [4])


@pytest.mark.fast
def test_relative_poses_refused_with_dataset_statistics(dataset):
    from trainer.data.poses import check_normalize

    cfg = small_cfg(dataset, **{"data.relative_poses": "[0]", "data.normalize": "quantile"})
    with pytest.raises(DatasetError, match="data.normalize=fit"):
        check_normalize(cfg)
