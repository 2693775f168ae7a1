"""trainer.recipe.draws: the reference's schedule, its random draws per micro-batch, and their determinism."""

import pytest
import torch

from tests.support.lingbot_tiny import clean_batch, empty_text, tiny_cfg
from trainer.recipe.batch import DRAW_KEYS, check_micro_batch
from trainer.recipe.draws import check_recipe, draw_micro_batch, loss_weights, sigma_table, weight_table

pytestmark = pytest.mark.fast


@pytest.fixture
def cfg():
    return tiny_cfg()


def draw(cfg, seed=0, b=3):
    return draw_micro_batch(
        cfg.recipe, clean_batch(cfg, b, 1), empty_text(cfg), torch.Generator().manual_seed(seed)
    )


def test_defaults_are_the_reference_recipe(cfg):
    r, t = cfg.recipe, cfg.train
    assert (r.video_shift, r.action_shift, r.num_train_timesteps) == (5.0, 1.0, 1000)
    assert (r.noisy_history_prob, r.noisy_history_min, r.noisy_history_max) == (0.5, 0.5, 1.0)
    assert (r.chunk_min, r.chunk_max, r.window_min, r.window_max) == (1, 4, 4, 64)
    assert (r.text_dropout, r.action_clip, r.loss_weighting, r.sigma_per) == (0.1, 1.5, "reference", "frame")
    assert (t.betas, t.weight_decay, t.grad_clip, t.adam_eps) == ([0.9, 0.95], 0.1, 2.0, 1e-8)


def test_sigma_grid_is_the_shifted_1000_step_grid():
    table = sigma_table(5.0)
    assert table.shape == (1000,) and table[0] == 1.0
    s = 1 - 500 / 1000
    torch.testing.assert_close(table[500], torch.tensor(5 * s / (1 + 4 * s)))
    assert (table[1:] < table[:-1]).all()
    assert torch.equal(sigma_table(1.0), torch.linspace(1, 0, 1001)[:-1])


def test_loss_weights_are_the_normalised_bump_at_the_nearest_grid_point():
    w = weight_table(5.0)
    torch.testing.assert_close(w.mean(), torch.tensor(1.0))
    sig = sigma_table(5.0)[[10, 500, 990]][None]
    torch.testing.assert_close(loss_weights(sig, 5.0, 1000, "reference"), w[[10, 500, 990]][None])
    assert torch.equal(loss_weights(sig, 5.0, 1000, "none"), torch.ones_like(sig))
    t = sigma_table(5.0) * 1000  # timesteps near 500 weigh most (the Gaussian bump's peak)
    assert w[int((t - 500).abs().argmin())] == w.max()


def test_a_micro_batch_is_complete_and_a_pure_function_of_the_generator(cfg):
    a, b, c = draw(cfg, 0), draw(cfg, 0), draw(cfg, 1)
    check_micro_batch(a, cfg.data.actions_per_frame, cfg.model.action_dim, cfg.model.text_dim)
    assert all(torch.equal(a[k], b[k]) for k in DRAW_KEYS)
    assert not torch.equal(a["latent_noise"], c["latent_noise"])


def test_one_sigma_per_frame_index_shared_by_the_batch(cfg):
    batch = draw(cfg)
    for key in ("latent_sigma", "action_sigma"):
        assert (batch[key] == batch[key][:1]).all()
        assert batch[key][0].unique().numel() > 1
    assert torch.isin(batch["latent_sigma"], sigma_table(5.0)).all()
    assert torch.isin(batch["action_sigma"], sigma_table(1.0)).all()
    cfg.recipe.sigma_per = "sample_frame"
    batch = draw(cfg)
    assert not (batch["latent_sigma"] == batch["latent_sigma"][:1]).all()


def test_noisy_history_probability_and_range(cfg):
    outcomes = [draw(cfg, seed)["history_sigma"] for seed in range(200)]
    noisy = [h for h in outcomes if h.any()]
    assert 70 < len(noisy) < 130  # p = 0.5 per batch
    assert all((h == 0).all() for h in outcomes if not h.any())
    grid = sigma_table(5.0)
    lo, hi = grid[999], grid[500]  # ids 500..999 (u in [0.5, 1)): the less noisy half of the grid
    assert all(((h >= lo) & (h <= hi)).all() and (h == h[:1]).all() for h in noisy)


def test_chunk_and_window_are_redrawn_in_their_ranges(cfg):
    chunks = {int(draw(cfg, s)["frames_per_chunk"]) for s in range(100)}
    windows = {int(draw(cfg, s)["window"]) for s in range(100)}
    assert chunks == {1, 2, 3, 4}
    assert min(windows) >= 4 and max(windows) <= 64 and len(windows) > 20


def test_text_dropout_swaps_in_the_empty_prompt(cfg):
    cfg.recipe.text_dropout = 0.5
    batch = draw(cfg, seed=3, b=8)
    dropped = batch["text_dropped"]
    assert dropped.any() and (~dropped).any()
    assert (batch["text_emb"][dropped] == 0).all() and not batch["text_mask"][dropped].any()
    clean = clean_batch(cfg, 8, 1)
    assert torch.equal(batch["text_emb"][~dropped], clean["text_emb"][~dropped])


def test_bad_recipe_values_are_named():
    cfg = tiny_cfg()
    cfg.recipe.chunk_min = 0
    with pytest.raises(ValueError, match="recipe.chunk_min"):
        check_recipe(cfg.recipe)
    cfg = tiny_cfg()
    cfg.recipe.loss_weighting = "snr"
    with pytest.raises(ValueError, match="recipe.loss_weighting='snr'"):
        check_recipe(cfg.recipe)
