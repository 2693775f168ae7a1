"""TEMPORARY import shim for the model engineer's batch contract (trainer/batch.py, trainer/recipe.py).

Those modules live on the model branch; until the branches are merged this branch does not have them.
With them present (after the merge) the stream uses them: ACTION_SLOTS and `draw_micro_batch`. Without
them it falls back to the seed's slots (the first action_used channels) and to today's draws in
trainer/data/stream.py. Delete this file at integration and import trainer.batch / trainer.recipe directly.
"""

from __future__ import annotations

from typing import Any

try:  # the merged tree
    from trainer.batch import ACTION_SLOTS as _SLOTS
    from trainer.recipe import EmptyText as _EmptyText
    from trainer.recipe import draw_micro_batch as _draw

    HAVE_RECIPE = True
except ImportError:  # this branch alone
    _SLOTS, _EmptyText, _draw = None, None, None
    HAVE_RECIPE = False


def action_slots(used: int) -> tuple[int, ...]:
    return tuple(_SLOTS[:used]) if _SLOTS is not None else tuple(range(used))


def draw(cfg, clean: dict, empty_emb, empty_mask, generator) -> dict[str, Any]:
    assert _draw is not None and _EmptyText is not None
    return dict(_draw(cfg.recipe, clean, _EmptyText(emb=empty_emb, mask=empty_mask), generator))
