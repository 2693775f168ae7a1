"""The preflight's disk-space rule (trainer/launcher/preflight.space_check) without a mount: free space
comes from a patched provision.nodeinfo.free_bytes, the checkpoint size from the real estimate."""

from __future__ import annotations

import pytest

from trainer.checkpoint.size import estimate_bytes, model_size
from trainer.config import load_config
from trainer.launcher.errors import PreflightError
from trainer.launcher.preflight import space_check

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        ({}, True),  # best_by val_action_loss with a held-out split: keep + 1 + the pinned best
        ({"checkpoint.best_by": "none"}, False),
        ({"checkpoint.validate": False}, False),
        ({"data.val_episodes": 0}, False),
    ],
)
def test_room_for_the_pinned_best_checkpoint_is_counted(tmp_path, monkeypatch, overrides, refused):
    cfg = load_config("furniture_train", cpu_scale=True, overrides={"checkpoint.keep": 2, **overrides})
    one = estimate_bytes(cfg, model_size(cfg), 2)
    monkeypatch.setattr("provision.nodeinfo.free_bytes", lambda path: int(one * 3.5))  # keep 2 + 1 fit
    if refused:
        with pytest.raises(
            PreflightError, match=r"checkpoint.keep \+ 1 = 3 checkpoints and the best held-out one \(4\)"
        ):
            space_check(tmp_path, cfg, 2)
    else:
        (note,) = space_check(tmp_path, cfg, 2)
        assert "checkpoint.keep + 1 = 3 checkpoints need" in note
