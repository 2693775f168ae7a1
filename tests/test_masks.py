"""The LingBot-VA mask on small layouts checked by hand (token order: see trainer/model/masks.py)."""

import pytest
import torch

from trainer.model.masks import (
    CLEAN,
    NOISY,
    PAD,
    SequenceShape,
    dense_mask,
    lingbot_mask_mod,
    mask_density,
    token_layout,
)

pytestmark = pytest.mark.fast

# one sample, 2 frames, 1 video token and 1 action token per frame, 1 frame per chunk:
#   0 noisy v0 (block 0)  1 noisy v1 (2)  2 clean v0 (0)  3 clean v1 (2)
#   4 noisy a0 (block 1)  5 noisy a1 (3)  6 clean a0 (1)  7 clean a1 (3)
TINY = SequenceShape(frames=2, tokens_per_frame=1, actions_per_frame=1)
ALLOWED_WIDE = {  # query -> keys, worked out from the three rules with no window limit
    0: {0},
    1: {1, 2, 6},
    2: {2},
    3: {2, 3, 6},
    4: {2, 4},
    5: {2, 3, 5, 6},
    6: {2, 6},
    7: {2, 3, 6, 7},
}
ALLOWED_WINDOW_1 = {0: {0}, 1: {1, 6}, 2: {2}, 3: {3, 6}, 4: {2, 4}, 5: {3, 5}, 6: {2, 6}, 7: {3, 7}}


def _mask(shape=TINY, batch=1, chunk=1, window=100, pad_to=1):
    layout = token_layout(shape, batch, chunk, pad_to)
    return layout, dense_mask(lingbot_mask_mod(layout, window), layout.length)


def _as_sets(mask):
    return {q: set(torch.nonzero(mask[q]).flatten().tolist()) for q in range(mask.shape[0])}


def test_layout_ids():
    layout, _ = _mask()
    assert layout.block_ids.tolist() == [0, 2, 0, 2, 1, 3, 1, 3]
    assert layout.noise_ids.tolist() == [NOISY, NOISY, CLEAN, CLEAN, NOISY, NOISY, CLEAN, CLEAN]
    assert layout.seq_ids.tolist() == [0] * 8
    assert layout.sections == (2, 2, 2, 2, 0)


def test_hand_checked_mask_without_window():
    _, mask = _mask()
    assert _as_sets(mask) == ALLOWED_WIDE


def test_each_rule():
    layout, mask = _mask()
    noisy, clean, block = layout.noise_ids == NOISY, layout.noise_ids == CLEAN, layout.block_ids
    # clean -> clean: exactly the keys with block_kv <= block_q
    cc = mask[clean][:, clean]
    assert torch.equal(cc, block[clean][None, :] <= block[clean][:, None])
    # noisy -> clean: strictly earlier blocks only (own chunk's clean frame is hidden)
    nc = mask[noisy][:, clean]
    assert torch.equal(nc, block[clean][None, :] < block[noisy][:, None])
    # noisy -> noisy: same block only
    nn_ = mask[noisy][:, noisy]
    assert torch.equal(nn_, block[noisy][None, :] == block[noisy][:, None])
    # clean never sees noisy
    assert not mask[clean][:, noisy].any()


def test_window_limits_block_distance():
    _, mask = _mask(window=1)
    assert _as_sets(mask) == ALLOWED_WINDOW_1
    _, none = _mask(window=0)
    assert _as_sets(none) == {0: {0}, 1: {1}, 2: {2}, 3: {3}, 4: {4}, 5: {5}, 6: {6}, 7: {7}}


def test_chunk_of_two_frames_puts_both_in_one_block():
    layout, mask = _mask(chunk=2)
    assert layout.block_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    sets = _as_sets(mask)
    assert sets[0] == {0, 1}  # noisy video of the chunk sees its noisy peers only
    assert sets[4] == {
        2,
        3,
        4,
        5,
    }  # noisy actions see the chunk's clean video (block 0 < 1) and noisy actions
    assert sets[2] == {2, 3}


def test_tensor_chunk_and_window_match_ints():
    layout_i, mask_i = _mask(chunk=1, window=1)
    layout_t = token_layout(TINY, 1, torch.tensor(1), 1)
    mask_t = dense_mask(lingbot_mask_mod(layout_t, torch.tensor(1)), layout_t.length)
    assert torch.equal(mask_i, mask_t)


def test_packing_keeps_samples_apart():
    layout, mask = _mask(batch=2)
    seq = layout.seq_ids
    assert not mask[seq == 0][:, seq == 1].any() and not mask[seq == 1][:, seq == 0].any()
    for s in (0, 1):  # each sample on its own is the single-sample mask
        idx = torch.nonzero(seq == s).flatten()
        assert _as_sets(mask[idx][:, idx]) == ALLOWED_WIDE


def test_padding_sees_nothing_and_is_not_seen():
    layout, mask = _mask(pad_to=12)
    assert layout.length == 12 and layout.sections[-1] == 4
    assert layout.seq_ids[8:].tolist() == [PAD] * 4
    assert not mask[8:].any() and not mask[:, 8:].any()
    assert _as_sets(mask[:8, :8]) == ALLOWED_WIDE


def test_mask_density_counts_allowed_pairs():
    expected = sum(len(v) for v in ALLOWED_WIDE.values()) / 8
    assert mask_density(TINY, 1, 1, 100) == expected


def test_the_run_shape_counts_every_camera_view_as_the_batch_lays_them_out():
    """sequence_shape (the stream's tokens/s and MFU lines) once counted one view of two: 2,176 tokens
    where the model attends 4,224 at the cluster config. It must agree with the batch's own layout."""
    from trainer.config import load_config
    from trainer.model.masks import sequence_shape
    from trainer.plan.estimate import tokens_per_micro_batch
    from trainer.plan.memory import synthetic_micro_batch

    for cpu_scale in (True, False):
        cfg = load_config("furniture_train", cpu_scale=cpu_scale)
        assert len(cfg.data.cameras) == 2
        batch = synthetic_micro_batch(cfg)
        b, f, _, h, w = batch["latents"].shape  # views side by side along the width
        p, n = cfg.model.patch, cfg.data.actions_per_frame
        laid_out = 2 * b * f * ((h // p) * (w // p) + n)  # noisy + clean groups, video + action
        assert sequence_shape(cfg).tokens(b) == laid_out == tokens_per_micro_batch(cfg)
    assert laid_out == 4224  # the cluster config: 2 x (16 x 128 + 64)
